"""The JSON of every API response stays what it was: a fixed set of requests on the bundled model,
answered by the app and compared with the answers recorded in tests/data/responses.json (numbers
within a tolerance; ids, times and byte counts that vary by run or machine are masked). A refactor
that changes a field's name, type, nesting or value fails here.

Re-record, after a change that is meant to alter a response: ``ATTNSCOPE_RECORD_RESPONSES=1 pytest
tests/app/test_responses_unchanged.py`` and review the diff of tests/data/responses.json."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import load_model
from attnscope.model.scores import probes
from tests.support.tiny import make_engine

RECORDED = Path(__file__).resolve().parents[1] / "data" / "responses.json"
TEXT = "The cat sat on the mat. The cat sat on the mat."
# values that differ between runs or machines: compared by type only
VOLATILE = {"run_id", "elapsed_ms", "forward_ms", "ms", "seconds", "created", "kept_bytes", "bytes",
            "memory", "rss_bytes", "uptime_s", "timing", "load_s", "took_ms", "analyse_ms", "expires", "timing_ms"}


@pytest.fixture(scope="module")
def api() -> Iterator[TestClient]:
    tiny = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    probes.induction(tiny)
    engine = make_engine({"attnscope-tiny": tiny}, "attnscope-tiny")
    with TestClient(create_app(Settings(models={}, default_model="attnscope-tiny", offer_installed=False),
                               engine)) as c:
        yield c


def answers(api: TestClient) -> dict[str, Any]:
    """Each request's status and JSON body, keyed by a name that says what was asked."""
    out: dict[str, Any] = {}

    def keep(name: str, r: Any) -> Any:
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
        out[name] = {"status": r.status_code, "body": body}
        return body

    keep("models", api.get("/api/models"))
    run = keep("analyse", api.post("/api/runs", json={"text": TEXT}))
    rid = run["run_id"]
    keep("heads", api.get(f"/api/runs/{rid}/heads", params={"wait": 30}))
    keep("run", api.get(f"/api/runs/{rid}"))
    keep("stored", api.get(f"/api/runs/{rid}/stored"))
    keep("attention head", api.get(f"/api/runs/{rid}/attention", params={"layer": 4, "head": 0}))
    keep("attention layer", api.get(f"/api/runs/{rid}/attention", params={"layer": 1}))
    keep("attention tile", api.get(f"/api/runs/{rid}/attention",
                                   params={"layer": 2, "head": 1, "q0": 2, "q1": 8, "k0": 0, "k1": 6}))
    keep("residual", api.get(f"/api/runs/{rid}/residual"))
    keep("logit lens", api.get(f"/api/runs/{rid}/logit-lens"))
    keep("sparsity", api.get(f"/api/runs/{rid}/sparsity"))
    keep("next", api.get(f"/api/runs/{rid}/next", params={"position": 5, "temperature": 0.7}))
    keep("export json", api.get(f"/api/runs/{rid}/export", params={"format": "json"}))
    keep("attribution", api.get(f"/api/runs/{rid}/attribution", params={"position": 8}))
    keep("ablate", api.post(f"/api/runs/{rid}/ablate", json={"heads": [[4, 0]], "mode": "zero", "top_k": 3}))
    keep("ablate mean", api.post(f"/api/runs/{rid}/ablate", json={"heads": [[1, 2], [3, 1]], "mode": "mean"}))
    keep("scan", api.post(f"/api/runs/{rid}/ablate/scan", json={"position": 9, "mode": "zero"}))
    example = keep("patch example", api.get("/api/models/attnscope-tiny/patch-example"))
    keep("patch", api.post("/api/patch", json={k: example[k] for k in ("clean", "corrupted", "answer", "wrong")}))
    keep("contributions", api.get(f"/api/runs/{rid}/contributions", params={"layer": 4, "head": 0, "position": 9}))
    keep("contribution gaps", api.get(f"/api/runs/{rid}/contribution-gaps", params={"position": 9}))
    keep("embedding", api.get("/api/models/attnscope-tiny/embedding", params={"id": 700, "top": 5}))
    keep("anatomy", api.get("/api/models/attnscope-tiny/anatomy"))
    keep("positions", api.get("/api/models/attnscope-tiny/positions"))
    other = keep("analyse b", api.post("/api/runs", json={"text": "The mat sat on the cat. The mat sat on the cat."}))
    keep("compare", api.get("/api/compare", params={"a": rid, "b": other["run_id"]}))
    keep("unknown run", api.get("/api/runs/nope"))
    ids = {rid: "<run id a>", other["run_id"]: "<run id b>"}
    out = json.loads(json.dumps(out), object_hook=lambda d: {k: ids.get(v, v) if isinstance(v, str) else v
                                                              for k, v in d.items()})
    keep("bad layer", api.get(f"/api/runs/{rid}/attention", params={"layer": 99, "head": 0}))
    keep("bad ablate", api.post(f"/api/runs/{rid}/ablate", json={"heads": [[99, 0]]}))
    keep("empty text", api.post("/api/runs", json={"text": ""}))
    return out


def masked(value: Any, key: str = "") -> Any:
    """Volatile values replaced by their type's name; a long list kept whole (its numbers compared)."""
    if key in VOLATILE:
        return f"<{type(value).__name__}>"
    if isinstance(value, dict):
        return {k: masked(v, k) for k, v in value.items()}
    if isinstance(value, str) and len(value) > 200:
        # base64 float32 blobs: their last bits depend on the thread count
        return f"<str of {len(value)}>"
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def differences(got: Any, want: Any, where: str = "") -> Iterator[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            yield f"{where}: keys {sorted(set(got) ^ set(want))} differ"
        for k in set(got) & set(want):
            yield from differences(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            yield f"{where}: {len(got)} items, recorded {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            yield from differences(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        if not (math.isclose(got, want, rel_tol=2e-3, abs_tol=2e-4) or (math.isnan(got) and math.isnan(want))):
            yield f"{where}: {got!r}, recorded {want!r}"
    elif isinstance(want, str) and isinstance(got, str) and where.endswith(".detail"):
        # error messages may quote numbers computed in float: compare their words
        if got.split()[:4] != want.split()[:4]:
            yield f"{where}: {got!r}, recorded {want!r}"
    elif type(got) is not type(want) or got != want:
        yield f"{where}: {got!r}, recorded {want!r}"


def test_every_response_is_as_recorded(api: TestClient) -> None:
    got = masked(answers(api))
    if os.environ.get("ATTNSCOPE_RECORD_RESPONSES") == "1":
        RECORDED.write_text(json.dumps(got, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert set(got) == set(want)
    found = [d for name in want for d in differences(got[name], want[name], name)]
    assert not found, "\n".join(found[:40])
    assert all(want[name]["status"] < 400 for name in want if name not in
               ("unknown run", "bad layer", "bad ablate", "empty text")), "a recorded request failed"
