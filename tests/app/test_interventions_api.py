"""The causal tools' endpoints: shapes, invariants through HTTP, and every refusal a clear 422."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from attnscope.model.load.tokens import display, tokenize
from attnscope.model.services.engine import Engine
from tests.support.i18n_check import error_key
from tests.support.tiny import ARCHS

TEXT = "The cat sat on the mat. The cat sat on the mat again."
CLEAN = "When Peter and John went to the store, John gave a drink to"
CORRUPTED = "When Peter and John went to the store, Peter gave a drink to"


def _run(client: TestClient, model: str = "tiny-gpt2", text: str = TEXT) -> dict:
    r = client.post("/api/runs", json={"text": text, "model": model})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_difference_equals_log_prob_difference_from_next(client: TestClient, arch: str) -> None:
    run = _run(client, f"tiny-{arch}")
    p = len(run["tokens"]) // 2
    nxt = client.get(f"/api/runs/{run['run_id']}/next", params={"position": p, "temperature": 1}).json()
    t, u = nxt["actual_next"], nxt["top"][0]
    if t["id"] == u["id"]:
        u = nxt["top"][1]
    r = client.get(f"/api/runs/{run['run_id']}/attribution", params={"position": p, "token": t["id"],
                                                                     "token_b": u["id"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token"]["id"] == t["id"] and body["token_b"]["id"] == u["id"]
    assert body["logit"] == pytest.approx(math.log(t["prob"]) - math.log(u["prob"]), abs=1e-4)
    assert math.fsum(term["value"] for term in body["terms"]) + body["error"] == pytest.approx(body["logit"], abs=1e-9)
    assert abs(body["error"]) < 1e-4
    assert body["final_transform"] is None and body["final_steps"] == []


def test_attribution_defaults_to_the_next_token_and_names_it(client: TestClient) -> None:
    run = _run(client)
    tokens = run["tokens"]
    body = client.get(f"/api/runs/{run['run_id']}/attribution", params={"position": 2}).json()
    assert body["token"]["id"] == tokens[3]["id"] and body["token_b"] is None
    heads = [t for t in body["terms"] if t["kind"] == "head"]
    assert len(heads) == run["n_layers"] * run["n_heads"]
    last = client.get(f"/api/runs/{run['run_id']}/attribution", params={"position": len(tokens) - 1}).json()
    assert last["token"]["id"] == run["predictions"][-1]["top"][0]["id"]


def test_attribution_refusals(client: TestClient) -> None:
    run = _run(client)
    url = f"/api/runs/{run['run_id']}/attribution"
    r = client.get(url, params={"position": 999})
    assert r.status_code == 422 and "position 999 is out of range" in r.json()["message"]
    r = client.get(url, params={"position": 0, "token": 10**6})
    assert r.status_code == 422 and "vocabulary" in r.json()["message"]
    enc = _run(client, "minilm-l6", "a short sentence")
    r = client.get(f"/api/runs/{enc['run_id']}/attribution", params={"position": 0, "token": 1})
    assert r.status_code == 422 and "encoder" in r.json()["message"]
    assert client.get("/api/runs/nope/attribution", params={"position": 0}).status_code == 404


def test_ablate_and_scan_agree(client: TestClient) -> None:
    run = _run(client)
    rid, n = run["run_id"], len(run["tokens"])
    none = client.post(f"/api/runs/{rid}/ablate", json={"heads": [], "mode": "zero"})
    assert none.status_code == 200, none.text
    assert [p["kl"] for p in none.json()["positions"]] == [0.0] * n
    one = client.post(f"/api/runs/{rid}/ablate", json={"heads": [[1, 2]], "mode": "mean", "top_k": 3}).json()
    assert one["heads"] == [[1, 2]] and one["mode"] == "mean"
    assert len(one["positions"]) == n and all(len(p["top"]) == 3 for p in one["positions"])
    assert one["positions"][-1]["actual_next"] is None
    p = n - 3
    scan = client.post(f"/api/runs/{rid}/ablate/scan", json={"position": p, "mode": "mean"})
    assert scan.status_code == 200, scan.text
    body = scan.json()
    assert body["token"]["id"] == run["tokens"][p + 1]["id"]
    assert len(body["effects"]) == 2 and len(body["effects"][0]) == 4 and len(body["mlp"]) == 2
    nxt = one["positions"][p]["actual_next"]
    expected = math.log(nxt["prob_after"]) - math.log(nxt["prob_before"])
    assert body["effects"][1][2] == pytest.approx(expected, abs=1e-4)


def test_ablate_refusals(client: TestClient) -> None:
    rid = _run(client)["run_id"]
    r = client.post(f"/api/runs/{rid}/ablate", json={"heads": [[0, 9]], "mode": "zero"})
    assert r.status_code == 422 and "layers 0..1 and heads 0..3" in r.json()["message"]
    r = client.post(f"/api/runs/{rid}/ablate", json={"heads": [[0]], "mode": "zero"})
    assert r.status_code == 422
    r = client.post(f"/api/runs/{rid}/ablate", json={"heads": [], "mode": "half"})
    assert r.status_code == 422 and "mode" in r.json()["message"]
    r = client.post(f"/api/runs/{rid}/ablate/scan", json={"position": -1, "mode": "zero"})
    assert r.status_code == 422 and "out of range" in r.json()["message"]
    r = client.post(f"/api/runs/{rid}/ablate/scan", json={"position": 1, "token": -5})
    assert r.status_code == 422 and "vocabulary" in r.json()["message"]


def test_patch_endpoint(client: TestClient) -> None:
    body = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": " Peter", "wrong": " John"}
    r = client.post("/api/patch", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    n = len(out["clean"]["tokens"])
    assert out["model"] == "tiny-gpt2" and out["position"] == n - 1
    assert out["answer"]["token"] == " Peter" and out["wrong"]["token"] == " John"
    assert len(out["resid"]) == 3 and all(len(row) == n for row in out["resid"])
    assert len(out["attn_out"]) == len(out["mlp_out"]) == 2 and len(out["heads"][0]) == 4
    d = out["first_difference"]
    assert out["resid"][0][d] == pytest.approx(1.0, abs=1e-4)
    assert out["resid"][2][n - 1] == pytest.approx(1.0, abs=1e-4)
    assert out["clean"]["metric"] != out["corrupted"]["metric"]


def test_patch_refusals_name_the_problem(client: TestClient, engine: Engine) -> None:
    tokenizer = engine.model("tiny-gpt2").tokenizer
    count = len(tokenize(tokenizer, CLEAN))
    base = {"clean": CLEAN, "corrupted": CORRUPTED, "answer": " Peter", "wrong": " John"}
    codes = []
    r = client.post("/api/patch", json={**base, "corrupted": CORRUPTED + " her"})
    codes.append(r.json()["code"])
    longer = len(tokenize(tokenizer, CORRUPTED + " her"))
    assert r.status_code == 422 and f"{count} tokens and the corrupted one {longer}" in r.json()["message"]
    r = client.post("/api/patch", json={**base, "answer": " Peter Ann"})
    codes.append(r.json()["code"])
    pieces = [display(t) for t in tokenizer.convert_ids_to_tokens(tokenizer(" Peter Ann", add_special_tokens=False)["input_ids"])]
    assert len(pieces) > 1
    assert r.status_code == 422
    assert f"answer ' Peter Ann' is {len(pieces)} tokens for this model ({pieces})" in r.json()["message"]
    r = client.post("/api/patch", json={**base, "corrupted": CLEAN})
    codes.append(r.json()["code"])
    assert r.status_code == 422 and "same metric" in r.json()["message"]
    r = client.post("/api/patch", json={**base, "wrong": " Peter"})
    codes.append(r.json()["code"])
    assert r.status_code == 422 and "same token" in r.json()["message"]
    keys = {error_key(c) for c in codes}
    # each refusal a reader of the Patch tool can meet reads in Chinese on the Chinese page
    assert keys == {"err.patch_lengths", "err.patch_one", "err.patch_same", "err.patch_same_token"}
    r = client.post("/api/patch", json={**base, "model": "minilm-l6"})
    assert r.status_code == 422 and "encoder" in r.json()["message"]
    r = client.post("/api/patch", json={**base, "model": "nope"})
    assert r.status_code == 404
    r = client.post("/api/patch", json={**base, "position": 99})
    assert r.status_code == 422 and "out of range" in r.json()["message"]
    r = client.post("/api/patch", json={**base, "answer": ""})
    assert r.status_code == 422


def test_openapi_documents_every_intervention(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    assert "get" in paths["/api/runs/{run_id}/attribution"]
    assert "post" in paths["/api/runs/{run_id}/ablate"]
    assert "post" in paths["/api/runs/{run_id}/ablate/scan"]
    assert "post" in paths["/api/patch"]
    schemas = doc["components"]["schemas"]
    for name in ("Attribution", "Term", "AblateRequest", "Ablation", "ScanRequest", "Scan",
                 "PatchRequest", "Patch"):
        assert name in schemas, name

    def ok_schema(path: str, method: str) -> str:
        content = paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        return content["$ref"].rsplit("/", 1)[-1]

    assert ok_schema("/api/runs/{run_id}/attribution", "get") == "Attribution"
    assert ok_schema("/api/runs/{run_id}/ablate", "post") == "Ablation"
    assert ok_schema("/api/runs/{run_id}/ablate/scan", "post") == "Scan"
    assert ok_schema("/api/patch", "post") == "Patch"
