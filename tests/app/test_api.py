"""Every endpoint and every bad input, through TestClient."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.encoding import decode_sqrt_u8
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import LoadedModel, load_model
from attnscope.model.scores import probes
from attnscope.model.services.engine import Engine
from tests.support.sse import events as sse_events
from tests.support.tiny import make_engine, save_tiny

PROMPT = "I love artificial intelligence"


def analyse(client: TestClient, text: str = PROMPT, **extra: object) -> dict:
    r = client.post("/api/runs", json={"text": text, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def test_models_lists_configured_models(client: TestClient) -> None:
    models = client.get("/api/models").json()["models"]
    by_name = {m["name"]: m for m in models}
    assert set(by_name) == {"tiny-gpt2", "tiny-gpt_neox", "tiny-llama", "tiny-qwen2", "minilm-l6"}
    gpt2 = by_name["tiny-gpt2"]
    assert gpt2["default"] and gpt2["causal"] and gpt2["position_encoding"] == "learned"
    assert gpt2["d_model"] == gpt2["n_heads"] * gpt2["d_head"] == 32
    assert by_name["tiny-llama"]["position_encoding"] == "rotary"
    assert by_name["tiny-qwen2"]["n_kv_heads"] == 2 and by_name["tiny-qwen2"]["n_heads"] == 4
    enc = by_name["minilm-l6"]
    assert not enc["causal"] and not enc["default"] and enc["n_layers"] == 6 and enc["n_heads"] == 12
    assert len(gpt2["induction_scores"]) == 2 and len(gpt2["induction_scores"][0]) == 4


def test_induction_probe_runs_once_per_model_when_first_asked(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    lm = load_model("probed", str(save_tiny("gpt2", tmp_path / "gpt2")))
    calls: list[str] = []
    measure = probes.induction_scores

    def counted(m: LoadedModel) -> list[list[float]]:
        calls.append(m.info.name)
        return measure(m)

    monkeypatch.setattr(probes, "induction_scores", counted)
    engines = [make_engine({"probed": lm, "renamed": lm}, "probed") for _ in range(2)]
    assert calls == []  # building engines runs no forward
    listed = []
    for engine in engines:
        with TestClient(create_app(Settings(models={}, default_model="probed"), engine)) as c:
            listed += c.get("/api/models").json()["models"]
    assert len(calls) == 1  # two engines, two names, one probe
    assert len({json.dumps(m["induction_scores"]) for m in listed}) == 1
    assert listed[0]["induction_scores"] == probes.induction_scores(lm)


def test_run_tokens_predictions_heads(client: TestClient) -> None:
    run = analyse(client, top_k=3)
    tokens = run["tokens"]
    assert "".join(t["text"] for t in tokens) == PROMPT
    for t in tokens:
        assert PROMPT[t["start"]:t["end"]] == t["text"]
    assert [p["position"] for p in run["predictions"]] == list(range(len(tokens)))
    for i, p in enumerate(run["predictions"]):
        assert len(p["top"]) == 3
        probs = [c["prob"] for c in p["top"]]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        if i + 1 < len(tokens):
            assert p["actual_next"]["id"] == tokens[i + 1]["id"] and p["actual_next"]["rank"] >= 1
        else:
            assert p["actual_next"] is None
    assert len(run["heads"]) == run["n_layers"] * run["n_heads"] == 8
    assert {"forward", "total"} <= set(run["timing_ms"])
    again = client.get(f"/api/runs/{run['run_id']}").json()
    assert again["tokens"] == tokens


def test_attention_json_rows_are_causal_and_match_the_model(client: TestClient, engine: Engine) -> None:
    run = analyse(client)
    n = len(run["tokens"])
    body = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 1, "head": 2}).json()
    assert body["n"] == n and body["causal"] and body["layer"] == 1 and body["head"] == 2
    assert [len(r) for r in body["rows"]] == list(range(1, n + 1))
    for row in body["rows"]:
        assert sum(row) == pytest.approx(1.0, abs=1e-4)
    lm = engine.model("tiny-gpt2")
    ids = torch.tensor([t["id"] for t in run["tokens"]])
    with torch.inference_mode():
        ref = lm.model(input_ids=ids[None], output_attentions=True).attentions[1][0, 2]
    for i, row in enumerate(body["rows"]):
        np.testing.assert_allclose(row, ref[i, : i + 1].numpy(), atol=1e-5)


def test_attention_binary_is_one_byte_per_visible_cell(client: TestClient) -> None:
    run = analyse(client)
    n = len(run["tokens"])
    url = f"/api/runs/{run['run_id']}/attention"
    r = client.get(url, params={"layer": 0, "head": 1, "format": "bin"})
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-attn-n"] == str(n) and r.headers["x-attn-encoding"] == "sqrt-u8"
    assert len(r.content) == n * (n + 1) // 2
    rows = client.get(url, params={"layer": 0, "head": 1}).json()["rows"]
    flat = np.concatenate([np.array(row) for row in rows])
    np.testing.assert_allclose(decode_sqrt_u8(r.content), flat, atol=0.0045)
    layer = client.get(url, params={"layer": 0, "format": "bin"})
    assert len(layer.content) == 4 * n * (n + 1) // 2 and layer.headers["x-attn-heads"] == "4"
    head_block = decode_sqrt_u8(layer.content)[n * (n + 1) // 2 : n * (n + 1)]
    np.testing.assert_array_equal(head_block, decode_sqrt_u8(r.content))


def test_attention_f32_is_exact(client: TestClient, engine: Engine) -> None:
    """format=f32: the real weights for a reader (hover), where the 8-bit bytes are for drawing."""
    run = analyse(client)
    n = len(run["tokens"])
    r = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 1, "head": 2, "format": "f32"})
    assert r.headers["x-attn-encoding"] == "f32" and len(r.content) == 4 * n * (n + 1) // 2
    cells = np.frombuffer(r.content, dtype="<f4")
    packed = engine.run(run["run_id"]).packed(1, 2)[0].numpy()
    np.testing.assert_array_equal(cells, packed)
    coarse = decode_sqrt_u8(client.get(f"/api/runs/{run['run_id']}/attention",
                                       params={"layer": 1, "head": 2, "format": "bin"}).content)
    assert np.abs(coarse - cells).max() > 1e-4  # the drawing bytes alone could not give 3 significant digits


def test_attention_all_heads_json(client: TestClient) -> None:
    run = analyse(client)
    body = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 1}).json()
    assert body["n_heads"] == 4 and len(body["heads"]) == 4
    assert all(len(h) == body["n"] for h in body["heads"])


def test_encoder_attention_is_full(client: TestClient) -> None:
    run = analyse(client, "dog bites man", model="minilm-l6")
    assert run["model"] == "minilm-l6" and not run["causal"] and run["predictions"] == []
    assert run["tokens"][0]["text"] == "[CLS]" and run["tokens"][-1]["text"] == "[SEP]"
    body = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 0, "head": 0}).json()
    n = body["n"]
    assert not body["causal"] and all(len(r) == n for r in body["rows"])
    assert body["rows"][0][-1] > 0
    r = client.get(f"/api/runs/{run['run_id']}/logit-lens")
    assert r.status_code == 422 and "LM head" in r.json()["message"]


@pytest.mark.parametrize("model", ["tiny-gpt_neox", "tiny-llama", "tiny-qwen2"])
def test_other_architectures_through_the_api(client: TestClient, model: str) -> None:
    run = analyse(client, "dog bites man", model=model)
    body = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 1, "head": 3}).json()
    assert [len(r) for r in body["rows"]] == list(range(1, len(run["tokens"]) + 1))


def test_residual(client: TestClient) -> None:
    run = analyse(client)
    n = len(run["tokens"])
    body = client.get(f"/api/runs/{run['run_id']}/residual").json()
    assert body["n_layers"] == 2 and len(body["layers"]) == 2 and len(body["embed_norm"]) == n
    for layer in body["layers"]:
        for key in ("resid_norm", "cos_prev", "attn_norm", "mlp_norm"):
            assert len(layer[key]) == n
        assert all(-1.0001 <= c <= 1.0001 for c in layer["cos_prev"])


def test_logit_lens_last_layer_matches_predictions(client: TestClient) -> None:
    run = analyse(client, top_k=3)
    body = client.get(f"/api/runs/{run['run_id']}/logit-lens", params={"top_k": 3}).json()
    assert [layer["layer"] for layer in body["layers"]] == [-1, 0, 1]
    last = body["layers"][-1]["positions"]
    for pos, pred in zip(last, run["predictions"], strict=True):
        assert [c["id"] for c in pos["top"]] == [c["id"] for c in pred["top"]]
        np.testing.assert_allclose([c["prob"] for c in pos["top"]], [c["prob"] for c in pred["top"]], atol=1e-5)


def test_generate_streams_tokens_greedy_is_deterministic(client: TestClient, engine: Engine) -> None:
    req = {"text": "The meaning of life is", "max_new_tokens": 5, "temperature": 0, "top_k": 0, "top_p": 1, "seed": 1}
    first = client.post("/api/generate", json=req)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
    events = sse_events(first.text)
    tokens = [d for e, d in events if e == "token"]
    assert len(tokens) == 5 and events[-1][0] == "done" and events[-1][1]["n_new"] == 5
    assert all(len(t["top"]) == 5 and t["ms"] > 0 for t in tokens)
    second = sse_events(client.post("/api/generate", json=req).text)
    assert [d["id"] for e, d in second if e == "token"] == [t["id"] for t in tokens]
    # greedy with the KV cache = argmax of a fresh forward (no cache) over prompt + tokens so far
    lm = engine.model("tiny-gpt2")
    ids = [t.id for t in engine.tokenize(lm, req["text"])]
    for step in tokens:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()  # (V,)
        fresh = logits.softmax(-1).topk(5)
        assert step["id"] == int(logits.argmax())
        assert [c["id"] for c in step["top"]] == fresh.indices.tolist()
        np.testing.assert_allclose([c["prob"] for c in step["top"]], fresh.values.tolist(), atol=1e-5)
        ids.append(step["id"])


def test_generate_sampling_seeded(client: TestClient) -> None:
    req = {"text": "dog bites", "max_new_tokens": 6, "temperature": 1.2, "top_k": 50, "top_p": 0.9, "seed": 7}
    a = [d["id"] for e, d in sse_events(client.post("/api/generate", json=req).text) if e == "token"]
    b = [d["id"] for e, d in sse_events(client.post("/api/generate", json=req).text) if e == "token"]
    assert a == b and len(a) == 6


# ---- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_blank_text_is_422(client: TestClient, text: str) -> None:
    r = client.post("/api/runs", json={"text": text})
    assert r.status_code == 422 and "empty" in r.json()["message"]


def test_too_many_tokens_names_limit_and_count(client: TestClient) -> None:
    r = client.post("/api/runs", json={"text": " ".join(["word"] * 300)})
    assert r.status_code == 422
    msg = r.json()["message"]
    assert "300 tokens" in msg and "256" in msg


@pytest.mark.parametrize(("params", "expect"), [({"layer": 2, "head": 0}, "layers 0..1"), ({"layer": -1, "head": 0}, "layers 0..1"),
                                           ({"layer": 0, "head": 4}, "heads 0..3"), ({"layer": 0, "head": -3}, "heads 0..3")])
def test_layer_head_out_of_range(client: TestClient, params: dict, expect: str) -> None:
    run = analyse(client)
    r = client.get(f"/api/runs/{run['run_id']}/attention", params=params)
    assert r.status_code == 422 and expect in r.json()["message"]


def test_unknown_run_and_model(client: TestClient) -> None:
    r = client.get("/api/runs/nope/attention", params={"layer": 0})
    assert r.status_code == 404 and "unknown run" in r.json()["message"]
    r = client.post("/api/runs", json={"text": "hi", "model": "/etc/passwd"})
    assert r.status_code == 404 and "tiny-gpt2" in r.json()["message"]


def test_body_over_limit_is_413(client: TestClient) -> None:
    r = client.post("/api/runs", content=json.dumps({"text": "a" * 100_000}), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["message"]


@pytest.mark.parametrize("body", [{"text": 5}, {}, {"text": "hi", "top_k": 0}, {"text": "hi", "top_k": 10**9},
                                  {"text": "hi", "extra": 1}, {"text": ["a"]}])
def test_malformed_bodies_are_422(client: TestClient, body: dict) -> None:
    r = client.post("/api/runs", json=body)
    assert r.status_code == 422 and r.json()["message"]


def test_invalid_json_is_422(client: TestClient) -> None:
    r = client.post("/api/runs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


@pytest.mark.parametrize("text", ["emoji 🐶🧠 ok", "مرحبا بالعالم", "zero\u200bwidth", "ctl\x00\x07\x1b[31m", "<script>x</script>",
                                  "e\u0301 combining", "\U0001F469\u200D\U0001F4BB family"])
def test_any_unicode_round_trips(client: TestClient, text: str) -> None:
    run = analyse(client, text)
    for t in run["tokens"]:
        if not t["partial"]:  # a partial token shows its bytes (‹f0 9f›) instead of a character
            assert t["text"] == text[t["start"]:t["end"]]
    assert "".join(text[t["start"]:t["end"]] for t in run["tokens"]) == text  # each character once


def test_generate_bad_input(client: TestClient) -> None:
    assert client.post("/api/generate", json={"text": " "}).status_code == 422
    assert client.post("/api/generate", json={"text": "hi", "max_new_tokens": 0}).status_code == 422
    r = client.post("/api/generate", json={"text": "word " * 250, "max_new_tokens": 20})
    assert r.status_code == 422 and "limit" in r.json()["message"]
    r = client.post("/api/generate", json={"text": "hi", "model": "minilm-l6"})
    assert r.status_code == 422 and "LM head" in r.json()["message"]
    r = client.post("/api/generate", content=b'{"text": "hi", "temperature": NaN}', headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_openapi_and_docs(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/api/models", "/api/runs", "/api/runs/{run_id}/attention", "/api/runs/{run_id}/residual",
                 "/api/runs/{run_id}/logit-lens", "/api/generate"):
        assert path in spec["paths"]
    assert "sqrt-u8" in json.dumps(spec["paths"]["/api/runs/{run_id}/attention"])
    docs = client.get("/docs")
    assert docs.status_code == 200 and "/vendor/swagger/swagger-ui-bundle.js" in docs.text
    assert client.get("/vendor/swagger/swagger-ui-bundle.js").status_code == 200


def test_security_headers_and_plotly_from_package(client: TestClient) -> None:
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    js = client.get("/vendor/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000 and b"plotly" in js.content[:2000].lower()
    assert "access-control-allow-origin" not in client.get("/api/models", headers={"Origin": "http://evil.example"}).headers


def test_sparsity_endpoint(client: TestClient) -> None:
    run = analyse(client)
    heads = client.get(f"/api/runs/{run['run_id']}/sparsity").json()["heads"]
    assert len(heads) == 8
    for h in heads:
        assert 0 < h["top1"] <= h["top5"] <= 1.0001 and 1 <= h["keys_90"] <= len(run["tokens"])


def test_next_distribution_matches_predictions_and_rescales(client: TestClient) -> None:
    run = analyse(client, top_k=5)
    url = f"/api/runs/{run['run_id']}/next"
    at1 = client.get(url, params={"position": 1, "top_k": 5}).json()
    pred = run["predictions"][1]
    assert [c["id"] for c in at1["top"]] == [c["id"] for c in pred["top"]]
    np.testing.assert_allclose([c["prob"] for c in at1["top"]], [c["prob"] for c in pred["top"]], atol=1e-5)
    assert at1["actual_next"]["rank"] == pred["actual_next"]["rank"]
    cold = client.get(url, params={"position": 1, "top_k": 5, "temperature": 0.25}).json()
    hot = client.get(url, params={"position": 1, "top_k": 5, "temperature": 4}).json()
    assert cold["top"][0]["prob"] > at1["top"][0]["prob"] > hot["top"][0]["prob"]
    assert cold["entropy"] < at1["entropy"] < hot["entropy"]
    last = client.get(url, params={"position": len(run["tokens"]) - 1}).json()
    assert last["actual_next"] is None
    for bad in ({"position": 99}, {"position": -1}, {"position": 0, "temperature": 0}, {"position": 0, "temperature": "nan"}):
        r = client.get(url, params=bad)
        assert r.status_code == 422 and r.json()["message"], bad


def test_pooled_layer_thumbnails(client: TestClient) -> None:
    run = analyse(client, " ".join(["word"] * 40))
    r = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 0, "format": "bin", "size": 16})
    assert r.headers["x-attn-size"] == "16" and len(r.content) == 4 * 16 * 16
    small = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 0, "format": "bin", "size": 64})
    assert "x-attn-size" not in small.headers and len(small.content) == 4 * 40 * 41 // 2


def test_malformed_bodies_get_messages_a_person_reads(client: TestClient) -> None:
    """Validation errors say what is wrong in words: not 'body.8: JSON decode error' or 'heads.0.1: Field required'."""
    def message(r: object) -> str:
        assert r.status_code == 422, r.text  # type: ignore[attr-defined]
        return str(r.json()["message"])  # type: ignore[attr-defined]

    broken = client.post("/api/runs", content=b'{"text": ', headers={"content-type": "application/json"})
    assert message(broken).startswith("the request body is not valid JSON (at character")
    assert "JSON object" in message(client.post("/api/runs", data={"text": "hi"}))
    assert message(client.post("/api/runs", json={"text": " "})).startswith("text is empty")  # not "text: text is"
    run = client.post("/api/runs", json={"text": "the cat sat"}).json()
    short = client.post(f"/api/runs/{run['run_id']}/ablate", json={"heads": [[1]]})
    assert message(short) == "heads[0] is too short: item 1 is missing"
