"""Every setting the README lists has an effect; each test here shows one through the app
the settings build (create_app without a prebuilt engine loads the models itself)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient

from attnscope.app import cli
from attnscope.app.main import create_app
from attnscope.app.settings import RENAMED, Settings

ROOT = Path(__file__).resolve().parents[2]
LONG = " ".join(["word"] * 200)  # 200 tokens: more than test_max_tokens' limit


def app_client(tiny_dirs: dict[str, Path], **settings: Any) -> TestClient:
    models = {"a": str(tiny_dirs["gpt2"]), "b": str(tiny_dirs["llama"])}
    return TestClient(create_app(Settings(**{"models": models, "default_model": "a", **settings})))


@pytest.fixture(scope="module")
def limited(tiny_dirs: dict[str, Path]) -> Iterator[TestClient]:
    """One app with every request limit set low."""
    with app_client(tiny_dirs, default_model="b", max_tokens=100, max_body_bytes=4096, max_top_k=3,
                    max_new_tokens=4, queue_length=1, worker_threads=3) as client:
        yield client


def test_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = {name.lower() for name in re.findall(r"`ATTNSCOPE_([A-Z_]+)`", readme)}
    assert listed - set(RENAMED) == set(Settings.model_fields)  # an old name is named beside its new one


def test_models_and_default_model(limited: TestClient) -> None:
    assert [m["name"] for m in limited.get("/api/models").json()["models"]] == ["a", "b"]
    assert limited.post("/api/runs", json={"text": "hello there"}).json()["model"] == "b"
    assert limited.post("/api/runs", json={"text": "hello there", "model": "a"}).json()["model"] == "a"


def test_max_tokens(limited: TestClient) -> None:
    assert {m["max_tokens"] for m in limited.get("/api/models").json()["models"]} == {100}
    r = limited.post("/api/runs", json={"text": LONG})
    assert r.status_code == 422 and "limit of 100" in r.json()["message"]


def test_max_body_bytes(limited: TestClient) -> None:
    def padded(size: int) -> bytes:  # a short prompt in a body of `size` bytes
        return b'{"text": "hi"' + b" " * (size - 14) + b"}"

    json_type = {"content-type": "application/json"}
    assert limited.post("/api/runs", content=padded(4000), headers=json_type).status_code == 201
    assert limited.post("/api/runs", content=padded(4200), headers=json_type).status_code == 413


def test_max_top_k(limited: TestClient, tiny_dirs: dict[str, Path]) -> None:
    run = limited.post("/api/runs", json={"text": "one two three"}).json()  # default 10, capped to 3
    assert {len(p["top"]) for p in run["predictions"]} == {3}
    assert len(limited.get(f"/api/runs/{run['run_id']}/next", params={"position": 0}).json()["top"]) == 3
    r = limited.post("/api/runs", json={"text": "one two three", "top_k": 4})
    assert r.status_code == 422 and "ATTNSCOPE_MAX_TOP_K" in r.json()["message"]
    nxt = limited.get(f"/api/runs/{run['run_id']}/next", params={"position": 0, "top_k": 4})
    assert nxt.status_code == 422 and "limit of 3" in nxt.json()["message"]
    with app_client(tiny_dirs, max_top_k=150) as roomy:  # above the old hard-coded 100
        wide = roomy.post("/api/runs", json={"text": "one two three", "top_k": 150}).json()
        assert {len(p["top"]) for p in wide["predictions"]} == {150}


def test_max_new_tokens(limited: TestClient) -> None:
    ok = limited.post("/api/generate", json={"text": "hi", "max_new_tokens": 4, "temperature": 0})
    assert ok.status_code == 200 and '"n_new": 4' in ok.text
    r = limited.post("/api/generate", json={"text": "hi", "max_new_tokens": 5})
    assert r.status_code == 422 and "ATTNSCOPE_MAX_NEW_TOKENS" in r.json()["message"]


def test_queue_length(limited: TestClient) -> None:
    with limited.app.state.gate.enter("b"):  # one request already waits for model b
        r = limited.post("/api/runs", json={"text": "hello"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "busy" in r.json()["message"]
    assert limited.post("/api/runs", json={"text": "hello"}).status_code == 201


def test_worker_threads(limited: TestClient) -> None:
    tokens = limited.portal.call(lambda: anyio.to_thread.current_default_thread_limiter().total_tokens)
    assert tokens == 3


def test_the_run_store_has_an_old_name_still_read(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """ATTNSCOPE_CACHE_BYTES (and cache_bytes=) from before the rename still set the run store's cap, with a
    warning that names the new variable; the new name wins where both are set."""
    monkeypatch.setenv("ATTNSCOPE_CACHE_BYTES", str(3 << 20))
    with caplog.at_level("WARNING", logger="attnscope.app.settings"):
        assert Settings().run_store_bytes == 3 << 20
    assert "ATTNSCOPE_CACHE_BYTES is now ATTNSCOPE_RUN_STORE_BYTES" in caplog.text
    monkeypatch.setenv("ATTNSCOPE_RUN_STORE_BYTES", str(5 << 20))
    assert Settings().run_store_bytes == 5 << 20
    monkeypatch.delenv("ATTNSCOPE_CACHE_BYTES")
    monkeypatch.delenv("ATTNSCOPE_RUN_STORE_BYTES")
    assert Settings(cache_bytes=2 << 20).run_store_bytes == 2 << 20  # type: ignore[call-arg]
    assert Settings().run_store_bytes == 1 << 30


def test_run_store_bytes(tiny_dirs: dict[str, Path]) -> None:
    with app_client(tiny_dirs, run_store_bytes=1 << 20) as client:
        assert client.get("/api/health").json()["run_cache_max_bytes"] == 1 << 20
        first = client.post("/api/runs", json={"text": "short"}).json()["run_id"]
        assert client.get(f"/api/runs/{first}").status_code == 200
        big = client.post("/api/runs", json={"text": " ".join(["word"] * 240)})  # keeps ~1.2 MiB alone: refused
        assert big.status_code == 413
        assert "the run store holds at most 1 MiB (ATTNSCOPE_RUN_STORE_BYTES)" in big.json()["message"]
        assert client.get(f"/api/runs/{first}").status_code == 200  # refused before its forward: nothing evicted
        for _ in range(3):  # ~0.6 MiB each: the older go
            last = client.post("/api/runs", json={"text": " ".join(["word"] * 120)}).json()["run_id"]
        r = client.get(f"/api/runs/{first}")
        assert r.status_code == 404 and "expired" in r.json()["message"]
        health = client.get("/api/health").json()
        assert health["runs"] == 1 and health["run_cache_bytes"] <= 1 << 20
        assert client.get(f"/api/runs/{last}").status_code == 200
    with app_client(tiny_dirs) as roomy:  # the default 1 GiB keeps both
        first = roomy.post("/api/runs", json={"text": "short"}).json()["run_id"]
        roomy.post("/api/runs", json={"text": LONG})
        assert roomy.get(f"/api/runs/{first}").status_code == 200


@pytest.mark.parametrize("tune", [True, False])
def test_serve_reads_host_port_log_level_and_tune_malloc(tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                        tune: bool) -> None:
    import uvicorn

    from attnscope.app import memory

    served: dict[str, Any] = {}
    tuned: list[bool] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(kw, app=app))

    def fake_tune() -> bool:
        tuned.append(True)
        return True

    monkeypatch.setattr(memory, "tune_malloc", fake_tune)
    monkeypatch.setenv("ATTNSCOPE_MODELS", f'{{"a": "{tiny_dirs["gpt2"]}"}}')
    monkeypatch.setenv("ATTNSCOPE_DEFAULT_MODEL", "a")
    monkeypatch.setenv("ATTNSCOPE_HOST", "127.0.0.2")
    monkeypatch.setenv("ATTNSCOPE_PORT", "8123")
    monkeypatch.setenv("ATTNSCOPE_LOG_LEVEL", "warning")
    monkeypatch.setenv("ATTNSCOPE_TUNE_MALLOC", str(tune).lower())
    level = logging.getLogger().level
    try:
        assert cli.main(["serve"]) == 0
        assert logging.getLogger().level == logging.WARNING
    finally:
        logging.getLogger().setLevel(level)
    assert (served["host"], served["port"], served["log_level"]) == ("127.0.0.2", 8123, "warning")
    assert served["server_header"] is False  # no "server: uvicorn" header
    assert tuned == ([True] if tune else [])
    assert served["app"].state.settings.default_model == "a"


@pytest.mark.parametrize(("value", "hosts"), [("attnscope.example.org, *.lab.example", ["attnscope.example.org", "*.lab.example"]),
                                              ("[::1],box.local", ["[::1]", "box.local"]), ("*", ["*"]), ("", []),
                                              ('["a.example", "b.example"]', ["a.example", "b.example"])])
def test_allowed_hosts_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, hosts: list[str]) -> None:
    monkeypatch.setenv("ATTNSCOPE_ALLOWED_HOSTS", value)
    assert Settings().allowed_hosts == hosts


def test_allowed_hosts_are_answered(tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_ALLOWED_HOSTS", "attnscope.example.org")
    with app_client(tiny_dirs) as client:
        assert client.get("/api/health", headers={"host": "attnscope.example.org"}).status_code == 200
        assert client.get("/api/health", headers={"host": "127.0.0.1:8000"}).status_code == 200
        refused = client.get("/api/health")  # TestClient's own "testserver" is not named any more
        assert refused.status_code == 400 and "'testserver'" in refused.json()["message"]
