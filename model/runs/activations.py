"""A run's activations by name, as TransformerLens' ``ActivationCache`` gives them: ``run["resid_post", 3]``,
``run["blocks.3.hook_resid_post"]``, ``run["pattern", 4]``.

The residual stream, each sublayer's output and the post-rotary Q and K are what the run keeps (a copy is
handed out, so the record stays as it was); a pattern is computed on demand from the kept Q, K and row
normalisers, exactly, and refused above ``MAX_PATTERN_BYTES`` (a long run's head is read with
``run.attention(layer, head)`` or as tiles instead). Names and shapes: ``model.capture.names``.
"""

from __future__ import annotations

import torch

from attnscope.model.capture.names import ON_REQUEST, ActKind, act_name, block_names, parse
from attnscope.model.errors import BadInput, TooLarge
from attnscope.model.runs.budget import mib
from attnscope.model.runs.record import RunRecord

MAX_PATTERN_BYTES = 1 << 30  # one layer's (heads, n, n) float32 pattern built whole: 1 GiB at most
Key = str | tuple[str, int]


def names(record: RunRecord) -> list[str]:
    """Every name a run answers to, block by block (the patterns computed on demand, Q and K as kept)."""
    return block_names(record.n_layers) + [act_name(kind, i) for i in range(record.n_layers) for kind in ON_REQUEST]


def _key(record: RunRecord, key: Key) -> tuple[ActKind, int]:
    if isinstance(key, str):
        try:
            kind, layer = parse(key)
        except KeyError:
            raise KeyError(f"{key!r}: not an activation name (e.g. 'blocks.0.hook_resid_post')") from None
    elif isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int):
        try:
            kind, _ = parse(act_name(key[0], 0))  # type: ignore[arg-type]
        except KeyError:
            raise KeyError(f"{key[0]!r}: not an activation kind (resid_pre, attn_out, mlp_out, resid_post, "
                           "pattern, rot_q, rot_k)") from None
        layer = key[1] + record.n_layers if key[1] < 0 else key[1]  # -1: the last block
    else:
        raise KeyError(f"{key!r}: give a name ('blocks.3.hook_resid_post') or (kind, layer) ('resid_post', 3)")
    if not 0 <= layer < record.n_layers:
        raise BadInput(f"layer {layer} is out of range: this run has layers 0..{record.n_layers - 1}",
                       code="layer_out_of_range", params={"layer": layer, "max": record.n_layers - 1})
    return kind, layer


def activation(record: RunRecord, key: Key) -> torch.Tensor:
    """One activation of a run (float32, on the device it was captured on): (n, d_model) for the residual
    stream and sublayer outputs, (heads, n, d_head) / (kv_heads, n, d_head) for rot_q / rot_k,
    (heads, n, n) for a pattern (zeros where masked)."""
    kind, layer = _key(record, key)
    kept = record.attention[layer]
    if kind == "pattern":
        need = 4 * kept.n_heads * kept.n * kept.n
        if need > MAX_PATTERN_BYTES:
            raise TooLarge(f"layer {layer}'s whole pattern would take {mib(need)} ({kept.n_heads} heads x "
                           f"{kept.n} x {kept.n}); at most {mib(MAX_PATTERN_BYTES)} is built at once: read one "
                           "head with run.attention(layer, head), or a tile with q0/q1/k0/k1/size")
        return kept.dense()  # (H, n, n)
    tensor = {"resid_pre": lambda: record.resid[layer], "resid_post": lambda: record.resid[layer + 1],
              "attn_out": lambda: record.attn_out[layer], "mlp_out": lambda: record.mlp_out[layer],
              "rot_q": lambda: kept.q, "rot_k": lambda: kept.k}[kind]()
    return tensor.clone()
