"""Keyboard and screen-reader access in Chromium (issue 27): the tool tabs are an ARIA tablist
that arrow keys move through, a plotly chart is at most one tab stop, the attribution selects
have names, and the Ctrl+Enter shortcut is written beside the Run button, in English and Chinese."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat on the mat."
CJK = re.compile(r"[\u4e00-\u9fff]")

# Per chart: the focusable elements plotly put inside it (the chart's own tabindex counts as one)
# and whether its mode bar is a toolbar.
CHART_STOPS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter((gd) => gd.offsetParent).map((gd) => {
  const inside = [...gd.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')].filter((e) => e.tabIndex >= 0);
  const bar = gd.querySelector('.modebar');
  return {name: gd.dataset.testid || gd.id, stops: inside.length + (gd.tabIndex >= 0 ? 1 : 0),
          buttons: gd.querySelectorAll('.modebar-btn').length, toolbar: bar ? bar.getAttribute('role') : null};
})"""


def open_view(page: object, base_url: str, view: str, lang: str = "en") -> None:
    page.goto(f"{base_url}/?{urlencode({'text': PROMPT, 'model': 'attnscope-tiny', 'pos': '9', 'view': view, 'lang': lang})}")
    page.wait_for_selector(f"[data-testid=tool-view-{view}]")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy",
                           timeout=120_000)


def tabs(page: object) -> list[dict]:
    return page.evaluate("""() => [...document.querySelectorAll('[role=tablist] > *')].map((b) => ({
        role: b.getAttribute('role'), view: b.dataset.view, selected: b.getAttribute('aria-selected'),
        controls: b.getAttribute('aria-controls'), tabindex: b.tabIndex, focused: b === document.activeElement}))""")


def test_tool_tabs_are_a_tablist_the_arrow_keys_move_through(page: object, base_url: str) -> None:
    open_view(page, base_url, "lens")
    got = tabs(page)
    views = [b["view"] for b in got]
    assert views == ["attribution", "ablate", "patch", "lens", "residual", "compare", "qk", "survey"]
    assert all(b["role"] == "tab" and b["controls"] == "tool-panel" for b in got)
    assert [b["selected"] for b in got] == ["false", "false", "false", "true", "false", "false", "false", "false"]
    assert [b["tabindex"] for b in got] == [-1, -1, -1, 0, -1, -1, -1, -1]  # one tab stop: the open tab
    panel = page.evaluate("() => { const p = document.getElementById('tool-panel'); return [p.getAttribute('role'), p.getAttribute('aria-labelledby')]; }")
    assert panel == ["tabpanel", "tool-tab-lens"]
    assert page.evaluate("() => document.querySelector('[role=tablist]').getAttribute('aria-label')") == "Causal tools"
    page.get_by_test_id("tool-tab-lens").focus()
    for key, view in [("ArrowRight", "residual"), ("Home", "attribution"), ("ArrowLeft", "survey"), ("End", "survey"),
                      ("ArrowRight", "attribution"), ("ArrowRight", "ablate")]:
        page.keyboard.press(key)
        page.wait_for_selector(f"[data-testid=tool-view-{view}]")
        now = tabs(page)
        assert [b["view"] for b in now if b["selected"] == "true"] == [view]
        assert [b["view"] for b in now if b["focused"]] == [view]
        assert [b["view"] for b in now if b["tabindex"] == 0] == [view]
        assert page.evaluate("() => document.getElementById('tool-panel').getAttribute('aria-labelledby')") == f"tool-tab-{view}"
    assert "view=ablate" in page.url


def test_a_chart_is_at_most_one_tab_stop(page: object, base_url: str) -> None:
    open_view(page, base_url, "lens")
    page.wait_for_function("() => document.querySelector('[data-testid=logit-lens]')._fullLayout")
    charts = page.evaluate(CHART_STOPS)
    assert len(charts) >= 4
    for c in charts:
        assert c["buttons"] >= 5 and c["toolbar"] == "toolbar", c  # plotly's 8-9 buttons are there, as one toolbar
        assert c["stops"] <= 1, c  # they were 8-9 tab stops each
    # the heatmap takes focus itself (arrow keys move its cell): its mode bar adds no stop
    heat = next(c for c in charts if c["name"] == "heatmap")
    assert heat["stops"] == 1
    # Tab from the lens chart's first mode-bar button leaves the chart; arrow keys move inside it
    first = page.locator("[data-testid=logit-lens] .modebar-btn").first
    first.focus()
    names = page.evaluate("() => [...document.querySelectorAll('[data-testid=logit-lens] .modebar-btn')].map(b => b.dataset.title)")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("() => document.activeElement.dataset.title") == names[1]
    page.keyboard.press("End")
    assert page.evaluate("() => document.activeElement.dataset.title") == names[-1]
    assert page.evaluate("() => getComputedStyle(document.activeElement.closest('.modebar')).opacity") == "1"  # seen while focused
    page.keyboard.press("Tab")
    assert page.evaluate("() => !document.activeElement.closest('[data-testid=logit-lens]')")
    # the whole page: far fewer stops than 9 a chart
    total = page.evaluate("""() => [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
        .filter((e) => e.tabIndex >= 0 && !e.disabled && e.offsetParent).length""")
    inside = sum(c["stops"] for c in charts)
    assert inside <= len(charts) and total < 60, (total, inside)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_attribution_selects_have_labels(page: object, base_url: str, lang: str) -> None:
    open_view(page, base_url, "attribution", lang)
    page.wait_for_function("() => document.querySelector('[data-testid=attribution-heatmap]').data")
    names = page.evaluate("""() => [...document.querySelectorAll('[data-testid=tool-view-attribution] select')].map((s) => ({
        label: s.labels.length ? s.labels[0].textContent.trim() : '', aria: s.getAttribute('aria-label') || ''}))""")
    assert len(names) == 2
    for n in names:
        assert n["label"] and n["aria"].lower().startswith(n["label"].rstrip("：: ").lower()), n  # the name holds the visible words
        assert bool(CJK.search(n["aria"])) == (lang == "zh"), n
    name = "Logit of" if lang == "en" else "logit："
    assert page.get_by_role("combobox", name=name).count() == 1
    # the label is the select's: clicking it focuses the select
    page.locator("[data-testid=tool-view-attribution] label").nth(1).click()
    assert page.evaluate("() => document.activeElement.dataset.testid") == "attribution-token-b"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_ctrl_enter_is_written_beside_the_run_button(page: object, base_url: str, lang: str) -> None:
    page.goto(f"{base_url}/?{urlencode({'text': 'I love artificial intelligence', 'lang': lang})}")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy",
                           timeout=120_000)
    button = page.get_by_test_id("analyze-button")
    assert "Ctrl+Enter" in button.get_attribute("title") and button.get_attribute("aria-keyshortcuts") == "Control+Enter"
    hint = page.get_by_test_id("run-hint")
    assert hint.is_visible() and "Ctrl+Enter" in hint.text_content()
    assert bool(CJK.search(hint.text_content())) == (lang == "zh") and bool(CJK.search(button.get_attribute("title"))) == (lang == "zh")
    assert page.get_by_test_id("prompt-input").get_attribute("aria-describedby") == "run-hint"
    # and it does what it says
    page.get_by_test_id("prompt-input").fill("the dog bites the man")
    page.get_by_test_id("prompt-input").press("Control+Enter")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n === '5'", timeout=120_000)
