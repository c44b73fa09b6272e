"""attnscope's engine, in the order data flows: ``attention`` (the function transformers calls, and what a
run keeps of a layer), ``families``, ``load``, ``capture`` (one forward's activations), ``scores``, ``runs``
(records, the run store, run files), ``tools`` and ``learn``, and ``services`` (what both front doors call).
Each imports only what comes before it; nothing here knows about HTTP (``app/`` wraps it in a JSON API).
"""
