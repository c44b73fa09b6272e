"""Models offered but loaded on first use (an installed real model beside the bundled default): listed as
available, loaded by POST /api/models/NAME/load or by the first request naming them, then like the others;
the explorer's picker lists them and loads one when picked."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import build_engine, create_app
from attnscope.app.settings import Settings
from attnscope.model.load import sources
from attnscope.model.load.models import LoadedModel, load_model
from attnscope.model.services.engine import Engine
from tests.support.tiny import make_engine


@pytest.fixture
def offering(tiny_dirs: dict[str, Path]) -> tuple[Engine, list[str]]:
    base = load_model("tiny-gpt2", str(tiny_dirs["gpt2"]))
    engine = make_engine({"tiny-gpt2": base}, "tiny-gpt2")
    loads: list[str] = []

    def loader() -> LoadedModel:
        loads.append(threading.current_thread().name)
        return load_model("later", str(tiny_dirs["llama"]))

    engine.offer("later", "a tiny llama offered here", loader)
    return engine, loads


@pytest.fixture
def offered_client(offering: tuple[Engine, list[str]]) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2"), offering[0])) as c:
        yield c


def test_an_offered_model_is_listed_then_loaded_once(offered_client: TestClient,
                                                      offering: tuple[Engine, list[str]]) -> None:
    listed = offered_client.get("/api/models").json()
    assert [m["name"] for m in listed["models"]] == ["tiny-gpt2"]
    assert listed["available"] == [{"name": "later", "about": "a tiny llama offered here"}]
    loaded = offered_client.post("/api/models/later/load")
    assert loaded.status_code == 200 and loaded.json()["name"] == "later" and loaded.json()["family"] == "llama"
    again = offered_client.get("/api/models").json()
    assert [m["name"] for m in again["models"]] == ["tiny-gpt2", "later"] and again["available"] == []
    assert offered_client.post("/api/models/later/load").status_code == 200
    assert len(offering[1]) == 1  # loaded once
    missing = offered_client.post("/api/models/nothing/load")
    assert missing.status_code == 404 and missing.json()["code"] == "unknown_model"


def test_the_first_request_naming_an_offered_model_loads_it(offered_client: TestClient,
                                                            offering: tuple[Engine, list[str]]) -> None:
    results: list[int] = []

    def analyse() -> None:
        results.append(offered_client.post("/api/runs", json={"text": "the cat sat", "model": "later"}).status_code)

    threads = [threading.Thread(target=analyse) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [201, 201, 201] and len(offering[1]) == 1


def test_installed_real_models_are_offered_unless_the_models_are_given_exactly(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "installed_known", lambda: ["smollm2-135m"])
    settings = Settings(models={"attnscope-tiny": "bundled:attnscope-tiny"}, run_dir="")
    engine = build_engine(settings)
    try:
        assert list(engine.loadable) == ["smollm2-135m"] and "smollm2-135m" not in engine.models
    finally:
        engine.close()
    from attnscope.app import cli

    args = cli.build_parser().parse_args(["serve", "--model", "tiny=bundled:attnscope-tiny"])
    chosen = cli._settings(args)
    assert chosen is not None and chosen.offer_installed is False
