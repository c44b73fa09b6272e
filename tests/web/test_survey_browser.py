"""The Corpus tab in Chromium on the bundled model: a corpus file surveyed from the page with its progress,
the layer x head map of corpus means, the selected head's scores and examples, the head map's badges
switched to the corpus and back, a survey file opened again; in English and Chinese at 1,400 and 390 px."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.browser import shot
from tests.web.test_explorer_i18n_browser import READY, assert_chinese
from tests.web.test_layout_browser import CLIPPED

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat"
CORPUS = "\n\n".join([
    "The cat sat on the mat. The cat sat on the mat.",
    "My friend John lives in the city. My friend John lives in the city.",
    "Once upon a time there was a little girl who lived in a village near the forest.",
])


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("width", [1400, 390])
def test_survey_a_corpus_from_the_page(browser: object, base_url: str, tmp_path: Path, width: int, lang: str) -> None:
    corpus = tmp_path / "stories.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{base_url}/?text={quote(PROMPT)}&pos=5&lang={lang}&layer=4&head=0")
    page.wait_for_function(READY, timeout=120_000)
    page.get_by_test_id("tool-tab-survey").click()
    page.get_by_test_id("survey-file").set_input_files(str(corpus))
    page.get_by_test_id("survey-start").click()
    page.wait_for_selector("[data-testid=survey-map][data-heads]", state="attached", timeout=120_000)
    summary = page.get_by_test_id("survey-summary").text_content()
    assert "stories.txt" in summary and "3" in summary, summary
    assert page.evaluate("() => document.querySelector('[data-testid=survey-map]').dataset.heads") == "48"
    # the selected head (the bundled model's induction head): its table and its examples, query and key marked
    assert page.get_by_test_id("survey-head-table").locator("tbody tr").count() == 7
    examples = page.get_by_test_id("sv-example")
    assert examples.count() >= 1
    assert examples.first.locator(".sv-q").count() == 1 and examples.first.locator(".sv-k").count() == 1
    # another score colours the map
    page.get_by_test_id("survey-field").select_option("prev_token")
    page.wait_for_selector("[data-testid=survey-map][data-field=prev_token]", state="attached")
    # the head map's badges from the corpus, the legend says so; and back to the prompt
    page.get_by_test_id("survey-on-grid").check()
    page.wait_for_selector("[data-testid=head-grid][data-source=corpus]", state="attached")
    assert page.get_by_test_id("badge-source-corpus").is_visible()
    assert not page.get_by_test_id("badge-source-prompt").is_visible()
    assert page.locator("[data-testid=head-cell][data-layer='4'][data-head='0'] .badge.ind").count() == 1
    if lang == "zh":
        assert_chinese(page, base_url, "the corpus survey")
    assert (clipped := page.evaluate(CLIPPED)) == [], "\n".join(clipped)
    assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    shot(page, f"survey-{width}-{lang}")
    page.get_by_test_id("survey-on-grid").uncheck()
    page.wait_for_selector("[data-testid=head-grid][data-source=prompt]", state="attached")
    # the survey's file, downloaded, opens again as the same survey
    with page.expect_download() as got:
        page.get_by_test_id("survey-download").click()
    saved = tmp_path / "saved.survey.safetensors"
    got.value.save_as(str(saved))
    page.reload()
    page.wait_for_function(READY, timeout=120_000)
    page.get_by_test_id("tool-tab-survey").click()
    page.get_by_test_id("survey-open").set_input_files(str(saved))
    page.wait_for_selector("[data-testid=survey-map][data-heads]", state="attached", timeout=60_000)
    assert "stories.txt" in page.get_by_test_id("survey-summary").text_content()
    context.close()


def test_a_binary_corpus_is_refused_in_words(page: object, base_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "image.txt"
    bad.write_bytes(b"\x89PNG\x00\x00\x00binary")
    page.goto(f"{base_url}/?text={quote(PROMPT)}&view=survey")
    page.wait_for_function(READY, timeout=120_000)
    page.get_by_test_id("survey-file").set_input_files(str(bad))
    page.get_by_test_id("survey-start").click()
    page.wait_for_function("() => document.querySelector('[data-testid=tool-error]')?.textContent.includes('binary')",
                           timeout=60_000)
