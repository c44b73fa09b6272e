"""Admission control: a bounded number of requests may wait for one model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from attnscope.app.errors import Busy
from attnscope.model.runs.compute import Compute

T = TypeVar("T")


class Gate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.compute: Compute | None = None  # the app's compute thread, while it serves
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def enter(self, model: str) -> Iterator[None]:
        with self._lock:
            if self._counts.get(model, 0) >= self.limit:
                raise Busy(model)
            self._counts[model] = self._counts.get(model, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._counts[model] -= 1

    def run(self, model: str, fn: Callable[[], T]) -> T:
        """``fn()``, admitted as ``enter(model)`` and run on the compute thread (``model.runs.compute`` says why):
        the work of a request that runs a model."""
        with self.enter(model):
            return self.on_compute(fn)

    def on_compute(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the compute thread (inline where the app has none), for work already admitted: a
        generation stream's steps, entered once for the whole stream."""
        compute = self.compute
        return fn() if compute is None else compute.call(fn)
