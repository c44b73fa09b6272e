"""Playwright driving Debian's Chromium (never a downloaded browser build)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


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
