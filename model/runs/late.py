"""Head scores a run still owes, computed exactly after the analyse has answered.

A forward through the fused kernel (``model.capture``) keeps Q, K and each row's lse; every head score follows
from them exactly (``model.scores.pairs``): previous-token, first-token and induction from single dot
products, entropy and peak (a row's largest weight) from every visible cell once more. That sweep costs a
fifth to a quarter of the forward on SmolLM2 at 1k-2k tokens and about attention's share of it again at long
context (BENCHMARKS.md), so ``Engine.analyse`` answers without any of them (``run_with_cache(defer=True)``; a
layer that took the block path has its scores complete): the run is stored with those fields None and named in
``RunSummary.scores_pending``, and :class:`ScoreWorker` computes them in the background, a few layers at once,
from what the run keeps (Q, K, lse: ``LayerAttention``), with the same exact maths as before
(``model.scores.live.complete``), then swaps the completed summary into the stored run.

Bytes: nothing is attached to the run. The completed head scores replace the pending ones, which the
store counted when the run was added (``summary_bytes`` counts ~0.6 kB a head, a head's scores with
their floats included), so a run never grows after it was counted. The sweep's own transient memory
(the keys transposed, the row statistics and a tile of log-weights) is held in the engine's byte budget
(``model.runs.budget.MemoryBudget``) while it runs, like a forward's.

Runs evicted before their scores are computed are skipped (the worker holds them weakly and asks the
store before and after each layer); whoever waits for them is woken and finds the run gone.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnscope.model.attention.interface import BLOCK_CELLS
from attnscope.model.attention.kept import LayerAttention
from attnscope.model.runs.jobthread import JobThread, use_background_threads
from attnscope.model.runs.record import PendingScores
from attnscope.model.scores.analysis import SCORE_NAMES, HeadScore, ScoreAccumulator
from attnscope.model.scores.live import complete
from attnscope.model.scores.pairs import DENSE_GROUP, InductionPairs

if TYPE_CHECKING:
    from attnscope.model.runs.budget import MemoryBudget
    from attnscope.model.runs.record import RunRecord, RunStore

log = logging.getLogger(__name__)
STOPPED = "the server stopped before these scores were computed"


def sweep_bytes(layer: LayerAttention) -> int:
    """The sweep's transient memory for one layer, an upper bound: the keys transposed and the row statistics
    (at most (H, n, dh) and a few (H, n) tensors), two tiles or a block of logits, and the run's induction pairs
    (``InductionPairs``, found once per run and held through the sweep: 56 bytes a position and the sort's
    temporaries under 96, with the squares of tokens of many copies at most 4 x ``DENSE_GROUP`` more)."""
    h, n, dh = layer.q.shape
    return 4 * (h * n * (dh + 8) + 2 * BLOCK_CELLS) + (96 + 4 * DENSE_GROUP) * n


def layer_scores(kept: LayerAttention, ids: torch.Tensor, fields: frozenset[str], layer: int,
                 pairs: InductionPairs | None = None, pause: Callable[[], None] | None = None) -> list[HeadScore]:
    """One layer's owed fields, exactly over every row: HeadScores whose other fields are meaningless.
    ``pairs``: the run's induction pairs (found once for all its layers); ``pause``: the worker's, called
    between the layer's parts (``model.scores.live.complete``)."""
    acc = ScoreAccumulator(kept.n_heads, ids)
    acc.todo = set(fields)
    complete(acc, kept, pairs, pause)
    return acc.finish(layer)


def merged(heads: list[HeadScore], late: dict[int, list[HeadScore]], fields: dict[int, frozenset[str]]
           ) -> list[HeadScore]:
    """The run's heads with each layer's owed fields taken from ``late``."""
    out = []
    for s in heads:
        if s.layer not in late:
            out.append(s)
            continue
        new = late[s.layer][s.head]
        out.append(dataclasses.replace(s, **{SCORE_NAMES[f]: getattr(new, SCORE_NAMES[f]) for f in fields[s.layer]}))
    return out


@dataclass(frozen=True)
class _Job:
    run_id: str
    record: weakref.ref[RunRecord]


ELSEWHERE_S = 600.0  # the longest a worker waits for another to write a run's head scores


class ScoreWorker(JobThread[_Job]):
    """A background thread that computes the scores stored runs still owe, oldest run first, ``lanes``
    layers of a run at once.

    ``pause`` (if set) is called between layers: the app passes the tile prefetch's wait for requests
    in flight, so a tile a person waits for does not share the CPU with a sweep."""

    def __init__(self, store: RunStore, budget: MemoryBudget | None = None, lanes: int | None = None) -> None:
        super().__init__("attnscope-scores")
        self.store = store
        self.budget = budget
        self.pause: Callable[[], None] | None = None
        # layers swept at once, each on a thread of one torch thread (``model.runs.jobthread`` says why not
        # one thread of many): as many as the creator's torch threads, at most 8
        self.lanes = lanes if lanes is not None else max(1, min(8, torch.get_num_threads()))
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, run_id: str, record: RunRecord) -> None:
        with self._cond:
            self._closed = False  # a closed worker starts again on new work (an engine shared by apps)
            self._jobs.append(_Job(run_id, weakref.ref(record)))
            self._start()

    def pending(self) -> int:
        """Runs waiting or being computed."""
        with self._cond:
            return len(self._jobs) + int(self._running)

    def close(self) -> None:
        """Stop after the layer being computed; runs still owed stay pending (and their waiters are woken)."""
        left, thread = self._stop()
        for job in left:
            record = job.record()
            if record is not None and record.pending is not None:
                record.pending.error = STOPPED
                record.pending.done.set()
        if thread is not None:
            thread.join(timeout=30)
        with self._cond:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _run(self, job: _Job) -> None:
        record = job.record()
        if record is None or record.pending is None:
            return
        try:
            self._once(job.run_id, record, record.pending)
        except Exception as err:  # a failed sweep is reported on the run, never taken down the server
            log.exception("late head scores of run %s failed", job.run_id)
            record.pending.error = f"the head scores could not be computed: {err}"
        finally:
            record.pending.done.set()

    def _once(self, run_id: str, record: RunRecord, pending: PendingScores) -> None:
        """The scores computed once across the workers sharing a run directory: the worker holding the run's
        claim computes them and writes them before letting go; another takes them from the file (or takes
        the claim over if its holder died)."""
        deadline = time.monotonic() + ELSEWHERE_S
        while True:
            with self.store.claim(run_id) as mine:
                if mine:
                    if not self._from_file(run_id, record):
                        self._sweep(run_id, record, pending)
                        self.store.flush()  # on disk before the claim is let go
                    return
            if self._from_file(run_id, record) or self._closed or not self.store.holds(run_id, record):
                return
            if time.monotonic() > deadline:
                pending.error = "another worker holds this run's head scores and has not written them"
                return
            time.sleep(0.1)

    def _from_file(self, run_id: str, record: RunRecord) -> bool:
        """Settle the run with the scores another worker wrote to its file, if they are complete there."""
        found = self.store.scores_elsewhere(run_id)
        if found is None:
            return False
        done = dataclasses.replace(record.summary, heads=found.heads, scores_pending=(), timing_ms=found.timing_ms)
        if self.store.settle(run_id, record, done, write=False):
            log.info("run %s: head scores read from the file another worker wrote", run_id)
        return True

    def _lanes(self) -> ThreadPoolExecutor:
        with self._cond:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.lanes, thread_name_prefix="attnscope-scores-lane",
                                                initializer=use_background_threads)
            return self._pool

    def _sweep(self, run_id: str, record: RunRecord, pending: PendingScores) -> None:
        """Every owed layer, ``lanes`` at a time; stopped (closed, or the run left the store) between layers."""
        t0 = time.perf_counter()
        owes_induction = any("induction" in fields for fields in pending.fields.values())
        pairs = InductionPairs.of(record.input_ids) if owes_induction else None  # one sort for every layer
        gone: list[int] = []

        def layer(item: tuple[int, frozenset[str]]) -> list[HeadScore] | None:
            i, fields = item
            with torch.inference_mode():
                if self.pause is not None:
                    self.pause()
                if self._closed:
                    return None
                if not self.store.holds(run_id, record):
                    gone.append(i)
                    return None
                kept = record.attention[i]
                if self.budget is None:
                    return layer_scores(kept, record.input_ids, fields, i, pairs, self.pause)
                with self.budget.reserve(sweep_bytes(kept)):
                    return layer_scores(kept, record.input_ids, fields, i, pairs, self.pause)

        owed = sorted(pending.fields.items())
        found = [layer(item) for item in owed] if self.lanes == 1 else list(self._lanes().map(layer, owed))
        if self._closed:
            pending.error = STOPPED
            return
        if gone:
            log.info("run %s left the store before its head scores were computed", run_id)
            return
        late = {i: scores for (i, _), scores in zip(owed, found, strict=True) if scores is not None}
        t1 = time.perf_counter()
        summary = record.summary
        done = dataclasses.replace(
            summary, heads=merged(summary.heads, late, pending.fields), scores_pending=(),
            timing_ms={**summary.timing_ms, "exact_scores": 1e3 * (t1 - t0),
                       "scores_ready": 1e3 * (t1 - pending.started)})
        if self.store.settle(run_id, record, done):
            log.info("run %s: exact %s in %.0f ms", run_id, " and ".join(pending.names), 1e3 * (t1 - t0))
