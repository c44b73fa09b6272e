"""One background thread that runs queued jobs one at a time, started on the first job.

The skeleton shared by the tile prefetch (``model.runs.tile_store.Prefetch``) and the late head
scores (``model.runs.late.ScoreWorker``): a queue and a flag guarded by one condition, a
daemon thread that waits for work, takes one job under the lock and runs it outside it, and
``wait_idle`` for tests, benchmarks and the CLI. Subclasses say what a job does (``_run``),
when one may start (``_ready``), and what closing does with the jobs left (``_stop``).

The thread runs torch with ``BACKGROUND_THREADS`` intra-op threads. Each thread that runs torch's OpenMP
parallel regions with more than one thread keeps a team of its own, and once the process's teams hold more
threads than there are CPUs, libgomp stops spinning for work and wakes its threads through the kernel for
every region, in every team, idle ones' presence enough: on 2 cores a background thread of 2 made every
small op of the caller's thread about 3.5x slower (3,000 exps of 300,000 floats: 0.12 -> 0.41 s), and
the late head scores of SmolLM2 at 1,024 tokens took 1.7-1.9 s in it against 0.51-0.55 s on the caller's
thread alone; with 1 thread the sweep took 0.85-1.1 s and the caller kept its speed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

J = TypeVar("J")
T = TypeVar("T")

BACKGROUND_THREADS = 1  # torch's intra-op threads in a job thread (the module's docstring says why)
_COUNT = threading.Lock()  # one thread at a time changes the count new threads start with


def in_new_thread(task: Callable[[], T], name: str = "attnscope-torch-count") -> T:
    """``task`` run on a thread of its own (one that has not run torch yet), its answer or its exception.

    Also how a script keeps its main thread free of an OpenMP team: a model loaded and an engine built
    (its probe forward) on a short-lived thread leave no team behind once that thread ends."""
    out: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            out.append(task())
        except BaseException as err:  # noqa: BLE001 — handed to the caller, who raises it
            failed.append(err)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def use_threads(count: int) -> None:
    """This thread runs torch on ``count`` intra-op threads; threads that start torch later (requests, the
    caller's) still start with the process's count."""
    with _COUNT:
        starting = in_new_thread(torch.get_num_threads)  # what a thread that starts torch now gets
        torch.set_num_threads(count)
        torch.get_num_threads()  # this thread's count settled now (torch reads the starting count once, lazily)
        in_new_thread(lambda: torch.set_num_threads(starting))  # the starting count back; that thread's own is moot


def use_background_threads() -> None:
    """This thread runs torch on ``BACKGROUND_THREADS``; later threads keep the process's count."""
    use_threads(BACKGROUND_THREADS)


def set_starting_threads(count: int) -> int:
    """The count every thread that starts torch from now on gets (threads that ran torch keep theirs); the
    count they got before."""
    with _COUNT:
        before = in_new_thread(torch.get_num_threads)
        in_new_thread(lambda: torch.set_num_threads(count))
        return before


class JobThread(Generic[J]):
    def __init__(self, name: str, threads: int = BACKGROUND_THREADS) -> None:
        self._name = name
        self._threads = threads  # torch's intra-op threads on this job thread
        self._jobs: deque[J] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._running = False  # a job is being run

    def _start(self) -> None:
        """After jobs were queued (the caller holds ``_cond``): the thread runs, and is told."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _ready(self) -> bool:
        """Whether the next job may start (the caller holds ``_cond``)."""
        return bool(self._jobs)

    def _run(self, job: J) -> None:
        raise NotImplementedError

    def _stop(self) -> tuple[list[J], threading.Thread | None]:
        """Closed: the jobs that will not run and the thread to join (after the job it is running)."""
        with self._cond:
            self._closed = True
            left = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
            return left, self._thread

    def wait_idle(self, timeout: float) -> bool:
        """Until no job is left; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._running, timeout)

    def _work(self) -> None:
        use_threads(self._threads)
        while True:
            with self._cond:
                self._running = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._ready() or self._closed)
                if self._closed:
                    return
                job = self._jobs.popleft()
                self._running = True
            self._run(job)
