"""A job thread's torch thread count is its own: threads started after it keep the process's count."""

from __future__ import annotations

import threading

import torch

from attnscope.model.runs.jobthread import BACKGROUND_THREADS, JobThread, in_new_thread, use_background_threads


class _Counts(JobThread[str]):
    """Records the torch thread count each job ran with."""

    def __init__(self) -> None:
        super().__init__("test-counts")
        self.seen: list[int] = []

    def put(self, job: str) -> None:
        with self._cond:
            self._jobs.append(job)
            self._start()

    def _run(self, job: str) -> None:
        self.seen.append(torch.get_num_threads())


def test_a_job_thread_runs_on_its_own_count_and_later_threads_keep_theirs() -> None:
    main = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # a process of 2, whatever the machine: a count a job thread must not hand on
        assert in_new_thread(torch.get_num_threads) == 2
        worker = _Counts()
        worker.put("a")
        assert worker.wait_idle(30)
        assert worker.seen == [BACKGROUND_THREADS]
        assert torch.get_num_threads() == 2  # the caller's own
        assert in_new_thread(torch.get_num_threads) == 2  # a thread started after the job thread: a request's, say
        worker.put("b")
        assert worker.wait_idle(30)
        assert worker.seen == [BACKGROUND_THREADS, BACKGROUND_THREADS]
        worker._stop()
    finally:
        torch.set_num_threads(main)


def test_use_background_threads_on_a_plain_thread() -> None:
    main = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen: list[int] = []

        def lane() -> None:
            use_background_threads()
            seen.append(torch.get_num_threads())
            torch.ones(1 << 16).exp_()  # a parallel region: the count holds after torch ran
            seen.append(torch.get_num_threads())

        thread = threading.Thread(target=lane)
        thread.start()
        thread.join()
        assert seen == [BACKGROUND_THREADS, BACKGROUND_THREADS]
        assert in_new_thread(torch.get_num_threads) == 2
    finally:
        torch.set_num_threads(main)
