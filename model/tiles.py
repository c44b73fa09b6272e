"""Tiles of one head's attention: any sub-matrix, pooled into at most size x size bins.

A tile covers queries [q0, q1) x keys [k0, k1). Each axis of R positions is cut into
S = min(size, R) bins; bin i covers [a + floor(i * R / S), a + floor((i + 1) * R / S)),
so bins differ in width by at most one position and every position is in exactly one.
A bin of one position on both axes is that cell's exact weight; a larger bin pools the
*visible* cells it covers (``max`` keeps a sharp head visible at any zoom, ``mean`` is
the average weight). A bin whose cells are all hidden (the masked future of a causal
model, keys outside a sliding window) has no value: NaN here, ``null`` in JSON.

Rows are read through a callable (``RowsFn``) that returns one head's exact weights for
a block of query rows and the visibility of each cell, so a tile never needs more than
``cell_budget`` weights at once, whatever the run's length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

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


def u8_tile(values: torch.Tensor) -> bytes:
    """(..., cells) pooled weights with NaN for hidden bins -> one byte a bin.

    A byte q < 255 stands for the weight (q / 254)²; 255 (MASKED_U8) is a bin with no
    visible cell.
    """
    hidden = values.isnan()
    q = torch.round(values.nan_to_num(0.0).clamp(0, 1).sqrt() * 254).to(torch.uint8)
    return q.masked_fill(hidden, MASKED_U8).numpy().tobytes()


MASKED_U8 = 255
