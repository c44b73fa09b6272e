"""Numbers for the Learn views, each computed from the running model's own weights; one module per
lesson (each names the view it feeds), each returning typed results:

* ``values``    §1 what each source token adds to a head (weight x ‖v W_O‖), and where that differs from
  the weights;
* ``timing``    §2 one parallel forward vs serial steps with and without the KV cache, timed now;
* ``embedding`` §3-4 a token's row of E, its nearest rows, its numeric neighbours, untrained rows;
* ``anatomy``   §5 parameter counts by part;
* ``positions`` §6 the learned position table or the rotary frequencies;
* ``compare``   §6 the same tokens in another order: hidden states and attention of two runs.

Per-family facts (value layouts, W_O per head, rotary settings) come from ``model.families.weights``;
validation, the memory budget and the model's lock from ``model.services.learn``.
"""
