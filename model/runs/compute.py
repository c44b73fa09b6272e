"""A server's model work on one thread: the one thread whose torch runs on more than one intra-op thread.

libgomp (torch's OpenMP on Linux) keeps a team of threads for every thread that ran a parallel region with
more than one thread, and keeps it until that thread exits (asking for fewer threads later does not free it).
Once the teams' threads outnumber the CPUs it stops spinning for work and wakes its threads through the kernel
for every parallel region, in every team: ``model.runs.jobthread`` has the measurements. A server answers on
many request threads (AnyIO's pool), so a forward run on whichever of them took the request left a team on
each; with two teams on two cores a bare forward of SmolLM2 at 1,024 tokens went from 1.27-1.32 s to
1.54-1.76 s, and an analyse through ``POST /api/runs`` took 2.4-3.3 s against 1.6 s on an idle main thread.

So a server runs its model work through :class:`Compute`: one thread, the process's torch thread count, one
call at a time in the order they came (the models' locks serialise their forwards anyway); while it serves,
:func:`serving_threads` makes every other thread that starts torch run it on one thread (tiles, views, the
background work), so no second team forms. A library user's own thread (``attnscope.Scope``, a notebook) is
left as it is.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch

from attnscope.model.runs.jobthread import JobThread, set_starting_threads

log = logging.getLogger(__name__)

T = TypeVar("T")

_SERVING = threading.Lock()
_servers = 0  # servers inside serving_threads (guarded by _SERVING)
_starting_before = 0  # the starting count the first of them found (guarded by _SERVING)


@dataclass(frozen=True)
class _Call:
    run: Callable[[], Any]
    done: Future[Any]


class Compute(JobThread[_Call]):
    """One thread running calls on ``threads`` torch threads (default: the creating thread's), in order."""

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads if threads is not None else torch.get_num_threads()
        super().__init__("attnscope-compute", threads=self.threads)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the compute thread, its answer or its exception here. On the compute thread itself, or
        once closed, it runs here."""
        run = contextvars.copy_context().run  # the caller's context variables go with the call
        done: Future[Any] = Future()
        with self._cond:
            if self._closed or threading.current_thread() is self._thread:
                inline = True
            else:
                inline = False
                self._jobs.append(_Call(lambda: run(fn), done))
                self._start()
        if inline:
            return fn()
        return cast("T", done.result())

    def pending(self) -> int:
        """Calls waiting (not the one running)."""
        with self._cond:
            return len(self._jobs)

    def _run(self, job: _Call) -> None:
        if not job.done.set_running_or_notify_cancel():
            return
        try:
            job.done.set_result(job.run())
        except BaseException as exc:  # noqa: BLE001 — handed to the caller, who raises it
            job.done.set_exception(exc)

    def close(self) -> None:
        """The call running finishes first; calls still waiting run here, on the closing thread (a server
        stops after its requests, so there are seldom any)."""
        left, thread = self._stop()
        for job in left:
            self._run(job)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)


@contextmanager
def serving_threads() -> Iterator[None]:
    """While a server serves: every thread that starts torch gets one intra-op thread (a :class:`Compute`
    made before keeps its count); the count they got before comes back when the last server stops."""
    global _servers, _starting_before
    with _SERVING:
        before = set_starting_threads(1)  # each app sets it: a count set meanwhile is put right
        if _servers == 0:
            _starting_before = before
            log.info("serving: model work on one compute thread, other threads run torch on 1 thread")
        _servers += 1
    try:
        yield
    finally:
        with _SERVING:
            _servers -= 1
            if _servers == 0:
                set_starting_threads(_starting_before)
