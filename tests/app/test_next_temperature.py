"""GET /api/runs/{id}/next gives a valid distribution at any temperature the route accepts: at a tiny
one the greedy token has probability 1 and the rest 0, ranked as the logits rank them (not ids 0, 1, 2
with null probabilities claiming rank 1)."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

TEXT = "the cat sat on the mat and the dog sat on the log"


@pytest.fixture(scope="module")
def run_id(client: TestClient) -> str:
    r = client.post("/api/runs", json={"text": TEXT})
    assert r.status_code == 201
    return str(r.json()["run_id"])


def next_at(client: TestClient, run_id: str, temperature: float) -> dict:
    r = client.get(f"/api/runs/{run_id}/next", params={"position": 3, "temperature": temperature, "top_k": 5})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("temperature", [1e-39, 1e-300, 5e-324])
def test_a_tiny_temperature_is_greedy_and_valid(client: TestClient, run_id: str, temperature: float) -> None:
    plain, tiny = next_at(client, run_id, 1.0), next_at(client, run_id, temperature)
    assert [t["id"] for t in tiny["top"]] == [t["id"] for t in plain["top"]]  # the logits' order, any temperature
    probs = [t["prob"] for t in tiny["top"]]
    assert probs == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert tiny["entropy"] == 0.0
    actual = tiny["actual_next"]
    assert actual["rank"] == plain["actual_next"]["rank"]
    assert actual["prob"] == (1.0 if actual["rank"] == 1 else 0.0)


@pytest.mark.parametrize("temperature", [1e-6, 0.3, 1.0, 7.5, 100.0])
def test_every_temperature_gives_finite_ordered_probabilities(client: TestClient, run_id: str,
                                                              temperature: float) -> None:
    out = next_at(client, run_id, temperature)
    probs = [t["prob"] for t in out["top"]]
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs) and sum(probs) <= 1.0 + 1e-9
    assert probs == sorted(probs, reverse=True)
    assert math.isfinite(out["entropy"]) and out["entropy"] >= 0.0
    assert out["actual_next"]["rank"] >= 1 and math.isfinite(out["actual_next"]["prob"])
