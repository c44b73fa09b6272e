"""Which keys each query row sees, as one range a row, read from the mask function itself.

Tiles of a long run must not build an n x n mask cell by cell: for the masks transformers
builds from its own index functions the visible keys of query q are one range [lo_q, hi_q),
known in O(n) from the function's parameters. :func:`mask_spans` recognises those functions —
``causal_mask_function``, ``bidirectional_mask_function``, the sliding-window overlays
(causal and bidirectional) and their intersections (``and_masks``, in any order) — reads
their parameters (the window) and then *checks* the ranges against the real mask on a
sample of rows (both ends of the sequence, around the window's edge, a spread of rows
between). Any other mask (padding, chunked or packed sequences, a custom function) returns
None, and callers fall back to evaluating the mask rows themselves.

A run read back from a file (``model/runs/runfile.py``) keeps no mask function, only each row's
range: :class:`RangeMask` is that mask, with what the rest of the code asks of a ``LazyMask``
(rows, the fused kernel's causal test, bytes, spans).

Each recognised function bounds the offset d = q_idx - kv_idx (with the mask's own offsets
added): causal ``d >= 0``, sliding overlay ``d < w``, bidirectional window ``|d| <= w``,
bidirectional none. Their intersection is ``d_lo <= d <= d_hi``, i.e. keys
[q - d_hi, q - d_lo] — so lo and hi never decrease with q (tiles rely on that).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from attnscope.model.attention.interface import LazyMask

INF = 1 << 62
PROBE_ROWS = 4  # rows per probed block


@dataclass(frozen=True)
class Spans:
    """Row q (0-based in the run) sees keys [lo[q], hi[q]); both non-decreasing in q."""

    lo: torch.Tensor  # (n,) int64
    hi: torch.Tensor  # (n,) int64
    d_lo: int  # bounds on q - k (before clamping to the sequence)
    d_hi: int

    def visible(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """(q1 - q0, k1 - k0) bool, from the ranges (what the mask rows hold)."""
        keys = torch.arange(k0, k1, device=self.lo.device)
        return (keys[None, :] >= self.lo[q0:q1, None]) & (keys[None, :] < self.hi[q0:q1, None])


@dataclass(frozen=True)
class RangeMask:
    """A mask over a whole run of n positions given as one key range a row: query q sees keys
    [lo[q], hi[q]). What a stored run keeps of its mask (``model/runs/runfile.py``); it answers what
    ``LayerAttention`` asks of a ``LazyMask``. Build it with :meth:`of`, which checks the ranges."""

    lo: torch.Tensor  # (n,) int64, 0 <= lo <= hi <= n
    hi: torch.Tensor  # (n,) int64
    causal: bool  # lo == 0 and hi == q + 1 on every row: the causal square

    q_offset = 0
    kv_offset = 0

    @staticmethod
    def of(lo: torch.Tensor, hi: torch.Tensor) -> RangeMask:
        """From (n,) integer tensors; ValueError unless 0 <= lo <= hi <= n on every row."""
        lo, hi = lo.detach().to("cpu", torch.int64).contiguous(), hi.detach().to("cpu", torch.int64).contiguous()
        n = int(lo.shape[0]) if lo.dim() == 1 else -1
        if lo.dim() != 1 or hi.shape != lo.shape:
            raise ValueError(f"key ranges must be two (n,) tensors, not {tuple(lo.shape)} and {tuple(hi.shape)}")
        if n and not bool(((lo >= 0) & (lo <= hi) & (hi <= n)).all()):
            raise ValueError(f"a row's key range is not within 0 <= lo <= hi <= {n}")
        rows = torch.arange(n)
        causal = bool((lo == 0).all()) and torch.equal(hi, rows + 1)
        return RangeMask(lo=lo, hi=hi, causal=causal)

    @property
    def q_length(self) -> int:
        return int(self.lo.shape[0])

    @property
    def kv_length(self) -> int:
        return int(self.lo.shape[0])

    @property
    def nbytes(self) -> int:
        return self.lo.numel() * self.lo.element_size() + self.hi.numel() * self.hi.element_size()

    def rows(self, q0: int, q1: int) -> torch.Tensor:
        """(1, q1 - q0, n) bool, True where the query may attend."""
        keys = torch.arange(self.kv_length)
        return ((keys[None, :] >= self.lo[q0:q1, None]) & (keys[None, :] < self.hi[q0:q1, None]))[None]

    def fused_causal(self) -> bool | None:
        """True for the causal square (the fused kernel's ``is_causal``), None for anything else."""
        return True if self.causal else None

    def whole(self, n: int) -> RangeMask:
        """The mask over the whole run: itself (a stored run is whole already)."""
        if n != self.q_length:
            raise ValueError(f"a stored mask covers its whole run, {self.q_length} positions, not {n}")
        return self

    def spans(self) -> Spans | None:
        """The ranges as ``Spans`` when both ends never decrease with q (what tiles rely on), else None."""
        if self.q_length > 1 and not (bool((self.lo[1:] >= self.lo[:-1]).all())
                                      and bool((self.hi[1:] >= self.hi[:-1]).all())):
            return None
        rows = torch.arange(self.q_length)
        seen = self.hi > self.lo
        d_lo = int((rows - self.hi + 1)[seen].min()) if bool(seen.any()) else 0
        d_hi = int((rows - self.lo)[seen].max()) if bool(seen.any()) else 0
        return Spans(lo=self.lo, hi=self.hi, d_lo=d_lo, d_hi=d_hi)


def _closure(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return dict(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        return {}


def offset_bounds(fn: Callable[..., Any]) -> tuple[int, int] | None:
    """(d_lo, d_hi) with d = q_idx - kv_idx visible iff d_lo <= d <= d_hi, or None (not a known function)."""
    if fn is causal_mask_function:
        return 0, INF
    if fn is bidirectional_mask_function:
        return -INF, INF
    name = getattr(fn, "__qualname__", "")
    free = _closure(fn)
    if name == "sliding_window_overlay.<locals>.inner_mask" and isinstance(free.get("sliding_window"), int):
        return -INF, int(free["sliding_window"]) - 1  # kv_idx > q_idx - w
    if (name == "sliding_window_bidirectional_overlay.<locals>.inner_mask"
            and isinstance(free.get("sliding_window"), int)):
        w = int(free["sliding_window"])
        return -w, w  # |q_idx - kv_idx| <= w
    if name == "and_masks.<locals>.and_mask" and isinstance(free.get("mask_functions"), tuple):
        lo, hi = -INF, INF
        for part in free["mask_functions"]:
            bounds = offset_bounds(part)
            if bounds is None:
                return None
            lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
        return lo, hi
    return None


def _probe_rows(n: int, d_lo: int, d_hi: int) -> list[int]:
    """First rows of the blocks checked against the real mask."""
    starts = {0, n - PROBE_ROWS, n // 3, n // 2, (2 * n) // 3}
    for d in (d_lo, d_hi):
        if abs(d) < n:
            starts.update({abs(d) - 2, abs(d) + 2, n - abs(d) - 2})
    return sorted(max(0, min(n - PROBE_ROWS, s)) for s in starts)


def mask_spans(mask: LazyMask | RangeMask) -> Spans | None:
    """The visible key range of every query row of ``mask``, or None when it is not known to be one range."""
    if isinstance(mask, RangeMask):
        return mask.spans()
    padding = mask.kwargs.get("attention_mask")
    if isinstance(padding, torch.Tensor) and not bool(padding.all()):
        return None
    fn = mask.kwargs.get("mask_function", causal_mask_function)
    bounds = offset_bounds(fn) if callable(fn) else None
    if bounds is None:
        return None
    d_lo, d_hi = bounds
    n_q, n_k = mask.q_length, mask.kv_length
    device = mask.kwargs.get("device", "cpu")
    q_idx = torch.arange(n_q, device=device) + mask.q_offset  # q_idx - kv_idx = d: kv = q_idx - kv_offset - d
    base = q_idx - mask.kv_offset
    lo = (base - d_hi).clamp(0, n_k) if d_hi < INF else torch.zeros_like(base)
    hi = (base - d_lo + 1).clamp(0, n_k) if d_lo > -INF else torch.full_like(base, n_k)
    hi = torch.maximum(hi, lo)
    found = Spans(lo=lo, hi=hi, d_lo=d_lo, d_hi=d_hi)
    for q0 in _probe_rows(n_q, d_lo, d_hi):
        q1 = min(n_q, q0 + PROBE_ROWS)
        if not torch.equal(mask.rows(q0, q1)[0].to(lo.device), found.visible(q0, q1, 0, n_k)):
            return None
    return found
