"""The explorer while the head scores are still being computed after the analyse answered: the page
draws at once, the head grid and the heatmap caption say "computing…", and the scores fill in (a grid
sorted by entropy re-sorts, the badges appear) when they arrive; a new run cancels the last one's wait."""

from __future__ import annotations

import threading
from urllib.parse import quote

import pytest

from attnscope.model.services.engine import Engine

pytestmark = pytest.mark.browser
TEXT = "The cat sat on the mat. The dog sat on the log. The cat sat on the mat."


def test_the_head_grid_says_computing_and_fills_in(page: object, base_url: str, bundled_engine: Engine) -> None:
    gate = threading.Event()
    before = bundled_engine.scores.pause

    def hold() -> None:  # the worker waits here, before each layer, until the test has looked
        gate.wait(120)

    bundled_engine.scores.pause = hold
    try:
        with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as posted:
            page.goto(f"{base_url}/?text={quote(TEXT)}&sort=entropy")
        run = posted.value.json()
        assert run["scores_pending"] == ["entropy", "max", "prev_token", "first_token", "induction"]
        # everything but the late scores is drawn while they are owed
        page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n "
                               "&& document.querySelectorAll('[data-testid=head-cell]').length > 0", timeout=60_000)
        cells = page.get_by_test_id("head-cell")
        assert cells.count() == run["n_layers"] * run["n_heads"]
        assert page.locator("[data-testid=head-cell][data-pending='1']").count() == cells.count()
        assert "computing…" in cells.first.locator(".lbl").inner_text()
        assert "computing…" in (cells.first.get_attribute("aria-label") or "")
        assert "computing…" in page.locator("#heat-caption").inner_text()
        assert page.locator("[data-testid=head-cell] [data-badge]").count() == 0  # no badge from a missing score
        status = page.get_by_test_id("scores-status")
        assert status.is_visible() and str(len(run["tokens"])) in status.inner_text()
        gate.set()
        page.wait_for_function("() => !document.querySelector('[data-testid=head-cell][data-pending=\"1\"]')",
                               timeout=60_000)
        assert status.is_hidden()
        heads = bundled_engine.wait_scores(run["run_id"], 60).summary.heads
        want = sorted(heads, key=lambda h: h.entropy if h.entropy is not None else float("inf"))
        shown = [(int(c.get_attribute("data-layer") or -1), int(c.get_attribute("data-head") or -1))
                 for c in cells.all()]
        assert shown == [(h.layer, h.head) for h in want]  # re-sorted by the entropies that arrived
        first = want[0]
        assert cells.first.locator(".lbl").inner_text() == f"L{first.layer}H{first.head}\n{first.entropy:.2f}"
        assert "computing…" not in page.locator("#heat-caption").inner_text()
        induction = [h for h in heads if (h.induction or 0.0) >= 0.3]  # the headgrid's threshold for "I"
        assert induction  # the prompt repeats itself: the bundled model's induction heads light up
        badged = page.locator("[data-testid=head-cell]:has([data-badge=ind])")
        assert sorted((int(c.get_attribute("data-layer") or -1), int(c.get_attribute("data-head") or -1))
                      for c in badged.all()) == sorted((h.layer, h.head) for h in induction)
    finally:
        bundled_engine.scores.pause = before
        gate.set()


def test_a_new_run_cancels_the_last_runs_wait(page: object, base_url: str, bundled_engine: Engine) -> None:
    """The page waits for one run's scores at a time: a wait left open for a run the page has moved on from
    would hold one of the browser's few connections to the server while tiles are asked for."""
    gate = threading.Event()
    before = bundled_engine.scores.pause
    bundled_engine.scores.pause = lambda: gate.wait(120)  # no score is computed until the test has looked
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url) if "/heads?wait=" in r.url else None)
    try:
        with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as posted:
            page.goto(f"{base_url}/?text={quote(TEXT)}")
        first = posted.value.json()["run_id"]
        page.wait_for_function("() => document.querySelector('[data-testid=head-cell][data-pending=\"1\"]')",
                               timeout=60_000)
        page.fill("[data-testid=prompt-input]", "A second prompt, analysed while the first one's scores are owed.")
        with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as second:
            page.get_by_test_id("analyze-button").click()
        assert second.value.json()["run_id"] != first
        page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell]').length > 0", timeout=60_000)
        page.wait_for_timeout(500)
        assert any(f"/runs/{first}/heads" in url for url in failed)  # the first run's wait was cancelled
        assert not any(f"/runs/{second.value.json()['run_id']}/heads" in url for url in failed)
        gate.set()
        page.wait_for_function("() => !document.querySelector('[data-testid=head-cell][data-pending=\"1\"]')",
                               timeout=60_000)
        assert page.get_by_test_id("error-message").is_hidden()  # the cancelled wait is not reported as an error
    finally:
        bundled_engine.scores.pause = before
        gate.set()
