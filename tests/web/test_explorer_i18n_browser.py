"""The explorer in Chinese, in Chromium: after analysing a prompt, selecting a head, opening and
running every causal tool and a short generation, no visible text and no chart label is an
English UI word (strict: any Latin word that is not a seed term, token text or a model's own
identifier); switching back to English rewrites the same pieces without a reload; and the
tools' charts keep their labels inside at desktop and phone width, in both languages."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.support.browser import shot
from tests.support.i18n_check import english_ui_words, visible_strings
from tests.web.test_layout_browser import CLIPPED

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat"
READY = "() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy"
# each tool's sign that it drew its numbers (a data attribute its view sets once drawn)
DRAWN = {
    "attribution": "[data-testid=attribution-heatmap][data-sum]",
    "ablate": "[data-testid=ablation-kl][data-max]",
    "patch": "[data-testid=patch-heatmap][data-stages]",
    "lens": "[data-testid=logit-lens][data-stages]",
    "residual": "[data-testid=residual-chart][data-stages]",
    "qk": "[data-testid=qk-matrix][data-sum]",
    "compare": "[data-testid=head-compare][data-n]",  # last: the switch back to English checks its title
}


def assert_chinese(page: object, base_url: str, where: str) -> None:
    found = visible_strings(page)
    assert found["texts"], where
    bad = english_ui_words(found, base_url, strict=True)
    assert bad == {}, f"{where}: English words in Chinese mode: {bad}"


def open_explorer(page: object, base_url: str, lang: str) -> None:
    page.goto(f"{base_url}/?text={quote(PROMPT)}&pos=5&lang={lang}")
    page.wait_for_function(READY, timeout=120_000)


def run_tool(page: object, view: str) -> None:
    page.get_by_test_id(f"tool-tab-{view}").click()
    page.wait_for_selector(DRAWN[view], state="attached", timeout=120_000)
    if view == "ablate":  # switch one head off, then scan them all
        page.get_by_test_id("ablate-1-1").click()
        page.wait_for_selector("[data-testid=ablation-panel][data-heads='1']", timeout=60_000)
        page.get_by_test_id("ablation-scan-button").click()
        page.wait_for_selector("[data-testid=ablation-scan][data-cells]", state="attached", timeout=120_000)


def test_explorer_in_chinese_has_no_english_ui_words(page: object, base_url: str) -> None:
    open_explorer(page, base_url, "zh")
    assert page.evaluate("() => document.documentElement.lang") == "zh-CN"
    assert_chinese(page, base_url, "after analysing")
    page.locator("[data-testid=head-cell][data-layer='1'][data-head='2']").click()
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.head === '2'")
    assert_chinese(page, base_url, "a head selected")
    # the tabs are named in Chinese from the first paint (they were built before the language was chosen)
    assert page.get_by_test_id("tool-tab-attribution").text_content() == "归因"
    for view in DRAWN:
        run_tool(page, view)
        assert_chinese(page, base_url, f"tool {view}")
    # a short generation: its progress, the recorded run and its status line
    page.get_by_test_id("generate-count").fill("4")
    page.get_by_test_id("generate-button").click()
    page.wait_for_function("() => !document.querySelector('#timeline-box').hidden", timeout=120_000)
    page.wait_for_function(READY)
    status = page.get_by_test_id("generate-status").text_content()
    assert "个 token" in status, status
    assert_chinese(page, base_url, "after generating")
    shot(page, "explorer-zh-tools")
    # back to English without a reload: the same pieces now read English
    marker = page.evaluate("() => (window.__noReload = 1)")
    page.get_by_test_id("lang-switch").click()
    page.wait_for_function("() => document.documentElement.dataset.painted === 'en'")
    assert page.evaluate("() => window.__noReload") == marker
    assert page.get_by_test_id("tool-tab-attribution").text_content() == "Attribution"
    assert "tokens" in page.get_by_test_id("generate-status").text_content()
    assert "Badges" in page.get_by_test_id("badge-legend").text_content()
    assert "causal mask" in page.get_by_test_id("mask-legend").text_content()
    page.wait_for_selector(DRAWN["compare"], state="attached")
    assert page.evaluate("() => document.querySelector('[data-testid=compare-a]').layout.title.text").startswith("A: this prompt")


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("width", [1400, 390])
def test_tools_keep_their_labels_inside_at_both_widths(browser: object, base_url: str, width: int, lang: str) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    open_explorer(page, base_url, lang)
    for view in DRAWN:
        run_tool(page, view)
        assert (clipped := page.evaluate(CLIPPED)) == [], f"{view}: " + "\n".join(clipped)
        assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth"), view
        if view in ("ablate", "patch"):
            shot(page, f"explorer-tools-{view}-{width}-{lang}")
    context.close()
