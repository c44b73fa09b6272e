"""A long prompt's shareable URL names its run by id instead of carrying the whole text; opening that
URL shows the same run. A short prompt's URL still carries its text."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

pytestmark = pytest.mark.browser
DRAWN = "() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy"


def analyse(page: object, text: str) -> dict:
    page.get_by_test_id("prompt-input").fill(text)
    with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as resp:
        page.get_by_test_id("analyze-button").click()
    page.wait_for_function(DRAWN, timeout=60_000)
    return resp.value.json()


def test_a_long_prompts_link_names_its_run(page: object, base_url: str) -> None:
    page.goto(f"{base_url}/")
    page.wait_for_function(DRAWN, timeout=60_000)
    short = analyse(page, "The cat sat on the mat.")
    query = parse_qs(urlparse(page.url).query)
    assert query["text"] == ["The cat sat on the mat."] and "run" not in query and short["run_id"]
    long_text = " ".join(["the quiet river runs past the old mill"] * 30)  # 1,200 characters
    run = analyse(page, long_text)
    query = parse_qs(urlparse(page.url).query)
    assert "text" not in query and query["run"] == [run["run_id"]]
    assert len(page.url) < 300
    page.goto(page.url)  # the shared link, opened
    page.wait_for_function(DRAWN, timeout=60_000)
    assert page.input_value("[data-testid=prompt-input]") == long_text
    shown = page.evaluate("() => document.querySelectorAll('[data-testid=token]').length")
    assert shown == len(run["tokens"])
