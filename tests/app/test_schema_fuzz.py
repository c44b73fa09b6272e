"""Schemathesis against our own /openapi.json: no 5xx, and responses match the schema."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import load_model
from tests.support.tiny import make_engine, save_tiny

_tmp = Path(tempfile.mkdtemp(prefix="attnscope-fuzz-"))
atexit.register(shutil.rmtree, _tmp, ignore_errors=True)  # made at import: no fixture to clean it
_folder = save_tiny("gpt2", _tmp / "gpt2")
_engine = make_engine({"tiny-gpt2": load_model("tiny-gpt2", str(_folder))}, "tiny-gpt2")
_app = create_app(Settings(models={}, default_model="tiny-gpt2", max_body_bytes=64 * 1024), _engine)
schema = schemathesis.openapi.from_asgi("/openapi.json", _app)
# both kinds of data, said rather than left to the default: what the schema allows (each must get no 5xx
# and a response matching the document) and what it forbids (each must be refused cleanly, never a 5xx)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms(case: schemathesis.Case) -> None:
    # a generous read timeout: this checks conformance, not speed, and a loaded 2-core machine can take
    # over schemathesis' default 10 s for /api/timing's repeated forwards
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance], timeout=120)


def test_the_fuzzed_document_states_the_bounds_the_server_enforces() -> None:
    """#36: indices within what the loaded model has (the tiny gpt2: 2 layers x 4 heads)."""
    info = _engine.models["tiny-gpt2"].info
    assert (info.n_layers, info.n_heads) == (2, 4)
    doc = _app.openapi()
    params = {p["name"]: p["schema"] for p in doc["paths"]["/api/runs/{run_id}/attention"]["get"]["parameters"]}
    assert (params["layer"]["minimum"], params["layer"]["maximum"]) == (0, 1)
    head = next(b for b in params["head"]["anyOf"] if b.get("type") == "integer")
    assert (head["minimum"], head["maximum"]) == (0, 3)
    embedding = {p["name"]: p["schema"] for p in doc["paths"]["/api/models/{name}/embedding"]["get"]["parameters"]}
    assert (embedding["id"]["minimum"], embedding["id"]["maximum"]) == (0, info.vocab_size - 1)
    pair = doc["components"]["schemas"]["AblateRequest"]["properties"]["heads"]["items"]["prefixItems"]
    assert [pair[0]["maximum"], pair[1]["maximum"]] == [1, 3]
    assert set(schema.config.generation.modes) == {GenerationMode.POSITIVE, GenerationMode.NEGATIVE}
