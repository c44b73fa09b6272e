"""POST /api/generate refuses what it can before its stream starts (a full queue is a 503 with
Retry-After, never a 200 with an empty stream), samples correctly at any temperature the schema
accepts, and ends a stream that fails after it started with an `error` event."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.gate import Gate
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.capture.generation import GenerationSession, SamplingParams, sampling_distribution
from attnscope.model.errors import TooLarge
from attnscope.model.services.engine import Engine
from tests.support.sse import events as sse_events

BODY = {"text": "the cat sat on the mat", "max_new_tokens": 4, "stop_at_eos": False}


@pytest.fixture(scope="module")
def queue1(engine: Engine) -> Iterator[TestClient]:
    """The shared tiny models behind a queue of one request per model."""
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2", queue_length=1), engine)) as c:
        yield c


def gate_of(client: TestClient) -> Gate:
    gate = client.app.state.gate  # type: ignore[attr-defined]
    assert isinstance(gate, Gate)
    return gate


def test_a_full_queue_is_503_with_retry_after_before_the_stream(queue1: TestClient) -> None:
    gate = gate_of(queue1)
    with gate.enter("tiny-gpt2"):  # the one place in the queue is taken
        r = queue1.post("/api/generate", json=BODY)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["message"].startswith("model 'tiny-gpt2' is busy")
        # another model has its own place
        assert queue1.post("/api/generate", json={**BODY, "model": "tiny-llama"}).status_code == 200
    events = sse_events(queue1.post("/api/generate", json=BODY).text)  # the place is free again
    assert events[-1][0] == "done"
    assert gate._counts.get("tiny-gpt2", 0) == 0  # released after the stream


@pytest.mark.parametrize("temperature", [1e-39, 1e-300, 5e-324])
def test_tiny_temperatures_sample_the_greedy_token(client: TestClient, temperature: float) -> None:
    greedy = sse_events(client.post("/api/generate", json={**BODY, "temperature": 0}).text)
    tiny = sse_events(client.post("/api/generate", json={**BODY, "temperature": temperature}).text)
    assert tiny[-1][0] == "done" and tiny[-1][1]["n_new"] == 4
    steps = [d for e, d in tiny if e == "token"]
    assert [s["id"] for s in steps] == [d["id"] for e, d in greedy if e == "token"]
    assert all(math.isfinite(s["prob"]) and s["prob"] == pytest.approx(1.0) for s in steps)


def test_the_sampling_distribution_is_valid_at_any_temperature() -> None:
    logits = torch.tensor([3.0, -1.0, 2.5, float("-inf"), 3.0 - 1e-6])  # (V,)
    for temperature in (5e-324, 1e-39, 1e-6, 0.5, 1.0, 10.0):
        for top_k, top_p in ((0, 1.0), (2, 1.0), (0, 0.5)):
            dist = sampling_distribution(logits, SamplingParams(4, temperature, top_k, top_p, 0))
            assert bool(torch.isfinite(dist).all()) and float(dist.sum()) == pytest.approx(1.0)
            assert float(dist[3]) == 0.0
    ordinary = sampling_distribution(logits, SamplingParams(4, 0.7, 0, 1.0, 0))
    torch.testing.assert_close(ordinary.float(), (logits / 0.7).softmax(-1))


def test_a_failure_after_the_stream_started_ends_it_with_an_error_event(
        queue1: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    step = GenerationSession.step

    def failing(self: GenerationSession) -> object:
        if self.steps == 2:
            raise ValueError("the model's next-token scores at step 2 are not numbers")
        return step(self)

    monkeypatch.setattr(GenerationSession, "step", failing)
    r = queue1.post("/api/generate", json=BODY)
    assert r.status_code == 200
    events = sse_events(r.text)
    assert [e for e, _ in events] == ["token", "token", "error"]
    error = events[-1][1]
    assert error["status"] == 500 and error["n_new"] == 2
    assert error["code"] == "generation_failed" and error["params"] == {"n_new": 2}
    assert error["message"] == "generation failed after 2 tokens: the model's next-token scores at step 2 are not numbers"
    assert gate_of(queue1)._counts.get("tiny-gpt2", 0) == 0  # the failed stream gave its place back


def test_an_engine_error_after_the_stream_keeps_its_own_words_and_status(
        queue1: TestClient, monkeypatch: pytest.MonkeyPatch, engine: Engine) -> None:
    def too_large(*_args: object, **_kwargs: object) -> object:
        raise TooLarge("this run would keep 9 MiB; the run store holds at most 1 MiB (ATTNSCOPE_RUN_STORE_BYTES)")

    monkeypatch.setattr(engine.analyser, "store_generation", too_large)
    events = sse_events(queue1.post("/api/generate", json={**BODY, "record": True}).text)
    assert [e for e, _ in events] == ["token"] * 4 + ["error"]
    assert events[-1][1] == {"code": "too_large", "message": "this run would keep 9 MiB; the run store holds at "
                                        "most 1 MiB (ATTNSCOPE_RUN_STORE_BYTES)", "params": {}, "status": 413, "n_new": 4}


def test_nan_scores_are_an_error_not_a_silent_token(queue1: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GenerationSession, "_forward",
                        lambda self, _ids: torch.full((self.lm.info.vocab_size,), float("nan")))
    events = sse_events(queue1.post("/api/generate", json={**BODY, "temperature": 0.8}).text)
    assert [e for e, _ in events] == ["error"]
    assert "are not numbers (NaN or all -inf)" in events[0][1]["message"]
