"""What a run keeps of one layer's attention, and any head's weights rebuilt from it exactly.

A kept layer holds O(n) per head, never the n x n pattern:

* ``q``    (H, n, dh) float32 post-rotary queries, as the attention function received them;
* ``k``    (Hkv, n, dh) float32 post-rotary keys: K/V heads, not repeated (head h reads K/V head
  h // groups, transformers' ``repeat_interleave`` grouping);
* ``lse``  (H, n) float32: each row's log-sum-exp of its visible logits, the softmax's normaliser;
* ``bias`` (H, n) float32 or None: a per-key additive logit (ALiBi: slope_h x key position, in logit
  units, i.e. already multiplied by the model's scaling where it scales after adding);
* ``mask`` a :class:`model.attention.interface.LazyMask` over the whole sequence (causal, sliding window,
  bidirectional, local windows: transformers' own mask functions, rows built on demand), or, for a
  run read back from its file, a :class:`model.attention.spans.RangeMask` (one key range a row).

Bytes kept per layer: 4 x n x ((H + Hkv) x dh + H (lse) + H (if ALiBi)).

A weight is rebuilt in the families' eager order: logits = q.k x scaling (+ bias), soft-capped
(c x tanh(logits / c)), masked, then exp(logits - lse) — softmax with the normaliser computed
once over the whole row, so a tile of any key range costs only its own cells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from attnscope.model.attention.interface import LazyMask, visible_span
from attnscope.model.attention.spans import RangeMask, Spans, mask_spans

CHUNK_CELLS = 1 << 21  # weights per head x rows x keys block while a whole layer is swept (8 MiB float32)


@dataclass(frozen=True)
class LayerAttention:
    q: torch.Tensor  # (H, n, dh) float32
    k: torch.Tensor  # (Hkv, n, dh) float32
    lse: torch.Tensor  # (H, n) float32
    scaling: float
    softcap: float | None
    groups: int  # query heads per K/V head
    bias: torch.Tensor | None  # (H, n) float32 per-key logit bias (ALiBi), or None
    mask: LazyMask | RangeMask  # RangeMask: a run read back from its file (``model/runs/runfile.py``)

    @property
    def n_heads(self) -> int:
        return int(self.q.shape[0])

    @property
    def n(self) -> int:
        return int(self.q.shape[1])

    @property
    def nbytes(self) -> int:
        tensors = [self.q, self.k, self.lse] + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors) + self.mask.nbytes

    def spans(self) -> Spans | None:
        """Each row's visible keys as one range, read from the mask function (None: not a known one)."""
        return mask_spans(self.mask)

    @property
    def fused_causal(self) -> bool:
        """Can the pair sums and the tiled entropy pass sweep this layer (``model.scores.pairs``, on any device):
        a causal mask over the whole run, logits q.k x scaling (no soft-cap, no bias), kept in float32."""
        return (self.softcap is None and self.bias is None and self.scaling > 0 and self.q.dtype == torch.float32
                and self.mask.fused_causal() is True)

    def visible(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """(q1 - q0, k1 - k0) bool: which keys each of these queries may attend to."""
        return self.mask.rows(q0, q1)[0, :, k0:k1]

    def logits(self, heads: slice | list[int], q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """(h, r, kw) float32 soft-capped logits, before the mask."""
        return logits(self.q[heads, q0:q1], self.k, heads_of(heads, self.n_heads), self.groups, k0, k1,
                      self.scaling, self.softcap, None if self.bias is None else self.bias[heads, k0:k1])

    def rows(self, head: int, q0: int, q1: int, k0: int = 0, k1: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head's exact weights over queries [q0, q1) x keys [k0, k1): (weights, visible), each (r, kw).

        Only the keys some of these rows see are computed (a causal tile skips its future)."""
        k1 = self.n if k1 is None else k1
        allowed = self.visible(q0, q1, k0, k1)  # (r, kw)
        weights = torch.zeros(allowed.shape, dtype=torch.float32, device=self.q.device)
        lo, hi = visible_span(allowed)
        z = self.logits([head], q0, q1, k0 + lo, k0 + hi)[0]  # (r, hi - lo)
        weights[:, lo:hi] = (z - self.lse[head, q0:q1, None]).exp().masked_fill(~allowed[:, lo:hi], 0.0)
        return weights.nan_to_num_(0.0), allowed

    def weights(self, q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's weights for queries [q0, q1) over all keys: ((H, r, n) float32, visible (r, n))."""
        allowed = self.visible(q0, q1, 0, self.n)
        out = torch.zeros((self.n_heads, *allowed.shape), dtype=torch.float32, device=self.q.device)
        lo, hi = visible_span(allowed)
        z = self.logits(slice(None), q0, q1, lo, hi)  # (H, r, hi - lo)
        out[..., lo:hi] = (z - self.lse[:, q0:q1, None]).exp().masked_fill(~allowed[:, lo:hi], 0.0)
        return out.nan_to_num_(0.0), allowed

    def block_rows(self, cells: int = CHUNK_CELLS) -> int:
        return max(1, cells // max(1, self.n * self.n_heads))

    def blocks(self, cells: int = CHUNK_CELLS) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """Every head's weights a block of rows at a time: (q0, q1, weights (H, r, n), visible (r, n))."""
        rows = self.block_rows(cells)
        for q0 in range(0, self.n, rows):
            q1 = min(self.n, q0 + rows)
            yield (q0, q1, *self.weights(q0, q1))

    def dense(self) -> torch.Tensor:
        """(H, n, n) the whole pattern (small runs, tests): zeros where masked."""
        return torch.cat([w for _q0, _q1, w, _v in self.blocks()], dim=1)


def heads_of(heads: slice | list[int], n_heads: int) -> list[int]:
    return list(range(n_heads))[heads] if isinstance(heads, slice) else heads


def logits(
    q: torch.Tensor,  # (h, r, dh) queries of the heads asked for
    k: torch.Tensor,  # (Hkv, n, dh) all keys
    heads: list[int],  # which query heads q holds
    groups: int,
    k0: int,
    k1: int,
    scaling: float,
    softcap: float | None,
    bias: torch.Tensor | None,  # (h, kw)
) -> torch.Tensor:
    """(h, r, kw) float32: q.k x scaling (+ bias), soft-capped — the eager order, before the mask."""
    kv_heads = torch.tensor([h // groups for h in heads], device=k.device)
    keys = k[kv_heads, k0:k1].float()  # (h, kw, dh)
    z = torch.matmul(q.float(), keys.transpose(-1, -2)) * scaling  # (h, r, kw)
    if bias is not None:
        z = z + bias[:, None, :]
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return z


def masked_lse(z: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(..., r, kw) logits, (r, kw) visibility -> (..., r) log-sum-exp over the visible keys."""
    return z.masked_fill(~allowed, float("-inf")).logsumexp(-1)


def build(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    *,
    scaling: float,
    softcap: float | None,
    groups: int,
    bias: torch.Tensor | None,  # (H, n)
    mask: LazyMask | RangeMask,
    lse: torch.Tensor | None = None,  # (H, n) when the forward computed it
    scores: Callable[[int, torch.Tensor], None] | None = None,
    cells: int = CHUNK_CELLS,
) -> LayerAttention:
    """A kept layer. Without ``lse`` (families read from their module, recorded generations) one sweep
    over the rows computes it, feeding ``scores(q0, weights (H, r, n))`` on the way if given."""
    layer = LayerAttention(q=q, k=k, lse=lse if lse is not None else torch.empty(0), scaling=scaling,
                           softcap=softcap, groups=groups, bias=bias, mask=mask)
    if lse is not None and scores is None:
        return layer
    n = layer.n
    rows = max(1, cells // max(1, n * layer.n_heads))
    parts = []
    for q0 in range(0, n, rows):
        q1 = min(n, q0 + rows)
        allowed = layer.visible(q0, q1, 0, n)  # (r, n)
        z = layer.logits(slice(None), q0, q1, 0, n)  # (H, r, n)
        block_lse = masked_lse(z, allowed) if lse is None else lse[:, q0:q1]  # (H, r)
        parts.append(block_lse)
        if scores is not None:
            scores(q0, (z - block_lse[..., None]).exp().masked_fill(~allowed, 0.0).nan_to_num(0.0))
    return dataclasses.replace(layer, lse=torch.cat(parts, dim=1))
