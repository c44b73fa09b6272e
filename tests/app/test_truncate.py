"""POST /api/runs with truncate: a text over the model's limit is analysed from its beginning (the
first limit tokens) instead of refused, and the answer says what was kept (issue 27)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from attnscope.app.runjson import RunBody

# the tiny GPT-2 has 256 positions; about 360 tokens of the bundled tokenizer
LONG = "The cat sat on the mat and looked at the dog. " * 30


def test_over_the_limit_is_refused_without_truncate(client: TestClient) -> None:
    r = client.post("/api/runs", json={"text": LONG, "model": "tiny-gpt2"})
    assert r.status_code == 422
    assert "more than this model's limit of 256" in r.json()["message"]


def test_truncate_analyses_the_first_limit_tokens_and_says_so(client: TestClient) -> None:
    r = client.post("/api/runs", json={"text": LONG, "model": "tiny-gpt2", "truncate": True})
    assert r.status_code == 201, r.text
    run = TypeAdapter(RunBody).validate_python(r.json())
    assert run.truncated is not None
    assert 250 <= len(run.tokens) <= 256 and run.truncated.tokens == len(run.tokens)
    assert LONG.startswith(run.text) and run.truncated.chars == len(run.text) < run.truncated.total_chars == len(LONG)
    assert "".join(LONG[t.start:t.end] for t in run.tokens) == run.text  # the spans rebuild the kept beginning
    # the stored run is the beginning, as analysed; only the POST's answer carries `truncated`
    again = client.get(f"/api/runs/{run.run_id}").json()
    assert again["text"] == run.text and again["truncated"] is None


def test_truncate_leaves_a_text_that_fits_alone(client: TestClient) -> None:
    r = client.post("/api/runs", json={"text": "dog bites man", "model": "tiny-gpt2", "truncate": True})
    assert r.status_code == 201
    assert r.json()["truncated"] is None and r.json()["text"] == "dog bites man"


def test_truncate_keeps_an_encoders_closing_special_token(client: TestClient) -> None:
    text = "a dog bites a man " * 200  # about 1,000 WordPiece tokens, over minilm's 512
    r = client.post("/api/runs", json={"text": text, "model": "minilm-l6", "truncate": True})
    assert r.status_code == 201, r.text
    run = r.json()
    assert len(run["tokens"]) <= 512 and run["truncated"]["tokens"] == len(run["tokens"])
    assert run["tokens"][0]["text"] == "[CLS]" and run["tokens"][-1]["text"] == "[SEP]"


def test_truncate_is_for_text_not_a_chat(client: TestClient) -> None:
    r = client.post("/api/runs", json={"messages": [{"role": "user", "content": "hi"}], "truncate": True})
    assert r.status_code == 422
    assert "truncate" in r.json()["message"]
