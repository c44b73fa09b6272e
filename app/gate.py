"""Admission control: a bounded number of requests may wait for one model."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from attnscope.app.errors import Busy


class Gate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
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
