"""Every error body carries a stable ``code``, its English ``message`` and the ``params`` that say it
in another language (``{"code", "message", "params", "detail"}``): each kind of refusal, provoked over
HTTP, has its code and params; every code is listed in the OpenAPI document and has its text in both
catalogues (``err.<code>``), which names no value its params lack."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from attnscope.app.error_codes import CODES, HTTP_CODES, PARAMS
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import ENGINE_CODES
from attnscope.model.errors import PARAMS as ENGINE_PARAMS
from attnscope.model.load.models import LoadedModel
from attnscope.model.services.engine import Engine
from tests.support.i18n_check import error_key, placeholders
from tests.support.tiny import make_engine

JSON = {"content-type": "application/json"}


def coded(r: httpx.Response, status: int, code: str, **params: object) -> dict[str, Any]:
    """The error body of ``r``: its status, its code, the params its code carries (``params`` among them,
    with these values), and a catalogue text in both languages that names only what it carries."""
    assert r.status_code == status, r.text[:300]
    body: dict[str, Any] = r.json()
    assert {"code", "message", "params", "detail"} <= set(body), body
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"], body
    assert isinstance(body["params"], dict), body
    assert set(PARAMS[code]) <= set(body["params"]), (code, body["params"])
    for name, value in params.items():
        assert body["params"][name] == value, (name, body["params"])
    assert placeholders(f"err.{code}") <= set(body["params"]) | {"message"}, code
    return body


@pytest.fixture(scope="module")
def raw(engine: Engine) -> Iterator[TestClient]:
    """The shared engine's app, showing a server error as its 500 instead of raising it."""
    app = create_app(Settings(models={}, default_model="tiny-gpt2", max_body_bytes=64 * 1024, queue_length=1), engine)

    @app.get("/api/test-boom", include_in_schema=False)
    def boom() -> None:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def run_id(raw: TestClient) -> str:
    return str(raw.post("/api/runs", json={"text": "a short prompt for the error codes"}).json()["run_id"])


# ---- the HTTP door's own refusals ------------------------------------------------------------

def test_unknown_route_and_method(raw: TestClient) -> None:
    coded(raw.get("/api/no-such-route"), 404, "not_found", path="/api/no-such-route")
    coded(raw.delete("/api/runs"), 405, "method_not_allowed", method="DELETE")


def test_a_body_that_does_not_fit_the_schema(raw: TestClient) -> None:
    body = coded(raw.post("/api/runs", json={"text": "hi", "top_k": "5x"}), 422, "invalid_request", field="top_k",
                 type="int_type", count=1)
    assert body["params"]["problem"] == body["message"] == 'top_k: must be an integer (without quotes), not the string "5x"'
    assert isinstance(body["detail"], list) and body["detail"][0]["loc"] == ["body", "top_k"]  # as before codes
    body = coded(raw.post("/api/runs", content=b"{", headers=JSON), 422, "invalid_request", type="json_invalid")
    assert body["message"].startswith("the request body is not valid JSON")
    coded(raw.get("/api/runs/x/attention?layer=zero"), 422, "invalid_request", field="layer")


def test_an_empty_prompt_has_its_own_code(raw: TestClient) -> None:
    body = coded(raw.post("/api/runs", json={"text": " \n"}), 422, "empty", field="text")
    assert body["message"] == "text is empty or only whitespace; type a prompt to analyse"
    # beside another error it is one problem among others
    coded(raw.post("/api/runs", json={"text": " ", "top_k": "x"}), 422, "invalid_request", count=2)


def test_unreadable_bodies(raw: TestClient, engine: Engine) -> None:
    coded(raw.post("/api/runs", content=b'{"text": "caf\xe9"}', headers=JSON), 400, "body_not_utf8",
          byte="0xe9", offset=13)
    coded(raw.post("/api/runs", content=b'{"text": "x"}', headers={"content-type": "application/json; charset=latin-1"}),
          415, "unsupported_media_type", charset="latin-1")
    big = json.dumps({"text": "a" * 70_000}).encode()
    sized = coded(raw.post("/api/runs", content=big, headers=JSON), 413, "body_too_large", max_bytes=64 * 1024)
    chunked = raw.post("/api/runs", content=iter([big[:40_000], big[40_000:]]), headers=JSON)
    assert coded(chunked, 413, "body_too_large") == sized
    deep = create_app(Settings(models={}, default_model="tiny-gpt2", max_body_bytes=1 << 20), engine)
    with TestClient(deep, raise_server_exceptions=False) as c:
        depth = 50_000
        coded(c.post("/api/runs", content=b'{"text": ' + b"[" * depth + b"]" * depth + b"}", headers=JSON), 400,
              "json_too_deep")


def test_a_host_this_server_does_not_answer_to(raw: TestClient) -> None:
    body = coded(raw.get("/api/health", headers={"host": "evil.example:8000"}), 400, "host_not_allowed",
                 host="evil.example:8000")
    assert "testserver" in body["params"]["allowed"] and "localhost" in body["params"]["allowed"]


def test_a_refused_cors_preflight(engine: Engine) -> None:
    app = create_app(Settings(models={}, default_model="tiny-gpt2", cors_origins=["http://ok.example"]), engine)
    with TestClient(app) as c:
        preflight = {"access-control-request-method": "POST"}
        ok = c.options("/api/runs", headers={**preflight, "origin": "http://ok.example"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ok.example"
        coded(c.options("/api/runs", headers={**preflight, "origin": "http://evil.example"}), 400, "cors_refused",
              reason="origin")


def test_a_model_not_loaded_yet(engine: Engine) -> None:
    app = create_app(Settings(models={}, default_model="tiny-gpt2"), None)  # no lifespan: nothing loads
    coded(TestClient(app).get("/api/runs/x/heads"), 503, "loading")


def test_a_busy_model(raw: TestClient) -> None:
    with raw.app.state.gate.enter("tiny-gpt2"):  # type: ignore[attr-defined]
        r = raw.post("/api/runs", json={"text": "hi"})
    coded(r, 503, "busy", model="tiny-gpt2", retry_after=1)
    assert r.headers["retry-after"] == "1"


def test_a_bug_is_a_500_in_the_same_shape(raw: TestClient) -> None:
    body = coded(raw.get("/api/test-boom"), 500, "internal_error", error="RuntimeError")
    assert "a bug" not in body["message"]  # the log has it, not the answer


# ---- the engine's refusals -------------------------------------------------------------------

def test_unknown_model_and_run(raw: TestClient) -> None:
    body = coded(raw.post("/api/runs", json={"text": "hi", "model": "nope"}), 404, "unknown_model", model="nope")
    assert "tiny-gpt2" in body["params"]["available"]
    coded(raw.get("/api/runs/not-a-run/heads"), 404, "run_not_found", run_id="not-a-run")


def test_a_run_too_big_to_keep_and_an_expired_run(tiny_models: dict[str, LoadedModel]) -> None:
    small = make_engine({lm.info.name: lm for lm in tiny_models.values()}, "tiny-gpt2", store_bytes=1 << 20)
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2"), small)) as c:
        first = c.post("/api/runs", json={"text": "short"}).json()["run_id"]
        body = coded(c.post("/api/runs", json={"text": " ".join(["word"] * 240)}), 413, "run_too_big", cap="1 MiB")
        assert body["params"]["tokens"] == 240 and body["params"]["keep"].endswith(" MiB")
        for _ in range(3):  # ~0.6 MiB each: the older go
            c.post("/api/runs", json={"text": " ".join(["word"] * 120)})
        coded(c.get(f"/api/runs/{first}/heads"), 404, "run_expired", run_id=first)


def test_ranges_over_a_run(raw: TestClient, run_id: str) -> None:
    n = len(raw.get(f"/api/runs/{run_id}").json()["tokens"])
    coded(raw.get(f"/api/runs/{run_id}/contribution-gaps?position={n + 5}"), 422, "position_out_of_range",
          position=n + 5, max=n - 1)
    coded(raw.get(f"/api/runs/{run_id}/attention?layer=0&format=f32&q0=3&q1=2"), 422, "range_invalid", lo=3, hi=2)


def test_the_patch_tools_refusals(raw: TestClient) -> None:
    base = {"clean": "When Peter and John went to the store, John gave a drink to",
            "corrupted": "When Peter and John went to the store, Peter gave a drink to", "answer": " Peter",
            "wrong": " John"}
    body = coded(raw.post("/api/patch", json={**base, "corrupted": base["corrupted"] + " her"}), 422, "patch_lengths")
    assert body["params"]["corrupted"] == body["params"]["clean"] + 1
    body = coded(raw.post("/api/patch", json={**base, "answer": " Peter Ann"}), 422, "patch_one", field="answer",
                 text=" Peter Ann")
    assert len(body["params"]["pieces"]) == body["params"]["tokens"] > 1
    coded(raw.post("/api/patch", json={**base, "corrupted": base["clean"]}), 422, "patch_same")
    coded(raw.post("/api/patch", json={**base, "wrong": " Peter"}), 422, "patch_same_token", answer=" Peter")


def test_a_token_id_outside_the_vocabulary(raw: TestClient) -> None:
    vocab = next(m for m in raw.get("/api/models").json()["models"] if m["name"] == "tiny-gpt2")["vocab_size"]
    coded(raw.get(f"/api/models/tiny-gpt2/embedding?id={vocab}"), 422, "bad_id", token_id=vocab, max=vocab - 1)


def test_a_prompt_over_the_models_limit(tiny_models: dict[str, LoadedModel]) -> None:
    short = make_engine({lm.info.name: lm for lm in tiny_models.values()}, "tiny-gpt2", max_tokens=64)
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2"), short)) as c:
        body = coded(c.post("/api/runs", json={"text": "word " * 100}), 422, "too_long", limit=64)
        assert body["params"]["tokens"] > 64


# ---- the list of codes -----------------------------------------------------------------------

def test_every_code_is_in_the_openapi_document(raw: TestClient) -> None:
    schema = raw.get("/openapi.json").json()["components"]["schemas"]["ErrorOut"]
    assert schema["properties"]["code"]["enum"] == list(CODES)
    assert set(schema["required"]) == {"code", "message", "params", "detail"}
    assert len(set(CODES)) == len(CODES) == len(ENGINE_CODES) + len(HTTP_CODES)


def test_every_code_has_its_params_and_its_text_in_both_catalogues() -> None:
    assert set(ENGINE_PARAMS) == set(ENGINE_CODES) and set(PARAMS) == set(CODES)
    for code in CODES:
        key = error_key(code)
        assert key == f"err.{code}", code  # the browser says it in English and in Chinese
        assert placeholders(key) <= set(PARAMS[code]) | {"message"}, code
    assert error_key("network") == "err.network"  # said when no answer came (static/js/api.js)
    # a standalone HTML file's answers to what it did not save (static/js/embed/offline.js)
    assert error_key("offline_file") == "err.offline_file"
    assert placeholders("err.offline_file") <= {"request"}  # the request itself is not shown to a reader
    for code in ("run_link_unknown", "run_link_unknown_default"):  # a link's run this server does not keep
        assert error_key(code) == f"err.{code}" and placeholders(f"err.{code}") == {"run_id"}
    assert error_key("offline_head") == "err.offline_head"
    assert placeholders("err.offline_head") == {"kept", "layer", "head"}
