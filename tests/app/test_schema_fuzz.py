"""Schemathesis against our own /openapi.json: no 5xx, and responses match the schema."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
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


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms(case: schemathesis.Case) -> None:
    # a generous read timeout: this checks conformance, not speed, and a loaded 2-core machine can take
    # over schemathesis' default 10 s for /api/timing's repeated forwards
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance], timeout=120)
