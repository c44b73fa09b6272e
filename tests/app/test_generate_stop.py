"""Why generation stopped: end-of-text (stop_at_eos) or length, and going on past end-of-text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import load_model
from tests.support.sse import events as sse_events
from tests.support.tiny import make_engine, save_tiny

EOS = 0  # <|endoftext|> in the bundled tokenizer


@pytest.fixture(scope="module")
def eos_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A tiny GPT-2 whose next token is always end-of-text: the final norm writes a
    constant vector and only the end-of-text row of the (untied) LM head reads it."""
    folder: Path = save_tiny("gpt2", tmp_path_factory.mktemp("eos") / "gpt2", tie_word_embeddings=False)
    lm = load_model("eos-gpt2", str(folder))
    with torch.no_grad():
        lm.model.transformer.ln_f.weight.zero_()
        lm.model.transformer.ln_f.bias.fill_(1.0)
        lm.model.lm_head.weight.zero_()
        lm.model.lm_head.weight[EOS].fill_(1.0)
    assert lm.tokenizer.eos_token_id == EOS
    app = create_app(Settings(models={}, default_model="eos-gpt2"), make_engine({"eos-gpt2": lm}, "eos-gpt2"))
    with TestClient(app) as c:
        yield c


def generate(client: TestClient, **extra: object) -> list[tuple[str, dict]]:
    body = {"text": "dog bites man", "max_new_tokens": 6, "temperature": 0, **extra}
    r = client.post("/api/generate", json=body)
    assert r.status_code == 200, r.text
    return sse_events(r.text)


def test_stops_at_end_of_text_and_says_so(eos_client: TestClient) -> None:
    events = generate(eos_client)
    steps = [d for e, d in events if e == "token"]
    done = events[-1][1]
    assert len(steps) == 1 and steps[0]["id"] == EOS and steps[0]["special"] and steps[0]["text"] == ""
    assert steps[0]["token"] == "<|endoftext|>"
    assert done["stop"] == "eos" and done["n_new"] == 1 and done["text"] == ""


def test_continues_past_end_of_text_when_asked(eos_client: TestClient) -> None:
    events = generate(eos_client, stop_at_eos=False)
    steps = [d for e, d in events if e == "token"]
    done = events[-1][1]
    assert len(steps) == 6 and all(s["id"] == EOS for s in steps)
    assert done["stop"] == "length" and done["n_new"] == 6
    assert "<|endoftext|>" not in done["text"]


def test_recorded_run_marks_end_of_text_and_leaves_it_out_of_the_text(eos_client: TestClient) -> None:
    events = generate(eos_client, record=True, stop_at_eos=False, max_new_tokens=3)
    run = eos_client.get(f"/api/runs/{next(d for e, d in events if e == 'run')['run_id']}").json()
    assert run["text"] == "dog bites man"
    tail = run["tokens"][-3:]
    assert all(t["special"] and t["start"] == t["end"] == len(run["text"]) for t in tail)


def test_length_stop(client: TestClient) -> None:
    events = sse_events(client.post("/api/generate", json={"text": "the cat", "max_new_tokens": 3, "temperature": 0,
                                                           "stop_at_eos": False}).text)
    assert events[-1] == ("done", events[-1][1]) and events[-1][1]["stop"] == "length"


def test_stop_at_eos_must_be_a_boolean(client: TestClient) -> None:
    r = client.post("/api/generate", json={"text": "the cat", "stop_at_eos": "sometimes"})
    assert r.status_code == 422 and "stop_at_eos" in r.json()["message"]


def test_a_greedy_token_carries_the_models_own_probability(client: TestClient) -> None:
    """At temperature 0 `prob` is the sampling distribution's (1: greedy); `model_prob` is the model's, as in `top`."""
    events = sse_events(client.post("/api/generate", json={"text": "the cat", "max_new_tokens": 3, "temperature": 0,
                                                            "top_k": 0, "top_p": 1.0, "seed": 0}).text)
    tokens = [data for name, data in events if name == "token"]
    assert len(tokens) == 3
    for t in tokens:
        assert t["prob"] == 1.0 and t["top"][0]["id"] == t["id"]  # greedy: the model's top choice
        assert t["model_prob"] == pytest.approx(t["top"][0]["prob"], abs=1e-6) and 0 < t["model_prob"] <= 1
