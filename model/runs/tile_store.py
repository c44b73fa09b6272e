"""Computed tiles kept for a while, and every head's overview computed ahead, off the request path.

A long run's heatmap opens on an overview tile (the whole head, ``OVERVIEW`` x ``OVERVIEW`` max
bins) and the head grid's thumbnails are the same tiles pooled further; at 16k tokens each is a
pass over half of n² logits. :class:`TileCache` keeps computed tiles by (run, layer, head, tile),
least recently used out, in a byte budget of its own (``ATTNSCOPE_TILE_CACHE_BYTES``, separate
from the run store, whose runs never grow after they were counted: a tile is derived data and
can always be computed again). Concurrent requests for one tile compute it once.

:class:`Prefetch` computes every head's overview of a new run in one background thread, the
head the page will show first (layer 0, head 0) first. It yields to requests: while any request
is computing a tile (``foreground``) it pauses between blocks of rows, so the tile a person is
waiting for never shares the CPU with one nobody asked for yet. A newer run's overviews replace
an older run's that were not computed yet; a run evicted from the store is dropped (the jobs
hold it weakly).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnscope.model.attention.kept import LayerAttention
from attnscope.model.runs.jobthread import JobThread
from attnscope.model.runs.tiles import TileSpec, head_tile

log = logging.getLogger(__name__)
OVERVIEW = 256  # bins per axis of an overview: the explorer's TILE
TileKey = tuple[str, int, int, TileSpec]  # (run id, layer, head, tile)


def overview(n: int) -> TileSpec:
    return TileSpec(0, n, 0, n, size=OVERVIEW, pool="max")


class TileCache:
    """Tiles by (run id, layer, head, spec): (Sq, Sk) float32, least recently used out above ``max_bytes``.

    Thread-safe. A tile larger than the whole budget is computed and returned but not kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tiles: OrderedDict[TileKey, torch.Tensor] = OrderedDict()
        self._pending: dict[TileKey, Future[torch.Tensor]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._tiles)

    def peek(self, key: TileKey) -> torch.Tensor | None:
        with self._lock:
            return self._tiles.get(key)

    def busy(self, key: TileKey) -> bool:
        """Kept already, or being computed."""
        with self._lock:
            return key in self._tiles or key in self._pending

    def get(self, key: TileKey, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The kept tile, or the one being computed (waited for), or ``compute()``'s, then kept."""
        with self._lock:
            kept = self._tiles.get(key)
            if kept is not None:
                self._tiles.move_to_end(key)
                return kept
            pending = self._pending.get(key)
            mine = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
        if not mine:
            return pending.result()
        try:
            value = compute()
        except BaseException as err:
            with self._lock:
                del self._pending[key]
            pending.set_exception(err)
            raise
        with self._lock:
            del self._pending[key]
            self._keep(key, value)
        pending.set_result(value)
        return value

    def _keep(self, key: TileKey, value: torch.Tensor) -> None:
        """Caller holds the lock."""
        size = value.numel() * value.element_size()
        if size > self.max_bytes:
            return
        self._tiles[key] = value
        self._bytes += size
        while self._bytes > self.max_bytes:
            _old, dropped = self._tiles.popitem(last=False)
            self._bytes -= dropped.numel() * dropped.element_size()


class _Closed(Exception):
    """The prefetch was closed while a tile was being computed."""


@dataclass(frozen=True)
class _Job:
    run_id: str
    layer: int
    head: int
    attention: weakref.ref[LayerAttention]


class Prefetch(JobThread[_Job]):
    """One background thread computing overview tiles into a :class:`TileCache`, requests first."""

    def __init__(self, cache: TileCache) -> None:
        super().__init__("attnscope-overviews")
        self.cache = cache
        self._foreground = 0

    def submit(self, run_id: str, layers: list[LayerAttention], first: tuple[int, int] = (0, 0)) -> None:
        """Every head's overview of this run, ``first`` first; replaces the overviews still waiting."""
        order = [(layer, head) for layer in range(len(layers)) for head in range(layers[layer].n_heads)]
        order.sort(key=lambda lh: lh != first)
        with self._cond:
            if self._closed:
                return
            self._jobs.clear()
            self._jobs.extend(_Job(run_id, layer, head, weakref.ref(layers[layer])) for layer, head in order)
            self._start()

    @contextmanager
    def foreground(self) -> Iterator[None]:
        """Around a request's tile work: the background pauses meanwhile."""
        with self._cond:
            self._foreground += 1
        try:
            yield
        finally:
            with self._cond:
                self._foreground -= 1
                self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs)

    def wait_quiet(self) -> None:
        """Until no request is computing a tile (other background work yields to requests too)."""
        with self._cond:
            self._cond.wait_for(lambda: self._foreground == 0 or self._closed)

    def close(self) -> None:
        _left, thread = self._stop()
        if thread is not None:
            thread.join(timeout=10)

    def _yield(self) -> None:
        """Between blocks of a background tile: wait while a request computes one; stop on close."""
        with self._cond:
            self._cond.wait_for(lambda: self._foreground == 0 or self._closed)
            if self._closed:
                raise _Closed

    def _ready(self) -> bool:
        return bool(self._jobs) and self._foreground == 0

    def _run(self, job: _Job) -> None:
        layer = job.attention()
        if layer is None:  # the run is gone
            return
        spec = overview(layer.n)
        key = (job.run_id, job.layer, job.head, spec)
        if self.cache.busy(key):
            return
        try:
            self.cache.get(key, lambda: head_tile(layer, job.head, spec, pause=self._yield))
        except _Closed:
            return
        except Exception:  # a background tile is never worth the server: a request computes it again
            log.exception("overview of run %s L%dH%d failed", job.run_id, job.layer, job.head)


class Tiles:
    """What the API asks for tiles: kept tiles, thumbnails pooled from kept overviews, the prefetch."""

    def __init__(self, max_bytes: int) -> None:
        self.cache = TileCache(max_bytes)
        self.prefetch = Prefetch(self.cache)

    def tile(self, run_id: str, layer: int, attention: LayerAttention, head: int, spec: TileSpec) -> torch.Tensor:
        """(Sq, Sk) float32, NaN where a bin has no visible cell: kept, derived from the overview, or computed."""
        n, whole = attention.n, overview(attention.n)
        if (spec.pool == "max" and spec.size is not None and spec.size < OVERVIEW and OVERVIEW % spec.size == 0
                and n >= OVERVIEW and (spec.q0, spec.q1, spec.k0, spec.k1) == (0, n, 0, n)):
            # a thumbnail: every one of its bins is the union of OVERVIEW / size bins of the overview a side
            # (floor(i * R / s) = floor((OVERVIEW / s) i * R / OVERVIEW)), so the max of their maxes
            big = self.tile(run_id, layer, attention, head, whole)
            return pool_max(big, OVERVIEW // spec.size)
        return self.cache.get((run_id, layer, head, spec), lambda: self._compute(attention, head, spec))

    def _compute(self, attention: LayerAttention, head: int, spec: TileSpec) -> torch.Tensor:
        with self.prefetch.foreground():
            return head_tile(attention, head, spec)

    def close(self) -> None:
        self.prefetch.close()


def pool_max(values: torch.Tensor, f: int) -> torch.Tensor:
    """(S, S) max-pooled bins (NaN: none visible) -> (S / f, S / f), each the max of f x f of them."""
    s = values.shape[0] // f
    filled = values.nan_to_num(float("-inf")).view(s, f, s, f).amax(dim=(1, 3))  # (s, s)
    return filled.masked_fill(filled == float("-inf"), float("nan"))
