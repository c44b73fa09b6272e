"""GET /api/runs/{id}/qk-attribution: the typed result as JSON (the engine's one declaration), and clear refusals."""

from __future__ import annotations

import math

from fastapi.testclient import TestClient

TEXT = "The cat sat on the mat. The cat sat on the mat."


def _run(client: TestClient) -> tuple[str, int]:
    r = client.post("/api/runs", json={"text": TEXT})
    assert r.status_code == 201, r.text[:200]
    body = r.json()
    return body["run_id"], len(body["tokens"])


def test_a_cell_and_a_row(client: TestClient) -> None:
    run_id, n = _run(client)
    q, k = n - 1, n // 2
    r = client.get(f"/api/runs/{run_id}/qk-attribution", params={"layer": 1, "head": 2, "query": q, "key": k})
    assert r.status_code == 200, r.text
    a = r.json()
    c = len(a["components"])
    assert a["keys"] == [k] and len(a["matrix"]) == c and all(len(row) == c for row in a["matrix"])
    assert [x["kind"] for x in a["components"]][:1] == ["embed"]
    total = math.fsum(v for row in a["matrix"] for v in row) + a["position_bias"][0]
    assert abs(total - a["logit"][0]) < 1e-4 * (1 + abs(a["logit"][0]))
    assert abs(a["error"][0]) < 1e-4 * (1 + abs(a["logit"][0]))
    assert 0.0 < a["weight"][0] < 1.0
    row = client.get(f"/api/runs/{run_id}/qk-attribution", params={"layer": 1, "head": 2, "query": q}).json()
    assert row["keys"] == list(range(q + 1)) and row["matrix"] is None
    assert len(row["key_side"]) == q + 1 and len(row["key_side"][0]) == c
    assert abs(row["logit"][k] - a["logit"][0]) < 1e-5 * (1 + abs(a["logit"][0]))


def test_refusals_say_what_is_wrong(client: TestClient) -> None:
    run_id, n = _run(client)
    cases = [({"layer": 1, "head": 0, "query": 2, "key": 5}, "key_not_visible"),
             ({"layer": 7, "head": 0, "query": 2}, "layer_out_of_range"),
             ({"layer": 1, "head": 40, "query": 2}, "head_out_of_range"),
             ({"layer": 1, "head": 0, "query": n}, "position_out_of_range")]
    for params, code in cases:
        r = client.get(f"/api/runs/{run_id}/qk-attribution", params=params)
        assert 400 <= r.status_code < 500, (params, r.status_code)
        body = r.json()
        assert body["code"] == code, body
        assert body["message"]
    r = client.get("/api/runs/nope/qk-attribution", params={"layer": 0, "head": 0, "query": 0})
    assert r.status_code == 404
    r = client.get(f"/api/runs/{run_id}/qk-attribution", params={"layer": "x", "head": 0, "query": 0})
    assert r.status_code == 422
