"""Recorded generation: the rows captured step by step equal one fresh forward."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.generation import GenerationSession, SamplingParams
from attnscope.model.capture.names import act_name
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.services.engine import Engine
from tests.support.sse import events as sse_events
from tests.support.tiny import ARCHS


@pytest.mark.parametrize("arch", ARCHS)
def test_recorded_rows_equal_a_fresh_forward(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    prompt = ids_tensor(tokenize(lm.tokenizer, "The cat sat on the mat and"))
    session = GenerationSession(lm, prompt, SamplingParams(max_new_tokens=6, temperature=1.0, top_k=0, top_p=1.0, seed=3),
                                record=True)
    while not session.done:
        session.step()
    recorded = session.finish_recording()
    full = session.ids
    fresh = run_with_cache(lm, full)
    assert act_name("pattern", 0) not in recorded  # a recording keeps Q and K, never n x n patterns
    assert recorded.layers[0].q.shape == (lm.info.n_heads, len(full), lm.info.d_head)
    for name, expected in fresh.items():
        if name == "logits":
            continue  # a recording reads the last position's logits only; predictions come from the residual
        got = recorded.layers[int(name.split(".")[1])].dense() if name.endswith("hook_pattern") else recorded[name]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=name)


def test_recorded_generation_becomes_a_run(client: TestClient, engine: Engine) -> None:
    body = {"text": "dog bites man", "max_new_tokens": 5, "temperature": 0, "record": True, "watch_layer": 1, "watch_head": 2}
    events = sse_events(client.post("/api/generate", json=body).text)
    kinds = [e for e, _ in events]
    assert kinds[-2:] == ["run", "done"] and kinds.count("token") == 5
    tokens = [d for e, d in events if e == "token"]
    n_prompt = len(tokenize(engine.model("tiny-gpt2").tokenizer, "dog bites man"))
    streamed = [row for d in tokens for row in d["rows"]] + next(d for e, d in events if e == "rows")["rows"]
    assert [len(r) for r in streamed] == list(range(1, n_prompt + 6))  # the heatmap fills row by row
    run_id = next(d for e, d in events if e == "run")["run_id"]
    run = client.get(f"/api/runs/{run_id}").json()
    assert len(run["tokens"]) == n_prompt + 5 and len(run["predictions"]) == n_prompt + 5
    rows = client.get(f"/api/runs/{run_id}/attention", params={"layer": 1, "head": 2}).json()["rows"]
    for got, want in zip(rows, streamed, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    ids = torch.tensor([t["id"] for t in run["tokens"]])
    lm = engine.model("tiny-gpt2")
    with torch.inference_mode():
        ref = lm.model(input_ids=ids[None], output_attentions=True).attentions[1][0, 2]
    for i, row in enumerate(rows):
        assert row == pytest.approx(ref[i, : i + 1].tolist(), abs=1e-4)


def test_watch_needs_record(client: TestClient) -> None:
    r = client.post("/api/generate", json={"text": "hi", "watch_layer": 0})
    assert r.status_code == 422 and "record" in r.json()["message"]
    r = client.post("/api/generate", json={"text": "hi", "record": True, "watch_layer": 9, "watch_head": 0})
    assert r.status_code == 422 and "out of range" in r.json()["message"]
