"""The browser frontend's layout (issue #28): static/js/main.js is a small controller over the
explorer's modules (static/js/explorer/), there is one chart helper and one error box, and the
views take their data as arguments (none fetches from api.js itself), so that another transport
can draw them. Plain file reads, no browser."""

from __future__ import annotations

import re
from pathlib import Path

JS = Path(__file__).resolve().parents[2] / "static" / "js"
CONTROLLER_LINES = 250


def sources() -> dict[str, str]:
    return {path.relative_to(JS).as_posix(): path.read_text(encoding="utf-8") for path in sorted(JS.rglob("*.js"))}


def defining(pattern: str) -> list[str]:
    return [name for name, text in sources().items() if re.search(pattern, text, re.M)]


def test_main_js_is_a_small_controller() -> None:
    lines = (JS / "main.js").read_text(encoding="utf-8").count("\n")
    assert lines < CONTROLLER_LINES, f"static/js/main.js has {lines} lines"
    imported = set(re.findall(r'from "\./explorer/(\w+)\.js"', (JS / "main.js").read_text(encoding="utf-8")))
    assert {"errors", "requests", "selection", "zoom", "generate", "export", "draw", "analyse"} <= imported


def test_one_chart_helper() -> None:
    assert defining(r"^export function plot\(") == ["chart.js"]


def test_one_show_error() -> None:
    assert defining(r"\bfunction showError\(") == ["explorer/errors.js"]


def test_views_import_nothing_from_the_api() -> None:
    views = {name: text for name, text in sources().items() if name.startswith("views/")}
    assert len(views) >= 8
    assert [name for name, text in views.items() if re.search(r'from "\.\./api\.js"', text)] == []
    assert [name for name, text in views.items() if re.search(r"\bfetch\(", text)] == []


def test_explorer_modules_are_a_package_in_the_wheel() -> None:
    pyproject = (JS.parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"attnscope.static.js.explorer"' in pyproject
    assert '"attnscope.static.js.explorer" = ["*"]' in pyproject
