"""Every JSON endpoint sends exactly what its response model says, and nothing grows a stored
run outside the store's byte count.

Some routes serialise typed results straight to bytes (a run, the logit lens: too large to
build and validate pydantic objects for); this is where their JSON meets the schema. Each
body is validated against the model the OpenAPI document names, then dumped again: the two
must be equal, so a missing, extra or mistyped field fails.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import operator
import pkgutil
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, TypeAdapter

import attnscope.model
from attnscope.app import intervention_schemas, runjson, schemas
from attnscope.app.runjson import RunBody
from attnscope.model.results import LogitLens
from attnscope.model.services.engine import Engine

PROMPT = "the cat sat on the mat and the cat sat"
Request = tuple[str, str, dict[str, Any] | None]  # method, URL (may hold {run}, {other}), JSON body


@pytest.fixture(scope="module")
def runs(client: TestClient) -> dict[str, str]:
    ids = {}
    for key, text, model in (("run", PROMPT, "tiny-gpt2"), ("other", "the mat sat on the cat", "tiny-gpt2"),
                             ("enc", PROMPT, "minilm-l6")):
        r = client.post("/api/runs", json={"text": text, "model": model})
        assert r.status_code == 201, r.text
        ids[key] = r.json()["run_id"]
    # a finished survey of a two-document corpus
    started = client.post("/api/surveys?top_k=2", content=f"{PROMPT}\n\nthe mat sat on the cat".encode()).json()
    for _ in range(600):
        if client.get(f"/api/surveys/{started['id']}").json()["status"] != "running":
            break
        time.sleep(0.05)
    ids["survey"] = started["id"]
    return ids


# every JSON operation of the API, with requests that reach each shape of its answer
REQUESTS: dict[str, list[Request]] = {
    "GET /api/models": [("GET", "/api/models", None)],
    "GET /api/health": [("GET", "/api/health", None)],
    "POST /api/runs": [("POST", "/api/runs", {"text": PROMPT}), ("POST", "/api/runs", {"text": "hi", "model": "minilm-l6"}),
                       ("POST", "/api/runs", {"text": "emoji 🐶 ok", "model": "tiny-llama", "top_k": 3})],
    "GET /api/runs/{run_id}": [("GET", "/api/runs/{run}", None), ("GET", "/api/runs/{enc}", None)],
    "GET /api/runs/{run_id}/attention": [("GET", "/api/runs/{run}/attention?layer=1&head=2", None),
                                         ("GET", "/api/runs/{run}/attention?layer=0", None),
                                         ("GET", "/api/runs/{enc}/attention?layer=0&head=0", None),
                                         ("GET", "/api/runs/{run}/attention?layer=1&head=0&size=3&pool=mean", None),
                                         ("GET", "/api/runs/{run}/attention?layer=0&q0=2&k1=5", None),
                                         ("GET", "/api/runs/{enc}/attention?layer=1&head=3&size=4", None)],
    "GET /api/runs/{run_id}/heads": [("GET", "/api/runs/{run}/heads?wait=60", None),
                                     ("GET", "/api/runs/{enc}/heads", None)],
    "GET /api/runs/{run_id}/stored": [("GET", "/api/runs/{run}/stored?wait=5", None),
                                      ("GET", "/api/runs/{enc}/stored", None)],
    "GET /api/runs/{run_id}/residual": [("GET", "/api/runs/{run}/residual", None)],
    "GET /api/runs/{run_id}/logit-lens": [("GET", "/api/runs/{run}/logit-lens?top_k=3", None)],
    "GET /api/runs/{run_id}/sparsity": [("GET", "/api/runs/{run}/sparsity", None),
                                        ("GET", "/api/runs/{run}/sparsity", None)],
    "GET /api/runs/{run_id}/next": [("GET", "/api/runs/{run}/next?position=2&temperature=0.5", None),
                                    ("GET", "/api/runs/{run}/next?position=9", None)],
    "GET /api/runs/{run_id}/contributions": [("GET", "/api/runs/{run}/contributions?layer=1&head=0&position=4", None)],
    "GET /api/runs/{run_id}/contribution-gaps": [("GET", "/api/runs/{run}/contribution-gaps?position=4", None)],
    "GET /api/models/{name}/embedding": [("GET", "/api/models/tiny-gpt2/embedding?id=7&top=4", None)],
    "GET /api/models/{name}/anatomy": [("GET", "/api/models/tiny-gpt2/anatomy", None),
                                       ("GET", "/api/models/minilm-l6/anatomy", None)],
    "GET /api/models/{name}/positions": [("GET", "/api/models/tiny-gpt2/positions?count=8", None),
                                         ("GET", "/api/models/tiny-llama/positions?count=8", None)],
    "POST /api/timing": [("POST", "/api/timing", {"text": "one two three"})],
    "POST /api/models/{name}/load": [("POST", "/api/models/tiny-gpt2/load", None)],  # loaded: answers at once
    "GET /api/models/{name}/patch-example": [("GET", "/api/models/tiny-llama/patch-example", None)],
    "GET /api/compare": [("GET", "/api/compare?a={run}&b={other}", None)],
    "GET /api/runs/{run_id}/attribution": [("GET", "/api/runs/{run}/attribution?position=3", None)],
    "POST /api/runs/{run_id}/ablate": [("POST", "/api/runs/{run}/ablate", {"heads": [[0, 1]], "top_k": 2})],
    "POST /api/runs/{run_id}/ablate/scan": [("POST", "/api/runs/{run}/ablate/scan", {"position": 3})],
    "POST /api/patch": [("POST", "/api/patch", {"clean": "the cat sat", "corrupted": "the dog sat",
                                                "answer": " on", "wrong": " the"})],
    "GET /api/runs/{run_id}/qk-attribution": [("GET", "/api/runs/{run}/qk-attribution?layer=1&head=2&query=5&key=3", None),
                                              ("GET", "/api/runs/{run}/qk-attribution?layer=1&head=0&query=4", None)],
    "POST /api/surveys": [("POST", "/api/surveys?top_k=2&name=c.txt", {"bytes": "the cat sat\n\nthe mat sat"})],
    "GET /api/surveys/{survey_id}": [("GET", "/api/surveys/{survey}", None)],
    "POST /api/surveys/{survey_id}/stop": [("POST", "/api/surveys/{survey}/stop", None)],
    "POST /api/surveys/open": [("POST", "/api/surveys/open", {"survey_file_of": "survey"})],
    # the body: that run's file (format=attnscope), sent as bytes
    "POST /api/runs/import": [("POST", "/api/runs/import", {"file_of": "run"}), ("POST", "/api/runs/import",
                                                                               {"file_of": "enc"})],
}


@functools.cache
def _result_classes() -> dict[str, list[type]]:
    """Every class the app's schemas and the engine define, by name: a route answers with the engine's
    result dataclasses or the app's pydantic models, and the OpenAPI document names each by its class."""
    found: dict[str, list[type]] = {}
    modules = [schemas, intervention_schemas, runjson, *(importlib.import_module(m.name) for m in
                                               pkgutil.walk_packages(attnscope.model.__path__, "attnscope.model."))]
    for module in modules:
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                found.setdefault(name, []).append(value)
    return found


def _schema_class(ref: str, classes: dict[str, list[type]]) -> type:
    name = ref.rsplit("/", 1)[-1]
    if name not in classes:
        raise LookupError(f"no schema class {name}")
    assert len(classes[name]) == 1, f"{name} is declared more than once: {classes[name]}"
    return classes[name][0]


def _json_operations(client: TestClient) -> dict[str, TypeAdapter[Any]]:
    """'METHOD path' -> an adapter for the model its success response names (JSON ones only)."""
    out: dict[str, TypeAdapter[Any]] = {}
    classes = _result_classes()
    for path, ops in client.app.openapi()["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                refs = [schema["$ref"]] if "$ref" in schema else [s["$ref"] for s in schema.get("anyOf", [])]
                if status.startswith("2") and refs:
                    model = functools.reduce(operator.or_, [_schema_class(ref, classes) for ref in refs])  # A | B | ...
                    out[f"{method.upper()} {path}"] = TypeAdapter(model)
    return out


def test_every_json_endpoint_has_requests(client: TestClient) -> None:
    assert set(_json_operations(client)) == set(REQUESTS)


@pytest.mark.parametrize("operation", list(REQUESTS))
def test_json_is_exactly_the_response_model(client: TestClient, runs: dict[str, str], operation: str) -> None:
    adapter = _json_operations(client)[operation]
    for method, url, body in REQUESTS[operation]:
        if isinstance(body, dict) and "bytes" in body:
            r = client.request(method, url, content=body["bytes"].encode())
        elif isinstance(body, dict) and "survey_file_of" in body:
            file = client.get(f"/api/surveys/{runs[body['survey_file_of']]}/file").content
            r = client.request(method, url, content=file, headers={"content-type": "application/octet-stream"})
        elif isinstance(body, dict) and "file_of" in body:
            file = client.get(f"/api/runs/{runs[body['file_of']]}/export", params={"format": "attnscope"}).content
            r = client.request(method, url, content=file, headers={"content-type": "application/octet-stream"})
        else:
            r = client.request(method, url.format(**runs), json=body)
        assert r.status_code in (200, 201, 202), f"{url}: {r.status_code} {r.text[:300]}"
        sent = r.json()
        assert adapter.dump_python(adapter.validate_python(sent), mode="json") == sent, url


def test_no_schema_mirrors_an_engine_result() -> None:
    """Each result is declared once: no pydantic model of the app has the fields of one of the engine's
    result dataclasses (a mirror, a second place to edit for one new field)."""
    results = {cls: {f.name for f in dataclasses.fields(cls)} for found in _result_classes().values()
               for cls in found if dataclasses.is_dataclass(cls) and cls.__module__.startswith("attnscope.model")}
    for module in (schemas, intervention_schemas):
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__:
                fields = set(value.model_fields)
                twins = [cls.__qualname__ for cls, theirs in results.items() if len(fields) >= 2 and theirs == fields]
                assert not twins, f"{module.__name__}.{name} mirrors {twins}"


def test_the_run_schema_is_the_fast_serialisers_class(client: TestClient) -> None:
    """The run's JSON is serialised from RunBody without validation; the OpenAPI document names RunBody
    itself, so the schema and the bytes cannot drift apart."""
    ops = client.app.openapi()["paths"]
    content = ops["/api/runs"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert content["$ref"].rsplit("/", 1)[-1] == RunBody.__name__
    assert set(TypeAdapter(LogitLens).json_schema()["properties"]) == {"n_layers", "n", "top_k", "layers"}


def _nbytes_agree(engine: Engine) -> Callable[[], None]:
    def check() -> None:
        assert engine.store.nbytes == sum(cache.nbytes for cache in engine.store)

    return check


def test_nothing_grows_a_run_outside_the_byte_count(client: TestClient, engine: Engine, runs: dict[str, str]) -> None:
    check = _nbytes_agree(engine)
    check()
    for requests in REQUESTS.values():
        for method, url, body in requests:
            client.request(method, url.format(**runs), json=body)
            check()
    run = client.post("/api/runs", json={"text": "a fresh run to measure"}).json()["run_id"]
    cache = engine.run(run)
    before, store_before = cache.nbytes, engine.store.nbytes
    assert client.get(f"/api/runs/{run}/sparsity").status_code == 200
    assert cache.sparsity is not None and cache.nbytes > before  # what the route kept is counted...
    assert engine.store.nbytes - store_before == cache.nbytes - before  # ...by the store too
    assert client.get(f"/api/runs/{run}/sparsity").status_code == 200
    assert cache.nbytes > before and engine.store.nbytes - store_before == cache.nbytes - before  # once
    check()
