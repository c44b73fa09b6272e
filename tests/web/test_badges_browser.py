"""The head grid's badges in Chromium, in English and Chinese: an everyday sentence with a repeated
word gets no induction badge and its cells say why (too little evidence); a repeated passage
badges exactly the heads whose induction score reaches the threshold; the badges' tooltips state
the rule (tests/app/test_badges.py checks the numbers)."""

from __future__ import annotations

import pytest

from tests.app.test_badges import badges
from tests.support.browser import shot

pytestmark = pytest.mark.browser

EVERYDAY = "In the morning the children go up to the hill."
PASSAGE = "Alice and Bob went to the market. Alice bought apples and Bob bought pears. Alice and Bob went home."
WHY = {"en": "too little evidence", "zh": "证据不足"}
RULE = {"en": "more than 3 positions back", "zh": "3 个位置之外"}


def analyse(page: object, base_url: str, text: str, lang: str) -> dict:
    """Analyse ``text`` in the explorer and return the run with its late scores."""
    page.goto(f"{base_url}/?lang={lang}")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt"
                           " && !document.body.dataset.busy")
    page.get_by_test_id("prompt-input").fill(text)
    with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as resp:
        page.get_by_test_id("analyze-button").click()
    run = resp.value.json()
    page.wait_for_function("() => !document.body.dataset.busy && "
                           "![...document.querySelectorAll('[data-testid=head-cell]')].some(c => c.dataset.pending)",
                           timeout=60_000)
    heads = page.evaluate("(id) => fetch(`/api/runs/${id}/heads`).then(r => r.json())", run["run_id"])
    run["heads"] = heads["heads"]
    return run


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_an_everyday_sentence_has_no_induction_badge_and_says_why(page: object, base_url: str, lang: str) -> None:
    run = analyse(page, base_url, "I think that the dog and the cat went to the park with the kids.", lang)
    assert 0 < run["induction_queries"] < run["induction_min_queries"]
    assert page.locator("[data-testid=head-cell] [data-badge=ind]").count() == 0
    title = page.locator("[data-testid=head-cell]").first.get_attribute("title")
    assert WHY[lang] in title and str(run["induction_min_queries"]) in title
    run = analyse(page, base_url, EVERYDAY, lang)
    want = badges(run["heads"], len(run["tokens"]))
    for name in ("prev", "sink", "ind"):
        cells = page.locator(f"[data-testid=head-cell]:has([data-badge={name}])")
        got = sorted((int(c.get_attribute("data-layer")), int(c.get_attribute("data-head"))) for c in cells.all())
        assert got == sorted(want[name]), name
    assert page.locator("[data-testid=head-cell] [data-badge=ind]").count() == 0
    assert page.locator("[data-testid=head-cell] [data-badge=prev]").count() <= 2
    shot(page, f"badges-everyday-{lang}")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_repeated_passage_badges_the_copying_heads(page: object, base_url: str, lang: str) -> None:
    run = analyse(page, base_url, PASSAGE, lang)
    want = badges(run["heads"], len(run["tokens"]))["ind"]
    assert (4, 0) in want
    cells = page.locator("[data-testid=head-cell]:has([data-badge=ind])")
    got = sorted((int(c.get_attribute("data-layer")), int(c.get_attribute("data-head"))) for c in cells.all())
    assert got == sorted(want)
    title = page.locator("[data-testid=head-cell][data-layer='4'][data-head='0'] [data-badge=ind]").get_attribute("title")
    assert RULE[lang] in title
    shot(page, f"badges-passage-{lang}")
