"""/docs "Try it out": every POST body Swagger UI prefills is one the bundled model answers (2xx), and
the OpenAPI document states the errors, content types and limits the server enforces."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import load_model
from tests.support.tiny import make_engine

SAMPLES = {"string": "string", "integer": 0, "number": 0.0, "boolean": True, "null": None}


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def swagger_sample(spec: dict[str, Any], node: dict[str, Any]) -> Any:
    """What Swagger UI 5's sampler (json-schema-2020-12-samples) fills in for a schema: the schema's own
    examples[0], else its default, else its example; otherwise built from its parts, an integer from its
    minimum, a string "string", the first branch of an anyOf."""
    node = _resolve(spec, node)
    if node.get("examples"):
        return node["examples"][0]
    for key in ("default", "example"):
        if key in node:
            return node[key]
    for key in ("anyOf", "oneOf"):
        if node.get(key):
            return swagger_sample(spec, node[key][0])
    kind = node.get("type", "object" if "properties" in node else "string")
    if kind == "object":
        return {name: swagger_sample(spec, prop) for name, prop in node.get("properties", {}).items()}
    if kind == "array":
        if "prefixItems" in node:
            return [swagger_sample(spec, item) for item in node["prefixItems"]]
        return [swagger_sample(spec, node.get("items", {}))]
    if kind in ("integer", "number") and "minimum" in node:
        return node["minimum"]
    return SAMPLES[kind]


def prefilled_body(spec: dict[str, Any], operation: dict[str, Any]) -> Any:
    """The body "Try it out" shows: the media type's example, else its first named example, else the schema's."""
    media = operation["requestBody"]["content"]["application/json"]
    if "example" in media:
        return media["example"]
    if media.get("examples"):
        return next(iter(media["examples"].values()))["value"]
    return swagger_sample(spec, media["schema"])


@pytest.fixture(scope="module")
def docs_client() -> Iterator[TestClient]:
    """The default bundled model alone, as `attnscope serve` runs it with the default settings."""
    engine = make_engine({"attnscope-tiny": load_model("attnscope-tiny", "bundled:attnscope-tiny")},
                         "attnscope-tiny")
    with TestClient(create_app(Settings(models={}, default_model="attnscope-tiny"), engine)) as client:
        yield client


def _post_operations(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The POSTs with a JSON body (a run file's import takes bytes: Swagger offers a file picker; loading an
    offered model, POST /api/models/{name}/load, takes none)."""
    return [(path, ops["post"]) for path, ops in spec["paths"].items()
            if "post" in ops and "requestBody" in ops["post"]
            and "application/json" in ops["post"]["requestBody"]["content"]]


def test_every_prefilled_post_body_is_answered(docs_client: TestClient) -> None:
    spec = docs_client.get("/openapi.json").json()
    operations = _post_operations(spec)
    assert len(operations) >= 6
    runs = dict(operations)["/api/runs"]
    created = docs_client.post("/api/runs", json=prefilled_body(spec, runs))
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    failed = {}
    for path, operation in operations:
        body = prefilled_body(spec, operation)
        assert "string" not in json.dumps(body), f"{path}: Swagger would prefill placeholders: {body}"
        response = docs_client.post(path.replace("{run_id}", run_id), json=body)
        if not 200 <= response.status_code < 300:
            failed[path] = (body, response.status_code, response.text[:300])
    assert failed == {}


def test_every_request_body_has_its_own_example(docs_client: TestClient) -> None:
    """A whole-body example, so Swagger never builds one field by field (text and messages together,
    "model": "string", an integer's minimum)."""
    spec = docs_client.get("/openapi.json").json()
    for path, operation in _post_operations(spec):
        schema = _resolve(spec, operation["requestBody"]["content"]["application/json"]["schema"])
        assert schema.get("examples"), path
        for name, prop in schema["properties"].items():
            for branch in prop.get("anyOf", [prop]):
                node = _resolve(spec, branch)
                if node.get("type") == "integer":
                    assert "minimum" in node and "maximum" in node, f"{path} {name}"


def test_old_field_by_field_samples_would_fail(docs_client: TestClient) -> None:
    """The sampler itself is faithful: without the whole-body examples it rebuilds the bodies that
    failed (/api/runs with both text and messages, a model named "string")."""
    spec = copy.deepcopy(docs_client.get("/openapi.json").json())
    for schema in spec["components"]["schemas"].values():
        schema.pop("examples", None)
    runs = swagger_sample(spec, dict(_post_operations(spec))["/api/runs"]["requestBody"]["content"]
                          ["application/json"]["schema"])
    assert "text" in runs and "messages" in runs
    assert docs_client.post("/api/runs", json=runs).status_code == 422


@pytest.fixture(scope="module")
def limited_spec(docs_client: TestClient) -> dict[str, Any]:
    settings = Settings(models={}, default_model="attnscope-tiny", max_top_k=37, max_new_tokens=40,
                        max_body_bytes=123_456)
    return create_app(settings, docs_client.app.state.engine).openapi()


def test_errors_any_request_may_get_are_documented(limited_spec: dict[str, Any]) -> None:
    for path, operations in limited_spec["paths"].items():
        for method, operation in operations.items():
            for status in ("400", "413", "415", "503"):
                response = operation["responses"].get(status)
                assert response is not None, f"{method} {path} {status}"
                assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
    assert "123,456 bytes" in limited_spec["paths"]["/api/runs"]["post"]["responses"]["413"]["description"]
    assert "ATTNSCOPE_ALLOWED_HOSTS" in limited_spec["paths"]["/api/runs"]["post"]["responses"]["400"]["description"]


def test_binary_and_stream_content_types_are_documented(limited_spec: dict[str, Any]) -> None:
    paths = limited_spec["paths"]
    attention = paths["/api/runs/{run_id}/attention"]["get"]["responses"]["200"]["content"]
    assert attention["application/octet-stream"]["schema"] == {"type": "string", "format": "binary"}
    assert "application/json" in attention
    export = paths["/api/runs/{run_id}/export"]["get"]["responses"]["200"]["content"]
    assert set(export) == {"application/json", "application/octet-stream", "text/html"}  # html: the standalone file
    assert "text/event-stream" in paths["/api/generate"]["post"]["responses"]["200"]["content"]


def test_configured_limits_are_stated_in_the_schema(limited_spec: dict[str, Any], docs_client: TestClient) -> None:
    schemas = limited_spec["components"]["schemas"]
    top_k = [b for b in schemas["RunRequest"]["properties"]["top_k"]["anyOf"] if b.get("type") == "integer"]
    assert top_k[0]["maximum"] == 37
    assert schemas["GenerateRequest"]["properties"]["max_new_tokens"]["maximum"] == 40
    params = {p["name"]: p for p in limited_spec["paths"]["/api/runs/{run_id}/next"]["get"]["parameters"]}
    next_k = [b for b in params["top_k"]["schema"]["anyOf"] if b.get("type") == "integer"]
    assert next_k[0]["maximum"] == 37 and "ATTNSCOPE_MAX_TOP_K" in params["top_k"]["description"]
    assert "POST /api/runs" in params["run_id"]["description"]  # where a run id comes from
    scan = schemas["ScanRequest"]["properties"]["position"]
    assert scan["minimum"] == 0
    # the default server states its own limit, and enforces exactly it
    spec = docs_client.get("/openapi.json").json()
    stated = next(b for b in spec["components"]["schemas"]["RunRequest"]["properties"]["top_k"]["anyOf"]
                  if b.get("type") == "integer")["maximum"]
    assert stated == 100
    assert docs_client.post("/api/runs", json={"text": "a b", "top_k": stated}).status_code == 201
    over = docs_client.post("/api/runs", json={"text": "a b", "top_k": stated + 1})
    assert over.status_code == 422 and "ATTNSCOPE_MAX_TOP_K" in over.json()["message"]


@pytest.mark.browser
def test_swagger_ui_prefills_these_bodies_and_they_run(page: Any, base_url: str) -> None:
    """In Chromium: Swagger UI's own "Try it out" textarea holds exactly the body the sampler above
    builds, for every POST; executing POST /api/runs as prefilled answers 201."""
    spec = page.request.get(base_url + "/openapi.json").json()
    page.goto(base_url + "/docs")
    page.wait_for_selector(".opblock-summary", timeout=30_000)
    for path, operation in _post_operations(spec):
        block = page.locator(".opblock-post").filter(
            has=page.locator(f'.opblock-summary-path[data-path="{path}"]')).first
        block.locator(".opblock-summary").click()
        block.locator(".try-out__btn").click()
        text = block.locator("textarea.body-param__text").input_value(timeout=10_000)
        assert json.loads(text) == prefilled_body(spec, operation), path
        if path == "/api/runs":
            block.locator(".execute").click()
            status = block.locator(".live-responses-table tbody td.response-col_status").first
            status.wait_for(timeout=60_000)
            assert status.text_content().strip() == "201"


def test_no_tuple_is_shown_as_nulls(docs_client: TestClient) -> None:
    """Swagger UI samples an OpenAPI 3.1 tuple (prefixItems) as nulls ("heads": [[null, null]] in the
    ablate response): every schema property that holds tuples carries an example of its own."""
    spec = docs_client.get("/openapi.json").json()
    tuples = []
    for name, schema in spec["components"]["schemas"].items():
        for prop, node in schema.get("properties", {}).items():
            if "prefixItems" in json.dumps(node):
                tuples.append(f"{name}.{prop}")
                assert node.get("examples") or node.get("example") is not None, f"{name}.{prop} has no example"
    assert "Ablation.heads" in tuples
