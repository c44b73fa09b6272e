"""The explorer's answers where the person acted, and its layout (issue 27), in Chromium: the Run
JSON refusal by the export buttons, a long paste's way forward, the head grid of 12 heads, the
zoom notice clear of the language button, compare's default pair, and the smaller views."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.services.engine import Engine
from tests.support.tiny import make_engine

pytestmark = pytest.mark.browser
READY = "() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy"


def open_explorer(page: object, url: str, text: str, model: str | None = None, lang: str = "en") -> None:
    page.goto(f"{url}/?text={quote(text)}&lang={lang}" + (f"&model={model}" if model else ""))
    page.wait_for_function(READY, timeout=120_000)


@pytest.fixture(scope="module")
def small_url(bundled_engine: Engine) -> Iterator[str]:
    """The bundled models behind a server that sends at most 32,768 attention cells a request (the
    thumbnails of 64 tokens) and takes at most 64 tokens a prompt: the JSON export of 48 tokens is
    refused, a paragraph is too long."""
    from tests.support.servers import serve

    models = {name: bundled_engine.model(name) for name in ("attnscope-tiny", "minilm-l6")}
    engine = make_engine(models, "attnscope-tiny", max_tokens=64)
    with serve(create_app(Settings(models={}, default_model="attnscope-tiny", max_cells=32_768), engine)) as url:
        yield url


def drop_expected_422(page: object) -> None:
    """Chromium logs a refused request (status 422) in the console: that one is expected."""
    refused = [e for e in page.console_watch.errors if "status of 422" in e]
    assert len(refused) == 1, page.console_watch.errors
    page.console_watch.errors.remove(refused[0])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_run_json_refusal_is_said_by_its_button_and_cleared_by_the_next_export(page: object, small_url: str,
                                                                                   lang: str) -> None:
    open_explorer(page, small_url, "The cat sat on the mat and looked at the dog. " * 4, lang=lang)
    n = int(page.get_by_test_id("heatmap").get_attribute("data-n"))
    page.get_by_test_id("export-json").click()
    said = page.get_by_test_id("export-error")
    said.wait_for()
    text = said.text_content()
    assert f"{n * (n + 1) // 2 * 48:,}" in text and "32,768" in text  # the causal cells of 8 heads x 6 layers, the limit
    assert ("Run data (safetensors)" in text) if lang == "en" else ("safetensors" in text and "注意力" in text), text
    assert page.get_by_test_id("error-message").is_hidden()  # not under the prompt, far from the button
    button, at = page.get_by_test_id("export-json").bounding_box(), said.bounding_box()
    assert 0 <= at["y"] - (button["y"] + button["height"]) < 60, (button, at)
    drop_expected_422(page)
    with page.expect_download() as kept:
        page.get_by_test_id("export-kept").click()
    assert kept.value.suggested_filename.endswith(".safetensors")
    page.wait_for_function("() => document.querySelector('[data-testid=export-error]').hidden")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_paste_over_the_limit_offers_its_first_tokens(page: object, small_url: str, lang: str) -> None:
    """A prompt over the model's limit was refused with no way forward: the refusal now has a button
    that analyses the text's first limit tokens; a note says what was kept, the box keeps the paste."""
    open_explorer(page, small_url, "dog bites man", lang=lang)
    long = "The cat sat on the mat and looked at the dog. " * 12  # about 130 tokens; this server takes 64
    page.get_by_test_id("prompt-input").fill(long)
    page.get_by_test_id("analyze-button").click()
    offer = page.get_by_test_id("error-offer")
    offer.wait_for()
    assert offer.text_content() == ("Analyse the first 64 tokens" if lang == "en" else "分析前 64 个 token")
    said = page.get_by_test_id("error-message").text_content()
    assert ("limit of 64" if lang == "en" else "上限 64") in said, said
    drop_expected_422(page)
    offer.click()
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n === '64'"
                           " && !document.body.dataset.busy", timeout=60_000)
    assert page.get_by_test_id("error-message").is_hidden()
    note = page.get_by_test_id("truncated-note").text_content()
    assert "64" in note and f"{len(long)}" in note
    assert ("first 64 tokens" in note) if lang == "en" else ("前 64 个 token" in note), note
    assert page.get_by_test_id("prompt-input").input_value() == long
    assert page.get_by_test_id("token").count() == 64


# Each head cell lies inside the grid's visible box and its panel, side to side (the grid has no
# hidden sideways overflow), and top to bottom too, or else the grid scrolls down to it.
CELLS_OUT = """() => {
  const grid = document.querySelector('[data-testid=head-grid]');
  const panel = grid.closest('.panel').getBoundingClientRect(), g = grid.getBoundingClientRect();
  const left = g.left + grid.clientLeft, right = left + grid.clientWidth;
  const top = g.top + grid.clientTop, bottom = top + grid.clientHeight;
  const scrolls = grid.scrollHeight > grid.clientHeight && ['auto', 'scroll'].includes(getComputedStyle(grid).overflowY);
  const cells = [...grid.querySelectorAll('[data-testid=head-cell]')];
  const out = cells.filter((c) => {
    const r = c.getBoundingClientRect();
    const across = r.left >= left - 0.5 && r.right <= right + 0.5 && r.left >= panel.left && r.right <= panel.right;
    const down = (r.top >= top - 0.5 && r.bottom <= bottom + 0.5) || scrolls;
    return !(across && down);
  }).map((c) => `L${c.dataset.layer}H${c.dataset.head}`);
  return {out, cells: cells.length, sideways: grid.scrollWidth - grid.clientWidth, width: Math.min(...cells.map((c) => c.getBoundingClientRect().width))};
}"""


@pytest.mark.parametrize("width", [1400, 1920])
@pytest.mark.parametrize(("model", "cells"), [("minilm-l6", 6 * 12), ("attnscope-tiny", 6 * 8)])
def test_every_head_cell_is_inside_the_grid_panel(browser: object, base_url: str, width: int, model: str,
                                                  cells: int) -> None:
    """minilm-l6's 12 heads a layer put 24 of its 72 thumbnails outside the panel, with no visible
    scrollbar: the grid's column widens for more than 8 heads, and a layer that still does not fit
    wraps onto more lines."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    open_explorer(page, base_url, "dog bites man and the man bites the dog back", model)
    page.wait_for_function("(n) => document.querySelectorAll('[data-testid=head-cell]').length === n", arg=cells)
    got = page.evaluate(CELLS_OUT)
    assert got["out"] == [] and got["sideways"] <= 1, got
    assert got["width"] >= 34  # still a readable thumbnail
    heat = page.get_by_test_id("heatmap").bounding_box()
    assert heat["width"] >= 380  # the heatmap keeps its room
    page.close()


def test_a_narrow_grid_wraps_each_layer(browser: object, base_url: str) -> None:
    """Where 12 cells of 34 px do not fit (a phone), each layer takes two lines, its label spanning them."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    open_explorer(page, base_url, "dog bites man", "minilm-l6")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell]').length === 72")
    got = page.evaluate(CELLS_OUT)
    assert got["out"] == [] and got["sideways"] <= 1, got
    assert page.get_by_test_id("head-grid").get_attribute("data-lines") == "2"
    page.close()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_encoders_legend_says_full_attention(page: object, base_url: str, lang: str) -> None:
    """The encoder's heatmap legend described a causal mask: it says full (bidirectional) attention,
    without the hatched swatch, in both languages; a decoder's still describes its causal mask."""
    open_explorer(page, base_url, "dog bites man", "minilm-l6", lang=lang)
    legend = page.get_by_test_id("mask-legend")
    full, masked = ("bidirectional", "future tokens this query cannot see") if lang == "en" else ("双向", "看不到的未来")
    assert full in legend.text_content() and masked not in legend.text_content()
    assert page.locator("#legend-swatch").is_hidden()
    page.get_by_test_id("lang-switch").click()  # the other language, without a reload
    other = "双向" if lang == "en" else "bidirectional"
    page.wait_for_function("(w) => document.querySelector('[data-testid=mask-legend]').textContent.includes(w)", arg=other)
    page.get_by_test_id("lang-switch").click()
    page.wait_for_function("(w) => document.querySelector('[data-testid=mask-legend]').textContent.includes(w)", arg=full)
    open_explorer(page, base_url, "dog bites man", "attnscope-tiny", lang=lang)
    assert masked in legend.text_content() and full not in legend.text_content()
    assert page.locator("#legend-swatch").is_visible()


def test_a_variation_selector_shows_as_its_code_point(page: object, base_url: str) -> None:
    """U+FE0F (❤ -> ❤️) made an empty token chip of its own, where a ZWJ shows as ‹U+200D›: shown the same
    way when nothing in its token comes before it; after its character it is left to draw the emoji."""
    open_explorer(page, base_url, "I \u2764\ufe0f it")
    chips = page.locator("[data-testid=token] .t").all_text_contents()
    assert "‹U+FE0F›" in chips, chips
    assert all(c.strip() for c in chips), chips  # no chip without a visible character
    shown = page.evaluate("""async () => {
        const { showToken } = await import('/static/js/dom.js');
        return ['\\ufe0f', '\\u2764\\ufe0f', ' \\ufe0f', '\\u200d'].map(showToken);
    }""")
    assert shown == ["‹U+FE0F›", "\u2764\ufe0f", "␣‹U+FE0F›", "‹U+200D›"]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_head_grids_buttons_fit_on_one_line(browser: object, base_url: str, lang: str) -> None:
    """At 1,400 px the head grid's SVG button wrapped onto a line of its own."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    open_explorer(page, base_url, "dog bites man", lang=lang)
    boxes = {name: page.locator(sel).bounding_box() for name, sel in
             [("sort", "#grid-sort"), ("png", "#grid-png"), ("svg", "#grid-svg"), ("tools", ".grid-tools")]}
    middle = {k: b["y"] + b["height"] / 2 for k, b in boxes.items() if k != "tools"}
    assert max(middle.values()) - min(middle.values()) < 4, boxes
    assert boxes["svg"]["x"] + boxes["svg"]["width"] <= boxes["tools"]["x"] + boxes["tools"]["width"] + 0.5
    page.close()


def test_compares_default_second_prompt_has_as_many_tokens(page: object, base_url: str) -> None:
    """Compare's default second prompt swapped the first two words ("cat The sat …": 15 tokens against
    14, the first word's space moving): it swaps the second and third, so that every example the page
    offers, and the default prompt, line up with their reordering position by position."""
    page.goto(f"{base_url}/?view=compare")
    page.wait_for_selector("[data-testid=head-compare][data-n]", state="attached", timeout=60_000)
    examples = page.evaluate("() => [...document.querySelectorAll('.example')].map((b) => b.dataset.example)")
    assert "The cat sat on the mat. The cat sat on the mat." in examples and len(examples) >= 4
    for text in [page.get_by_test_id("prompt-input").input_value(), *examples]:
        page.goto(f"{base_url}/?text={quote(text)}&view=compare")
        page.wait_for_selector("[data-testid=head-compare][data-n]", state="attached", timeout=60_000)
        other = page.get_by_test_id("compare-prompt").input_value()
        assert other != text
        n = int(page.get_by_test_id("heatmap").get_attribute("data-n"))
        assert page.get_by_test_id("compare-note").text_content().startswith(f"Both prompts have {n} tokens."), (text, other)


def test_a_double_click_zooms_out_clears_the_note_and_keeps_the_focused_token(page: object, base_url: str) -> None:
    """A double-click on the heatmap (plotly's zoom back out) left the range boxes' zoom note and moved
    the focused token to the cell double-clicked: the note goes, the token stays."""
    open_explorer(page, base_url, "The cat sat on the mat. The cat sat on the mat.")
    page.get_by_test_id("token").nth(3).click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('pos') === '3'")
    page.get_by_test_id("zoom-q0").fill("2")
    page.get_by_test_id("zoom-q1").fill("99")  # clamped to 13: the note says so
    page.get_by_test_id("zoom-apply").click()
    note = page.get_by_test_id("zoom-note")
    note.wait_for()
    page.get_by_test_id("heatmap").scroll_into_view_if_needed()
    box = page.locator("[data-testid=heatmap] .nsewdrag").bounding_box()
    x, y = box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.7  # a cell of another query
    page.mouse.move(x, y)
    page.mouse.dblclick(x, y)
    page.wait_for_function("() => document.querySelector('#zoom-q0').value === ''")  # zoomed back out
    page.wait_for_timeout(500)  # the clicks' selection, had it moved, would be in by now
    assert note.is_hidden()
    assert page.evaluate("() => new URLSearchParams(location.search).get('pos')") == "3"
    assert "selected" in (page.get_by_test_id("token").nth(3).get_attribute("class") or "")
    page.mouse.click(x, y)  # a single click still picks that cell
    page.wait_for_function("() => new URLSearchParams(location.search).get('pos') !== '3'")


@pytest.mark.parametrize("width", [1400, 390])
def test_the_zoom_notice_does_not_cover_the_language_button(browser: object, base_url: str, width: int) -> None:
    """plotly's "Double-click to zoom back out" notice, shown after a drag-zoom, sat over the header's
    language button (fixed, 50 px from the top): it is shown at the bottom right."""
    page = browser.new_page(viewport={"width": width, "height": 844})
    open_explorer(page, base_url, "The cat sat on the mat. The cat sat on the mat.")
    page.get_by_test_id("heatmap").scroll_into_view_if_needed()
    box = page.locator("[data-testid=heatmap] .nsewdrag").bounding_box()
    x, y = box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 60, y + 60, steps=6)
    page.mouse.up()
    page.wait_for_selector(".plotly-notifier .notifier-note")
    page.evaluate("() => window.scrollTo(0, 0)")  # the header in view, the notice fixed where it is
    got = page.evaluate("""() => {
      const r = (s) => document.querySelector(s).getBoundingClientRect();
      const a = r('.plotly-notifier .notifier-note'), b = r('[data-testid=lang-switch]');
      const overlap = Math.min(a.right, b.right) > Math.max(a.left, b.left) && Math.min(a.bottom, b.bottom) > Math.max(a.top, b.top);
      return {overlap, note: [a.left, a.top, a.right, a.bottom], lang: [b.left, b.top, b.right, b.bottom], h: innerHeight, w: innerWidth};
    }""")
    assert not got["overlap"], got
    assert got["note"][1] >= 0 and got["note"][3] <= got["h"] and got["note"][2] <= got["w"], got  # still in view
    page.close()
