"""The Learn views' endpoints return the model's own numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from model import lessons
from model.engine import Engine
from model.hooks import run_with_cache
from model.loading import LoadedModel
from model.names import act_name
from model.tokens import ids_tensor, tokenize
from tests.conftest import ARCHS


def analyse(client: TestClient, text: str, **extra: object) -> dict:
    r = client.post("/api/runs", json={"text": text, **extra})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_rebuild_the_attention_output(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    """sum_h sum_j a_hij (v_j^h W_O^h) + bias == hook_attn_out: the per-head values are right."""
    lm = tiny_models[arch]
    ids = ids_tensor(tokenize(lm.tokenizer, "the cat sat on the mat and the dog sat too"))
    acts = run_with_cache(lm, ids)
    for layer in range(lm.info.n_layers):
        v, w_o = lessons._value_vectors(lm, layer, ids)  # (H, n, dh), (H, dh, d)
        pattern = acts[act_name("pattern", layer)]  # (H, n, n)
        mixed = torch.einsum("hqk,hkd->hqd", pattern, v)  # (H, n, dh)
        out = torch.einsum("hqd,hde->qe", mixed, w_o)  # (n, d)
        block = lm.blocks[layer]
        proj = block.get_submodule(lm.spec.out_proj)
        if getattr(proj, "bias", None) is not None:
            out = out + proj.bias
        torch.testing.assert_close(out, acts[act_name("attn_out", layer)], atol=1e-5, rtol=1e-4)


def test_contributions(client: TestClient) -> None:
    run = analyse(client, "I love artificial intelligence")
    body = client.get(f"/api/runs/{run['run_id']}/contributions", params={"layer": 1, "head": 2, "position": 3}).json()
    assert len(body["weights"]) == len(body["value_norms"]) == len(body["contributions"]) == 4
    assert sum(body["weights"]) == pytest.approx(1, abs=1e-5)
    np.testing.assert_allclose(body["contributions"], np.array(body["weights"]) * np.array(body["value_norms"]), rtol=1e-5)
    bad = client.get(f"/api/runs/{run['run_id']}/contributions", params={"layer": 1, "head": 2, "position": 40})
    assert bad.status_code == 422 and "positions 0.." in bad.json()["message"]


def test_embedding_neighbours(client: TestClient, engine: Engine) -> None:
    body = client.get("/api/models/tiny-gpt2/embedding", params={"id": 173, "top": 5}).json()
    lm = engine.model("tiny-gpt2")
    E = lm.model.get_input_embeddings().weight
    assert body["vector"] == pytest.approx(E[173].tolist(), abs=1e-6) and len(body["vector"]) == 32
    cos = [n["cos"] for n in body["neighbours"]]
    assert cos == sorted(cos, reverse=True) and 173 not in [n["id"] for n in body["neighbours"]]
    assert [a["id"] for a in body["adjacent"]] == [172, 174]
    expected = torch.nn.functional.cosine_similarity(E[173], E[174], dim=0).item()
    assert body["adjacent"][1]["cos"] == pytest.approx(expected, abs=1e-5)
    r = client.get("/api/models/tiny-gpt2/embedding", params={"id": 10**6})
    assert r.status_code == 422 and "0..8191" in r.json()["message"]
    assert client.get("/api/models/nope/embedding", params={"id": 1}).status_code == 404


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-gpt_neox", "minilm-l6"])
def test_anatomy_adds_up(client: TestClient, engine: Engine, name: str) -> None:
    body = client.get(f"/api/models/{name}/anatomy").json()
    parts = sum(row["attention"] + row["mlp"] + row["norms"] for row in body["per_layer"])
    parts += body["token_embedding"] + body["position_embedding"] + body["final_norm_and_other"] + body["lm_head"]
    assert parts == body["total"] == engine.model(name).info.n_params
    assert all(row["attention"] > 0 and row["mlp"] > 0 for row in body["per_layer"])
    if name == "tiny-gpt2":
        d = 32
        assert body["per_layer"][0]["attention"] == 4 * d * d + 4 * d  # c_attn (d x 3d + 3d) + c_proj (d x d + d)
        assert body["lm_head_tied"] and body["lm_head"] == 0


def test_positions(client: TestClient) -> None:
    learned = client.get("/api/models/tiny-gpt2/positions", params={"count": 16}).json()
    assert learned["kind"] == "learned" and len(learned["matrix"]) == 16 and len(learned["matrix"][0]) == 32
    assert learned["similarity"][3][3] == pytest.approx(1, abs=1e-5)
    rotary = client.get("/api/models/tiny-llama/positions", params={"count": 16}).json()
    assert rotary["kind"] == "rotary" and len(rotary["inv_freq"]) == rotary["rotary_dims"] // 2 == 4
    assert rotary["inv_freq"][0] == pytest.approx(1.0)


def test_timing(client: TestClient) -> None:
    body = client.post("/api/timing", json={"text": "I love artificial intelligence"}).json()
    n = body["n"]
    assert len(body["serial_cache_ms"]) == len(body["serial_no_cache_ms"]) == len(body["tokens"]) == n
    assert body["parallel_ms"] > 0
    r = client.post("/api/timing", json={"text": " ".join(["w"] * 80)})
    assert r.status_code == 422 and "at most 64" in r.json()["message"]
    assert client.post("/api/timing", json={"text": "hi", "model": "minilm-l6"}).status_code == 422


def test_compare_same_tokens_other_order(client: TestClient) -> None:
    a = analyse(client, "dog bites man")
    b = analyse(client, "man bites dog")
    body = client.get("/api/compare", params={"a": a["run_id"], "b": b["run_id"]}).json()
    by_token = {t["token"].strip(): t for t in body["tokens"]}
    b_texts = [t["text"].strip() for t in b["tokens"]]
    assert by_token["dog"]["b"] == b_texts.index("dog") and by_token["man"]["b"] == 0  # "dog" and " dog" match
    assert all(t["b"] is not None for t in body["tokens"])
    assert all(t["cos"] is None or -1 <= t["cos"] <= 1 for t in body["tokens"])
    enc = analyse(client, "dog bites man", model="minilm-l6")
    assert client.get("/api/compare", params={"a": a["run_id"], "b": enc["run_id"]}).status_code == 422
