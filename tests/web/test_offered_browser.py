"""The explorer's picker lists an offered model (installed, not loaded), loads it when picked, and then
analyses with it like any other; in Chinese too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnscope.model.load.models import LoadedModel, load_model
from tests.support.tiny import make_engine

pytestmark = pytest.mark.browser


@pytest.fixture
def offered_url(tiny_dirs: dict[str, Path]) -> Iterator[str]:
    from tests.support.servers import serve_engine

    engine = make_engine({"tiny-gpt2": load_model("tiny-gpt2", str(tiny_dirs["gpt2"]))}, "tiny-gpt2")

    def loader() -> LoadedModel:
        return load_model("later", str(tiny_dirs["llama"]))

    engine.offer("later", "a tiny llama offered here", loader)
    with serve_engine(engine) as url:
        yield url


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_picking_an_offered_model_loads_it_and_analyses_with_it(page: object, offered_url: str, lang: str) -> None:
    requests = in_flight(page)
    page.goto(f"{offered_url}/?lang={lang}")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt"
                           " && !document.body.dataset.busy", timeout=60_000)  # the example, analysed on load
    page.wait_for_function("() => document.querySelectorAll('#model-picker option').length === 2")
    offered = page.locator("#model-picker option").nth(1)
    assert offered.get_attribute("value") == "later"
    assert ("loads when picked" if lang == "en" else "选中后加载") in offered.text_content()
    page.select_option("#model-picker", "later")
    page.wait_for_function("() => !document.querySelector('#model-picker').disabled "
                           "&& document.querySelector('#model-note').hidden")
    assert page.input_value("#model-picker") == "later"
    loaded = page.locator("#model-picker option").nth(1).text_content()
    assert "llama" in loaded and "loads when picked" not in loaded and "选中后加载" not in loaded
    page.get_by_test_id("prompt-input").fill("the cat sat on the mat")
    with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as resp:
        page.get_by_test_id("analyze-button").click()
    assert resp.value.status == 201 and resp.value.json()["model"] == "later"
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt"
                           " && !document.body.dataset.busy", timeout=60_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=head-cell][data-pending=\"1\"]')",
                           timeout=60_000)  # the late head scores in, before the page closes
    # and the requests the page makes after them (the grid's other layers, the focus charts) answered: the server
    # stops before the page, so one still on its way would be refused (a console error at teardown)
    quiet_network(page, requests)


def in_flight(page: object) -> set[object]:
    """The page's requests not yet answered, kept up to date from now on."""
    pending: set[object] = set()
    page.on("request", lambda r: pending.add(r))
    page.on("requestfinished", lambda r: pending.discard(r))
    page.on("requestfailed", lambda r: pending.discard(r))
    return pending


def quiet_network(page: object, pending: set[object], quiet_ms: int = 500, timeout_s: float = 30.0) -> None:
    """Until no request of the page has been on its way for ``quiet_ms`` (Playwright's "networkidle" load
    state is reached once, at load, and answers at once after that)."""
    deadline, quiet = time.monotonic() + timeout_s, 0
    while quiet < quiet_ms:
        assert time.monotonic() < deadline, f"requests still on their way: {[r.url for r in pending]}"
        page.wait_for_timeout(50)
        quiet = quiet + 50 if not pending else 0
