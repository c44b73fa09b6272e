"""Learn §2, "One parallel pass vs serial generation": one forward over n tokens against n serial
steps with and without the KV cache, timed now on this machine.

A timing holds the model for tens of seconds at its largest, so it takes the model's lock a turn at a
time (``Turns``): between two forwards it lets a waiting request in.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.load.models import LoadedModel

HANDOFF_S = 0.05  # how long the model's lock is left free for a request waiting on it...
HANDOFF_AFTER_S = 0.2  # ...each time a timing has held it this long


@dataclass(frozen=True, slots=True)
class Timings:
    """Milliseconds: per-step medians over the repeats, and every repeat's total."""

    n: int
    repeats: int
    parallel_ms: Annotated[float, Field(description="one forward over all n tokens at once (median of the repeats)")]
    serial_cache_ms: Annotated[list[float], Field(description=(
        "step t: one token in, keys/values of earlier ones from the KV cache (median)"))]
    serial_no_cache_ms: Annotated[list[float], Field(description="step t: the whole prefix 0..t recomputed (median)")]
    parallel_runs_ms: Annotated[list[float], Field(description="every repeat's parallel forward")]
    cache_totals_ms: Annotated[list[float], Field(description="every repeat's total over n steps with the KV cache")]
    no_cache_totals_ms: Annotated[list[float], Field(description="every repeat's total over n steps without it")]


def let_others_in(lock: threading.Lock, patience: float) -> None:
    """Right after releasing ``lock``: wait (at most ``patience`` seconds) for a thread blocked on it
    to take it. A plain release-and-acquire would usually win the lock straight back, and a request
    waiting for the model would wait for the whole timing."""
    deadline = time.monotonic() + patience
    while not lock.locked() and time.monotonic() < deadline:
        time.sleep(0.001)


class Turns:
    """A model's lock held across many forwards, given up between two of them for a request that
    waits, once it has been held HANDOFF_AFTER_S: no single forward is interrupted, and no request
    waits longer than that plus one forward."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.since = 0.0

    def __enter__(self) -> Turns:
        self.lock.acquire()
        self.since = time.perf_counter()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.lock.release()

    def between(self) -> None:
        """Call between two forwards (outside what is timed)."""
        if time.perf_counter() - self.since < HANDOFF_AFTER_S:
            return
        self.lock.release()
        try:
            let_others_in(self.lock, HANDOFF_S)
        finally:
            self.lock.acquire()
            self.since = time.perf_counter()


HANDOFF_COST = 1 + HANDOFF_S / HANDOFF_AFTER_S  # the lock left free HANDOFF_S in every HANDOFF_AFTER_S held


@dataclass(frozen=True, slots=True)
class Cost:
    """What a ``parallel_vs_serial`` of n tokens will take, estimated from two probe forwards."""

    seconds: float
    forwards: int


def cost(lm: LoadedModel, ids: torch.Tensor, repeats: int) -> Cost:
    """Estimate a timing before running it: one forward of 1 token (t1, the best of two) and one of all n
    (tn), then per repeat (and the warm-up) the parallel forward tn, n cached steps (about t1 each) and n
    uncached prefixes (from t1 to tn, linearly): (repeats + 1) x (tn + n t1 + n (t1 + tn) / 2), with the
    lock's hand-overs. Takes the model's lock for the probes (a few forwards' time)."""
    n = ids.shape[0]
    ids = ids.to(lm.input_device)
    with lm.lock, torch.inference_mode():
        one = []
        for _ in range(2):
            t0 = time.perf_counter()
            lm.model(input_ids=ids[None, :1], use_cache=False)
            one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        lm.model(input_ids=ids[None], use_cache=False)
        whole = time.perf_counter() - t0
    t1 = min(one)
    per_repeat = whole + n * t1 + n * (t1 + whole) / 2
    return Cost(seconds=(repeats + 1) * per_repeat * HANDOFF_COST, forwards=(repeats + 1) * (2 * n + 1))


def parallel_vs_serial(lm: LoadedModel, ids: torch.Tensor, repeats: int = 5) -> Timings:
    """Time one forward over n tokens, n serial steps with the KV cache, and n serial steps
    that recompute the prefix, ``repeats`` times each, interleaved (so that a slow moment of a
    shared machine hits all three alike) after one untimed warm-up of each.

    Takes the model's lock itself and lets a waiting request in between two forwards every
    HANDOFF_AFTER_S (``Turns``): at its largest (64 tokens, 9 repeats) a timing runs for tens of
    seconds on a loaded machine, but holds the model for a fraction of a second at a time. Each
    step is timed on its own, so what runs in between is not counted. The caller must not hold
    the lock."""
    n = ids.shape[0]
    model = lm.model
    ids = ids.to(lm.input_device)
    turns = Turns(lm.lock)

    def timed(fn: Callable[[], object]) -> float:
        turns.between()
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)

    def cached() -> list[float]:
        cache, steps = None, []
        for t in range(n):
            turns.between()  # the KV cache waits meanwhile: it is this request's own
            t0 = time.perf_counter()
            out = model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(1e3 * (time.perf_counter() - t0))
        return steps

    def prefix(t: int) -> Callable[[], object]:
        return lambda: model(input_ids=ids[None, : t + 1], use_cache=False)

    def uncached() -> list[float]:
        return [timed(prefix(t)) for t in range(n)]

    def parallel() -> object:
        return model(input_ids=ids[None], use_cache=False)

    parallel_runs: list[float] = []
    cache_runs: list[list[float]] = []
    no_cache_runs: list[list[float]] = []
    with turns, torch.inference_mode():
        timed(parallel), cached(), uncached()  # warm-up, not timed
        for _ in range(repeats):
            parallel_runs.append(timed(parallel))
            cache_runs.append(cached())
            no_cache_runs.append(uncached())

    def per_step(runs: list[list[float]]) -> list[float]:
        return [statistics.median(run[t] for run in runs) for t in range(n)]

    return Timings(n=n, repeats=repeats, parallel_ms=statistics.median(parallel_runs),
                   serial_cache_ms=per_step(cache_runs), serial_no_cache_ms=per_step(no_cache_runs),
                   parallel_runs_ms=parallel_runs, cache_totals_ms=[sum(r) for r in cache_runs],
                   no_cache_totals_ms=[sum(r) for r in no_cache_runs])
