"""The server's compute thread: calls run there, in order, on its torch thread count; while serving, every
other thread that starts torch runs it on one thread; closing runs what was left and keeps working inline."""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch

from attnscope.model.runs.compute import Compute, serving_threads
from attnscope.model.runs.jobthread import in_new_thread, set_starting_threads

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.fixture
def two_threads() -> object:
    main, starting = torch.get_num_threads(), in_new_thread(torch.get_num_threads)
    torch.set_num_threads(2)  # this thread's count, whatever the machine (it sets the starting count too)
    set_starting_threads(2)
    yield
    torch.set_num_threads(main)
    set_starting_threads(starting)  # an app serving through the session keeps its starting count of 1


@pytest.mark.usefixtures("two_threads")
def test_calls_run_on_the_compute_thread_with_its_count_in_order() -> None:
    compute = Compute(threads=2)
    try:
        seen: list[tuple[str, int, int]] = []

        def work(i: int) -> int:
            seen.append((threading.current_thread().name, torch.get_num_threads(), i))
            return i * i

        answers: list[int] = []
        callers = [threading.Thread(target=lambda i=i: answers.append(compute.call(lambda: work(i))))
                   for i in range(6)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert sorted(answers) == [i * i for i in range(6)]
        assert {(name, count) for name, count, _ in seen} == {("attnscope-compute", 2)}
        assert compute.call(lambda: torch.ones(1 << 16).exp().sum().item()) == pytest.approx((1 << 16) * 2.718281828)
    finally:
        compute.close()


@pytest.mark.usefixtures("two_threads")
def test_an_exception_reaches_the_caller_and_context_variables_go_with_the_call() -> None:
    compute = Compute(threads=1)
    try:
        def fail() -> None:
            raise KeyError("no such run")

        with pytest.raises(KeyError, match="no such run"):
            compute.call(fail)
        token = WHO.set("request 7")
        try:
            assert compute.call(WHO.get) == "request 7"
        finally:
            WHO.reset(token)
        # a call made from the compute thread itself runs there at once (no wait on itself)
        assert compute.call(lambda: compute.call(lambda: threading.current_thread().name)) == "attnscope-compute"
    finally:
        compute.close()
    assert compute.call(lambda: threading.current_thread().name) == threading.current_thread().name  # closed


@pytest.mark.usefixtures("two_threads")
def test_closing_runs_the_calls_left_and_waits_for_the_running_one() -> None:
    compute = Compute(threads=1)
    inside, go = threading.Event(), threading.Event()
    answers: list[str] = []

    def slow() -> str:
        inside.set()
        go.wait(timeout=30)
        return "first"

    first = threading.Thread(target=lambda: answers.append(compute.call(slow)))
    first.start()
    assert inside.wait(timeout=30)
    second = threading.Thread(target=lambda: answers.append(compute.call(lambda: "second")))
    second.start()
    while compute.pending() == 0:  # the second call is queued behind the first
        threading.Event().wait(0.005)
    closing = threading.Thread(target=compute.close)
    closing.start()
    go.set()
    for thread in (first, second, closing):
        thread.join(timeout=30)
    assert sorted(answers) == ["first", "second"]


@pytest.mark.usefixtures("two_threads")
def test_while_serving_other_threads_run_torch_on_one_thread_and_the_count_comes_back() -> None:
    compute = Compute()
    assert compute.threads == 2
    try:
        with serving_threads():
            assert in_new_thread(torch.get_num_threads) == 1  # a request thread, the prefetch, a survey
            assert compute.call(torch.get_num_threads) == 2  # the model work keeps the process's count
            with serving_threads():  # a second app in the same process
                assert in_new_thread(torch.get_num_threads) == 1
            assert in_new_thread(torch.get_num_threads) == 1  # until the last one stops
            assert torch.get_num_threads() == 2  # a thread that ran torch before keeps its own
        assert in_new_thread(torch.get_num_threads) in (1, 2)  # 2 unless an app serves through the session
    finally:
        compute.close()
