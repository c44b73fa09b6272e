"""One capture point for every attention: a function registered with transformers'
``AttentionInterface``.

Transformers v5 routes the attention of most families through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``: the attention module
projects and rotates the queries and keys, then calls that function with the
post-rotary Q, K, V, the mask, ``scaling``, ``softcap`` and ``sliding_window``. A model
loaded with ``attn_implementation="attnscope"`` calls :func:`attnscope_attention`
instead, which

* computes the attention exactly as the families' own eager code does (scale, then
  soft-cap, then mask, softmax in float32; grouped K/V heads expanded with
  ``repeat_interleave``, never tiled), a block of query rows at a time, and
* hands the layer's Q, K and its pattern to the capture that is active for that
  attention module, if any (``activate`` / ``deactivate``, used by ``model.hooks``).

The mask is registered too (``AttentionMaskInterface``): :class:`LazyMask` keeps what
transformers would build a mask from (its mask function, offsets, padding) and
materialises only the rows asked for, with transformers' own ``sdpa_mask``. A layer
therefore never needs its n x n mask at once, and a kept :class:`AttentionCall`
can rebuild any rows of any head later (the next issue's recompute-on-demand).

Families whose attention does not go through the interface (gpt_neo, bloom, falcon)
are loaded with eager attention and captured from their attention module's output
instead (``ArchSpec.capture == "module"``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

IMPLEMENTATION = "attnscope"
ROW_CHUNK = 256  # query rows per block: a block's scores are (H, ROW_CHUNK, n) float32


@dataclass(frozen=True)
class LazyMask:
    """A mask that transformers asked for, materialised a block of query rows at a time.

    ``rows(q0, q1)`` -> bool (B or 1, q1 - q0, kv_length), True where the query may attend.
    """

    kwargs: dict[str, Any]  # what the mask interface received (mask_function, offsets, padding)
    q_length: int
    kv_length: int
    q_offset: int

    def rows(self, q0: int, q1: int) -> torch.Tensor:
        """(B or 1, q1 - q0, kv_length) bool."""
        args = {**self.kwargs, "q_length": q1 - q0, "q_offset": self.q_offset + q0,
                "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False}
        mask = sdpa_mask(**args)
        if mask is None:  # full attention: transformers says no mask is needed
            return torch.ones(1, q1 - q0, self.kv_length, dtype=torch.bool, device=args["device"])
        rows: torch.Tensor = mask[:, 0]  # (B, 1, rows, kv) -> (B, rows, kv)
        return rows


def _lazy_mask(**kwargs: Any) -> LazyMask:
    kwargs.pop("dtype", None)  # a boolean mask: the dtype of an additive one does not apply
    kwargs.pop("config", None)
    q_offset = kwargs.pop("q_offset", 0)
    return LazyMask(kwargs=kwargs, q_length=int(kwargs["q_length"]), kv_length=int(kwargs["kv_length"]),
                    q_offset=int(q_offset))


def mask_rows(mask: Any, q0: int, q1: int, kv: int, device: torch.device) -> torch.Tensor | None:
    """Rows [q0, q1) of whatever mask the model passed: bool (B or 1, rows, kv), or None (no mask).

    Models may pass our LazyMask, a boolean 4-D mask (True = attend) or an additive float
    4-D mask (0 = attend, a very negative number = masked), built by themselves.
    """
    if mask is None:
        return None
    if isinstance(mask, LazyMask):
        return mask.rows(q0, q1)[..., :kv]
    full: torch.Tensor = mask[:, 0] if mask.dim() == 4 else mask  # (B, q, kv): heads broadcast
    m = full[..., q0:q1, :kv]
    if m.dtype != torch.bool:
        m = m > torch.finfo(m.dtype).min / 2  # additive: the masked cells hold ~finfo.min
    return m.to(device)


@dataclass(frozen=True)
class AttentionCall:
    """What one layer's attention saw: enough to recompute any head's pattern exactly."""

    scaling: float
    softcap: float | None
    sliding_window: int | None
    groups: int  # query heads per K/V head
    mask: Any  # LazyMask, a 4-D tensor, or None


def scores(
    q: torch.Tensor,  # (..., H, r, dh) post-rotary queries of the rows asked for
    k: torch.Tensor,  # (..., Hkv, kv, dh) post-rotary keys
    call: AttentionCall,
    allowed: torch.Tensor | None,  # (..., r, kv) bool (shared by the heads), or None = every key
) -> torch.Tensor:
    """(..., H, r, kv) float32 attention weights: scale, soft-cap, mask, softmax (the eager order)."""
    k = k.float().repeat_interleave(call.groups, dim=-3)  # (..., H, kv, dh): head h reads K/V head h // groups
    logits = torch.matmul(q.float(), k.transpose(-1, -2)) * call.scaling  # (..., H, r, kv)
    if call.softcap is not None:
        logits = torch.tanh(logits / call.softcap) * call.softcap
    if allowed is not None:
        logits = logits.masked_fill(~allowed.unsqueeze(-3), float("-inf"))
    probs = logits.softmax(-1)
    # a row with no visible key (cannot happen for a causal row) would be NaN: make it zero
    return probs.nan_to_num(0.0)


class CaptureSink(Protocol):
    """Receives one layer's attention during a captured forward."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, pattern: torch.Tensor,
                  call: AttentionCall) -> None: ...


_ACTIVE: dict[int, tuple[CaptureSink, int]] = {}  # id(attention module) -> (sink, layer)
_ACTIVE_LOCK = threading.Lock()


def activate(modules: list[nn.Module], sink: CaptureSink) -> None:
    """Send the attention of these modules (one per layer, in order) to ``sink`` until deactivated."""
    with _ACTIVE_LOCK:
        for layer, module in enumerate(modules):
            _ACTIVE[id(module)] = (sink, layer)


def deactivate(modules: list[nn.Module]) -> None:
    with _ACTIVE_LOCK:
        for module in modules:
            _ACTIVE.pop(id(module), None)


def active_count() -> int:
    with _ACTIVE_LOCK:
        return len(_ACTIVE)


def row_blocks(n: int, chunk: int = ROW_CHUNK) -> Iterator[tuple[int, int]]:
    for q0 in range(0, n, chunk):
        yield q0, min(n, q0 + chunk)


def attnscope_attention(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, q, dh)
    key: torch.Tensor,  # (B, Hkv, kv, dh)
    value: torch.Tensor,  # (B, Hkv, kv, dv)
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager attention of every interface family, with the capture on the side.

    Returns (output (B, q, H, dv) in the value's dtype, weights (B, H, q, kv) in the
    query's dtype), as transformers' eager functions do. A captured forward has B = 1.
    """
    batch, n_heads, q_len, d_head = query.shape
    kv_len = key.shape[2]
    call = AttentionCall(
        scaling=float(d_head**-0.5 if scaling is None else scaling),
        softcap=float(softcap) if softcap else None,
        sliding_window=sliding_window,
        groups=n_heads // key.shape[1],
        mask=attention_mask,
    )
    v = value.repeat_interleave(call.groups, dim=1)  # (B, H, kv, dv)
    weights = torch.empty(batch, n_heads, q_len, kv_len, dtype=torch.float32, device=query.device)
    for q0, q1 in row_blocks(q_len):
        allowed = mask_rows(attention_mask, q0, q1, kv_len, query.device)  # (B or 1, r, kv)
        weights[:, :, q0:q1] = scores(query[:, :, q0:q1], key, call, allowed)  # (B, H, r, kv)
    output = torch.matmul(weights.to(value.dtype), v)  # (B, H, q, dv)
    target = _ACTIVE.get(id(module))  # a plain dict read: atomic under the GIL
    if target is not None:
        if batch != 1:
            raise ValueError("attnscope captures one sequence at a time (a batch of 1)")
        sink, layer = target
        sink.attention(layer, query[0].detach(), key[0].detach(), weights[0], call)
    return output.transpose(1, 2), weights.to(query.dtype)


_REGISTER_LOCK = threading.Lock()


def register() -> None:
    """Make ``attn_implementation="attnscope"`` available (idempotent)."""
    with _REGISTER_LOCK:
        if IMPLEMENTATION not in AttentionInterface._global_mapping:
            AttentionInterface.register(IMPLEMENTATION, attnscope_attention)
            AttentionMaskInterface.register(IMPLEMENTATION, _lazy_mask)


