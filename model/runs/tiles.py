"""Tiles of one head's attention: any sub-matrix, pooled into at most size x size bins.

A tile covers queries [q0, q1) x keys [k0, k1). Each axis of R positions is cut into
S = min(size, R) bins; bin i covers [a + floor(i * R / S), a + floor((i + 1) * R / S)),
so bins differ in width by at most one position and every position is in exactly one.
A bin of one position on both axes is that cell's exact weight; a larger bin pools the
*visible* cells it covers (``max`` keeps a sharp head visible at any zoom, ``mean`` is
the average weight). A bin whose cells are all hidden (the masked future of a causal
model, keys outside a sliding window) has no value: NaN here, ``null`` in JSON.

Two ways to compute one, the same numbers:

* :func:`head_tile` (what the API uses) reads a kept layer's Q, K and row normalisers and,
  when every row sees one range of keys (causal, sliding window, bidirectional: ``model.attention.spans``),
  never builds a mask: a bin's max is ``exp(max over its cells of (logit - lse_row))``, so a
  block of rows costs one matmul of its *visible* keys (``logit - lse`` fused into it), a max
  (or, for ``mean``, an exp and a sum) over the rows of each query bin, then one over the key
  bins of the much smaller result. Only the columns where the rows' ranges differ (the diagonal
  of a causal head, the edge of a window) are masked, and a bin's count of visible cells is
  known from the ranges;
* :func:`tile` (the general path, any mask) reads rows through a callable (``RowsFn``) that
  returns one head's exact weights for a block of query rows and the visibility of each cell.

Either never holds more than ``cell_budget`` weights at once, whatever the run's length.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from attnscope.model.attention.kept import LayerAttention
from attnscope.model.attention.spans import Spans

Pool = Literal["max", "mean"]
# (q0, q1) -> (weights (q1 - q0, k1 - k0) float32, visible (q1 - q0, k1 - k0) bool), keys fixed by the caller
RowsFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
CELL_BUDGET = 1 << 20  # weights materialised at once while a tile is pooled (4 MiB of float32)


@dataclass(frozen=True)
class TileSpec:
    """Where a tile lies and how it pools; ``q_edges`` / ``k_edges`` are its bins' boundaries."""

    q0: int
    q1: int
    k0: int
    k1: int
    size: int | None  # None: one bin per position
    pool: Pool

    def q_edges(self) -> torch.Tensor:
        return edges(self.q0, self.q1, self.size)

    def k_edges(self) -> torch.Tensor:
        return edges(self.k0, self.k1, self.size)

    @property
    def shape(self) -> tuple[int, int]:
        return bins(self.q1 - self.q0, self.size), bins(self.k1 - self.k0, self.size)

    @property
    def exact(self) -> bool:
        """Every bin is one cell: the tile holds the weights themselves."""
        return self.shape == (self.q1 - self.q0, self.k1 - self.k0)


def bins(length: int, size: int | None) -> int:
    return length if size is None else min(size, length)


def edges(a: int, b: int, size: int | None) -> torch.Tensor:
    """(S + 1,) int64 bin boundaries of [a, b): a + floor(i * R / S), i = 0..S."""
    r = b - a
    s = bins(r, size)
    i = torch.arange(s + 1, dtype=torch.int64)
    return a + torch.div(i * r, s, rounding_mode="floor")


def _row_groups(q_edges: torch.Tensor, width: int, budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive query bins [b0, b1) whose rows hold at most ``budget`` cells (at least one bin)."""
    most_rows = max(1, budget // max(1, width))
    b0, s = 0, len(q_edges) - 1
    while b0 < s:
        b1 = b0 + 1
        while b1 < s and int(q_edges[b1 + 1] - q_edges[b0]) <= most_rows:
            b1 += 1
        yield b0, b1
        b0 = b1


def _reduce(values: torch.Tensor, bin_of: torch.Tensor, n_bins: int, dim: int, how: str) -> torch.Tensor:
    """Reduce ``values`` along ``dim`` into ``n_bins`` bins; ``bin_of`` (values.shape[dim],) is each slot's bin."""
    shape = list(values.shape)
    shape[dim] = n_bins
    if how == "max":
        out = torch.full(shape, float("-inf"), dtype=values.dtype, device=values.device)
        index = bin_of[:, None] if dim == 0 else bin_of[None, :]
        return out.scatter_reduce_(dim, index.expand_as(values), values, "amax", include_self=True)
    return torch.zeros(shape, dtype=values.dtype, device=values.device).index_add_(dim, bin_of, values)


def _pool_columns(values: torch.Tensor, rel_edges: torch.Tensor, how: str) -> torch.Tensor:
    """(r, w) -> (r, S): reduce each bin of columns [e_i, e_{i+1}) (edges relative to column 0).

    Bins are w0 or w0 + 1 wide: the first w0 columns of every bin are gathered into (r, S, w0)
    and reduced at once, then the wider bins take in their last column.
    """
    widths = rel_edges.diff()
    starts = rel_edges[:-1]
    w0 = int(widths.min())
    if int(widths.max()) == w0:  # uniform bins: a view
        block = values.reshape(values.shape[0], len(widths), w0)
    else:
        block = values[:, (starts[:, None] + torch.arange(w0)).flatten()].view(values.shape[0], len(widths), w0)
    out = block.amax(-1) if how == "max" else block.sum(-1)  # (r, S)
    wide = (widths > w0).nonzero()[:, 0]
    if len(wide):
        last = values[:, starts[wide] + w0]  # (r, wide bins)
        out[:, wide] = torch.maximum(out[:, wide], last) if how == "max" else out[:, wide] + last
    return out


def _bin_of(lengths: torch.Tensor) -> torch.Tensor:
    """(S,) bin widths -> (sum,) the bin of each position."""
    return torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)


def tile(rows: RowsFn, spec: TileSpec, cell_budget: int = CELL_BUDGET) -> torch.Tensor:
    """(Sq, Sk) float32 pooled weights, NaN where a bin has no visible cell."""
    q_edges, k_edges = spec.q_edges(), spec.k_edges()
    k_rel = k_edges - spec.k0
    out = []
    for b0, b1 in _row_groups(q_edges, spec.k1 - spec.k0, cell_budget):
        ra, rb = int(q_edges[b0]), int(q_edges[b1])
        weights, visible = rows(ra, rb)  # (r, kw) each
        q_bin = _bin_of(q_edges[b0 : b1 + 1].diff())  # (r,): 0 .. bins - 1
        n_q = b1 - b0
        if spec.pool == "max":
            masked = weights.float().masked_fill(~visible, float("-inf"))
            by_col = _pool_columns(masked, k_rel, "max")  # (r, Sk)
            pooled = _reduce(by_col, q_bin, n_q, 0, "max")  # (bins, Sk)
            pooled = pooled.masked_fill(pooled == float("-inf"), float("nan"))
        else:
            sums = _pool_columns(weights.float() * visible, k_rel, "sum")  # (r, Sk)
            counts = _pool_columns(visible.float(), k_rel, "sum")
            total = _reduce(sums, q_bin, n_q, 0, "sum")  # (bins, Sk)
            count = _reduce(counts, q_bin, n_q, 0, "sum")
            pooled = torch.where(count > 0, total / count.clamp_min(1), float("nan"))
        out.append(pooled)
    return torch.cat(out).float()


def head_tiles(layer: LayerAttention, heads: list[int], spec: TileSpec) -> torch.Tensor:
    """(heads, Sq, Sk) float32 tiles of one layer, NaN where a bin has no visible cell (computed, not kept)."""
    return torch.stack([head_tile(layer, h, spec) for h in heads])


def head_tile(layer: LayerAttention, head: int, spec: TileSpec, cell_budget: int = CELL_BUDGET,
              pause: Callable[[], None] | None = None) -> torch.Tensor:
    """(Sq, Sk) float32 pooled weights of one kept head, NaN where a bin has no visible cell.

    ``pause`` is called between blocks of rows (a background computation yields there)."""
    ranges = layer.spans()
    if ranges is None:  # a mask that is not one range a row: evaluate its rows
        def rows(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
            if pause is not None:
                pause()
            return layer.rows(head, a, b, spec.k0, spec.k1)

        return tile(rows, spec, cell_budget)
    return _RangedTile(layer, head, spec, ranges).compute(cell_budget, pause)


class _RangedTile:
    """A pooled tile of one head whose rows each see one range of keys (the fast path of ``head_tile``).

    ``acc`` holds, per bin, the running max of logit - lse (max pooling; ``exp`` of it at the end
    is the max weight, as exp never decreases) or the running sum of weights (mean pooling, beside
    ``counts``, the visible cells per bin, known from the ranges).
    """

    def __init__(self, layer: LayerAttention, head: int, spec: TileSpec, ranges: Spans) -> None:
        self.spec, self.ranges = spec, ranges
        self.q_edges = spec.q_edges().tolist()
        self.k_edges = spec.k_edges().to(layer.q.device)  # (Sk + 1,)
        self.k_list = spec.k_edges().tolist()
        self.lo, self.hi = ranges.lo.tolist(), ranges.hi.tolist()
        self.maxed = spec.pool == "max"
        shape = (len(self.q_edges) - 1, len(self.k_list) - 1)
        self.acc = torch.full(shape, float("-inf") if self.maxed else 0.0, dtype=torch.float32, device=layer.q.device)
        self.counts = torch.zeros_like(self.acc)
        self.q = layer.q[head]  # (n, dh)
        self.k = layer.k[head // layer.groups]  # (n, dh): the K/V head this query head reads
        self.neg_lse = -layer.lse[head]  # (n,)
        self.bias = None if layer.bias is None else layer.bias[head]  # (n,)
        self.scaling, self.softcap = layer.scaling, layer.softcap

    def compute(self, cell_budget: int, pause: Callable[[], None] | None = None) -> torch.Tensor:
        """(Sq, Sk) float32, NaN where a bin has no visible cell."""
        q_edges, n_q = self.q_edges, len(self.q_edges) - 1
        most_rows = max(1, cell_budget // max(1, self.spec.k1 - self.spec.k0))
        b = 0
        while b < n_q:  # a block of rows: whole query bins while they fit the budget, or part of one wide bin
            b1 = b + 1
            while b1 < n_q and q_edges[b1 + 1] - q_edges[b] <= most_rows:
                b1 += 1
            for ra in range(q_edges[b], q_edges[b1], most_rows):
                if pause is not None:
                    pause()
                self._block(b, b1, ra, min(q_edges[b1], ra + most_rows))
            b = b1
        if self.maxed:
            return self.acc.exp().masked_fill(self.acc == float("-inf"), float("nan"))
        return torch.where(self.counts > 0, self.acc / self.counts.clamp_min(1), float("nan"))

    def _block(self, b0: int, b1: int, ra: int, rb: int) -> None:
        """Pool rows [ra, rb) (inside query bins [b0, b1)) into the bins."""
        spec, k_list = self.spec, self.k_list
        # the keys these rows see, within the tile, widened to whole key bins (ranges never decrease with q)
        ka, kb = max(spec.k0, self.lo[ra]), min(spec.k1, self.hi[rb - 1])
        if ka >= kb:
            return
        c0, c1 = bisect_right(k_list, ka) - 1, bisect_left(k_list, kb)
        ka, kb = k_list[c0], k_list[c1]
        # logit - lse (r, w) in the eager order and rounding: q.k x scaling (+ bias), soft-capped, - lse
        z = torch.mm(self.q[ra:rb], self.k[ka:kb].T).mul_(self.scaling)
        if self.bias is not None:
            z.add_(self.bias[None, ka:kb])
        if self.softcap is not None:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        z.add_(self.neg_lse[ra:rb, None])
        # hide what only some of these rows see: keys left of the last row's first key, or from the
        # first row's end on; between them every row sees every key
        rows_lo, rows_hi = self.ranges.lo[ra:rb, None], self.ranges.hi[ra:rb, None]  # (r, 1) each
        left, right = min(kb, self.lo[rb - 1]), max(ka, self.hi[ra])
        if left > ka:
            cols = torch.arange(ka, left, device=z.device)[None, :]
            z[:, : left - ka].masked_fill_(cols < rows_lo, float("-inf"))
        if right < kb:
            cols = torch.arange(right, kb, device=z.device)[None, :]
            z[:, right - ka :].masked_fill_(cols >= rows_hi, float("-inf"))
        how = "max" if self.maxed else "sum"
        if not self.maxed:
            z.exp_()  # hidden cells are exact zeros now
        # the rows of each query bin first, then the key bins of the (bins, w) result
        if b1 - b0 == 1:  # one query bin (or part of one)
            by_row = z.amax(0, keepdim=True) if self.maxed else z.sum(0, keepdim=True)  # (1, w)
        else:  # whole query bins
            q_rel = torch.tensor(self.q_edges[b0 : b1 + 1]) - ra
            by_row = _pool_rows(z, q_rel, how)  # (bins, w)
        pooled = _pool_columns(by_row, (self.k_edges[c0 : c1 + 1] - ka).cpu(), how)  # (bins, c1 - c0)
        acc = self.acc[b0:b1, c0:c1]
        if self.maxed:
            torch.maximum(acc, pooled, out=acc)
            return
        acc += pooled
        seen = (torch.minimum(rows_hi, self.k_edges[None, c0 + 1 : c1 + 1])
                - torch.maximum(rows_lo, self.k_edges[None, c0:c1])).clamp_min(0).float()  # (r, c1 - c0)
        self.counts[b0:b1, c0:c1] += seen.sum(0, keepdim=True) if b1 - b0 == 1 else _pool_rows(seen, q_rel, "sum")


def _pool_rows(values: torch.Tensor, rel_edges: torch.Tensor, how: str) -> torch.Tensor:
    """(r, w) -> (S, w): reduce each bin of rows [e_i, e_{i+1}) (edges relative to row 0), bins w0 or w0 + 1 rows."""
    widths = rel_edges.diff()
    w0 = int(widths.min())
    if w0 == 1 and int(widths.max()) == 1:
        return values
    if int(widths.max()) == w0:  # uniform bins: a view
        block = values.view(len(widths), w0, values.shape[1])
    else:
        starts = rel_edges[:-1]
        block = values[(starts[:, None] + torch.arange(w0)).flatten()].view(len(widths), w0, values.shape[1])
    out = block.amax(1) if how == "max" else block.sum(1)  # (S, w)
    wide = (widths > w0).nonzero()[:, 0]
    if len(wide):
        last = values[rel_edges[:-1][wide] + w0]  # (wide bins, w)
        out[wide] = torch.maximum(out[wide], last) if how == "max" else out[wide] + last
    return out
