"""End to end in headless Chromium on the bundled model: what a person sees and clicks."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from attnscope.model.load.models import BUNDLED_DIR
from tests.support.browser import ConsoleWatch, shot

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat on the mat."
XSS = "<img src=x onerror=window.__pwned=1> and \"'><script>window.__pwned=2</script>"
_CONFIG = json.loads((BUNDLED_DIR / "attnscope-tiny" / "config.json").read_text())
BUNDLED_HEADS = _CONFIG["num_hidden_layers"] * _CONFIG["num_attention_heads"]  # the head grid's cells


def heatmap_state(page: object) -> dict:
    return page.evaluate("""() => {
        const div = document.querySelector('[data-testid=heatmap]');
        const heat = div.data.find(t => t.type === 'heatmap');
        return {n: Number(div.dataset.n), layer: Number(div.dataset.layer), head: Number(div.dataset.head),
                rows: heat.z.length, cols: heat.z.map(r => r.length), z: heat.z,
                ticks: div.layout.xaxis.ticktext, masked: div.data.some(t => t.fillpattern)};
    }""")


def analyse(page: object, base_url: str, text: str, model: str | None = None) -> None:
    """Open the explorer (which analyses its example on load), then analyse ``text``."""
    page.goto(base_url + "/")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy")
    before = page.evaluate("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt")
    if model:
        page.get_by_test_id("model-picker").select_option(model)
    page.get_by_test_id("prompt-input").fill(text)
    page.get_by_test_id("analyze-button").click()
    page.wait_for_function("(before) => { const d = document.querySelector('[data-testid=heatmap]').dataset;"
                           " return d.drawnAt !== before && !document.body.dataset.busy; }", arg=before, timeout=60_000)


def test_analyse_draws_n_by_n_heatmap_with_token_labels(page: object, base_url: str) -> None:
    analyse(page, base_url, PROMPT)
    chips = page.get_by_test_id("token")
    n = chips.count()
    assert n >= 10
    state = heatmap_state(page)
    assert state["n"] == n and state["rows"] == n and state["cols"] == [n] * n
    assert state["masked"], "the causal mask is drawn as its own hatched layer"
    assert state["z"][0][1] is None and state["z"][n - 1][0] is not None  # future cells empty, past filled
    assert "␣cat" in state["ticks"] and "The" in state["ticks"]
    page.wait_for_function("(n) => document.querySelectorAll('[data-testid=head-cell] canvas').length === n",
                           arg=BUNDLED_HEADS)
    assert page.get_by_test_id("head-cell").count() == BUNDLED_HEADS
    shot(page, "explorer")


def test_clicking_a_head_cell_changes_the_heatmap(page: object, base_url: str) -> None:
    analyse(page, base_url, PROMPT)
    before = heatmap_state(page)
    page.locator("[data-testid=head-cell][data-layer='2'][data-head='5']").click()
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.layer === '2'")
    after = heatmap_state(page)
    assert (after["layer"], after["head"]) == (2, 5)
    assert after["z"] != before["z"]
    assert "selected" in page.locator("[data-testid=head-cell][data-layer='2'][data-head='5']").get_attribute("class")
    shot(page, "head-grid-selected")


def test_clicking_a_token_updates_focus(page: object, base_url: str) -> None:
    analyse(page, base_url, PROMPT)
    page.get_by_test_id("token").nth(4).click()
    page.wait_for_function("() => document.querySelector('[data-testid=focus-chart]').data[0].y.length === 5")
    weights = page.evaluate("() => document.querySelector('[data-testid=focus-chart]').data[0].y")
    assert sum(weights) == pytest.approx(1.0, abs=0.03)
    assert page.locator("[data-testid=focus-lines] line").count() == 5
    shot(page, "token-focus")


def test_next_token_chart_has_k_bars_summing_to_at_most_one(page: object, base_url: str) -> None:
    analyse(page, base_url, PROMPT)
    page.wait_for_function("() => document.querySelector('[data-testid=next-token-chart]').data")
    probs = page.evaluate("() => document.querySelector('[data-testid=next-token-chart]').data[0].x")
    assert len(probs) == 10 and sum(probs) <= 1 + 1e-6 and probs == sorted(probs, reverse=True)
    first = probs[0]
    # rank 1 is drawn at the top, rank 10 at the bottom (the labels "1".."10" were read as numbers: 1 at the bottom)
    tops = page.evaluate("() => [...document.querySelectorAll('[data-testid=next-token-chart] .barlayer .point')]"
                         ".map((p) => p.getBoundingClientRect().top)")
    assert len(tops) == 10 and tops == sorted(tops), tops
    ranks = page.evaluate("() => [...document.querySelectorAll('[data-testid=next-token-chart] .ytick text')]"
                          ".sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top).map((t) => t.textContent)")
    assert ranks == [str(r) for r in range(1, 11)], ranks
    page.get_by_test_id("temperature").fill("0.3")
    page.wait_for_function(f"() => document.querySelector('[data-testid=next-token-chart]').data[0].x[0] > {first}")
    assert "rank" in page.get_by_test_id("next-actual").text_content() or "Last position" in page.get_by_test_id("next-actual").text_content()
    shot(page, "next-token")


def test_url_round_trips(page: object, base_url: str, browser: object) -> None:
    analyse(page, base_url, PROMPT)
    page.locator("[data-testid=head-cell][data-layer='1'][data-head='3']").click()
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.head === '3'")
    page.get_by_test_id("token").nth(6).click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('pos') === '6'")
    url = page.url
    q = parse_qs(urlparse(url).query)
    assert q["text"] == [PROMPT] and q["layer"] == ["1"] and q["head"] == ["3"] and q["model"] == ["attnscope-tiny"]
    other = browser.new_page()
    watch = ConsoleWatch(other)
    other.goto(url)
    other.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n")
    state = heatmap_state(other)
    assert (state["layer"], state["head"]) == (1, 3)
    assert other.get_by_test_id("prompt-input").input_value() == PROMPT
    assert "selected" in other.get_by_test_id("token").nth(6).get_attribute("class")
    other.close()
    assert watch.errors == []


def test_a_link_to_an_unknown_model_says_so(page: object, base_url: str) -> None:
    """?model= naming a model this server lacks: the page shows the default, and says so."""
    page.goto(base_url + "/?model=nope-7b&text=dog%20bites%20man")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy")
    note = page.get_by_test_id("model-note")
    assert note.is_visible()
    text = note.text_content()
    assert "nope-7b" in text and "attnscope-tiny" in text
    assert page.get_by_test_id("model-picker").input_value() == "attnscope-tiny"
    page.get_by_test_id("lang-switch").click()  # the note follows the language
    page.wait_for_function("() => /[\u4e00-\u9fff]/.test(document.querySelector('[data-testid=model-note]').textContent)")
    assert "nope-7b" in note.text_content()
    page.goto(base_url + "/?model=attnscope-tiny&text=dog%20bites%20man")  # a served model: no note
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt")
    assert not page.get_by_test_id("model-note").is_visible()


def test_hostile_prompt_stays_text(page: object, base_url: str) -> None:
    analyse(page, base_url, XSS)
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("#tokens img, #tokens script").count() == 0
    shown = "".join(page.locator("[data-testid=token] .t").all_text_contents())
    assert "<img" in shown and "onerror" in shown
    assert page.locator("#heatmap img[src='x']").count() == 0
    shot(page, "hostile-prompt")


def test_error_is_shown_readably(page: object, base_url: str) -> None:
    page.goto(base_url + "/")
    page.get_by_test_id("prompt-input").fill("   ")
    page.get_by_test_id("analyze-button").click()
    err = page.get_by_test_id("error-message")
    err.wait_for(state="visible")
    assert "empty" in err.text_content()
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]


def test_encoder_shows_full_attention(page: object, base_url: str) -> None:
    analyse(page, base_url, "dog bites man", model="minilm-l6")
    state = heatmap_state(page)
    assert state["n"] == 5 and len(state["z"][0]) == 5  # [CLS] dog bites man [SEP]
    assert not state["masked"] and all(v is not None for v in state["z"][0])  # the first token sees the last
    assert page.get_by_test_id("head-cell").count() == 72
    assert page.locator(".next-panel").is_hidden()
    shot(page, "encoder")


def test_generate_and_record_fills_rows_then_timeline(page: object, base_url: str) -> None:
    analyse(page, base_url, "The cat sat on the")
    n0 = page.get_by_test_id("token").count()
    page.fill("#gen-count", "6")
    page.fill("#gen-temp", "1")  # sampled (seed 0), so that an early end-of-text is unlikely
    page.get_by_test_id("generate-button").click()
    page.wait_for_function("() => !document.querySelector('#timeline-box').hidden", timeout=60_000)
    steps = int(page.get_by_test_id("timeline").get_attribute("max"))
    state = heatmap_state(page)
    n = page.get_by_test_id("token").count()
    assert 1 <= steps <= 6 and n == n0 + steps and state["n"] == n and state["rows"] == n
    page.get_by_test_id("tool-tab-attribution").click()  # an open tool follows the timeline too
    page.wait_for_selector("[data-testid=attribution-heatmap]")
    page.get_by_test_id("timeline").fill("0")
    page.wait_for_function(f"() => document.querySelector('[data-testid=heatmap]').data.find(t => t.type === 'heatmap').z.length === {n0}")
    page.wait_for_function(f"() => document.querySelector('[data-testid=tool-view-attribution]').textContent.includes('at position {n0 - 1} ')")
    # the heading counts the step's tokens; the caption says its scores are the whole run's
    page.wait_for_function(f"() => document.querySelector('#heat-title').textContent === '{n0} tokens'")
    assert f"the whole run's, {n} tokens" in page.get_by_test_id("heat-caption").text_content()
    page.get_by_test_id("lang-switch").click()  # the step's heading and caption follow the language too
    page.wait_for_function(f"() => document.querySelector('#heat-title').textContent === '{n0} 个 token'")
    assert "整个运行" in page.get_by_test_id("heat-caption").text_content()
    page.get_by_test_id("lang-switch").click()
    # another head is drawn whole: the timeline returns to its end, the heading to every token
    page.locator("[data-testid=head-cell][data-layer='1'][data-head='2']").click()
    page.wait_for_function(f"() => document.querySelector('#heat-title').textContent === '{n} tokens'")
    assert page.get_by_test_id("timeline").input_value() == str(steps)
    assert "whole run" not in page.get_by_test_id("heat-caption").text_content()
    # the rest of the explorer moves with it: the prompt's last token is focused, and the next-token
    # panel shows what the model predicted there, the first generated token being the actual one
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('pos') === '{n0 - 1}'")
    assert "selected" in page.get_by_test_id("token").nth(n0 - 1).get_attribute("class")
    first = page.get_by_test_id("token").nth(n0).locator(".t").text_content()
    page.wait_for_function("() => document.querySelector('[data-testid=next-actual]').textContent.includes('rank')")
    actual = page.get_by_test_id("next-actual").text_content()
    assert actual.startswith("Actual next token") and first in actual
    page.get_by_test_id("timeline").fill(str(steps))
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('pos') === '{n - 1}'")
    shot(page, "recorded-generation")


def test_grouped_query_heads_are_grouped(page: object, base_url: str) -> None:
    analyse(page, base_url, "dog bites man", model="tiny-qwen2-gqa")
    labels = page.get_by_test_id("kv-group").all_text_contents()
    assert labels == ["K/V head 0: q 0–1", "K/V head 1: q 2–3"]
    assert "2 K/V heads" in page.get_by_test_id("model-summary").text_content()
    assert "shares K/V head 1" in page.locator("[data-testid=head-cell][data-layer='0'][data-head='3']").get_attribute("title")


def test_sparsity_sort_zoom_and_exports(page: object, base_url: str) -> None:
    analyse(page, base_url, PROMPT)
    page.wait_for_function("() => document.querySelector('[data-testid=head-cell]').dataset.keys90")
    page.select_option("#grid-sort", "keys_90")
    values = [float(v) for v in page.eval_on_selector_all("[data-testid=head-cell]", "els => els.map(e => e.dataset.keys90 || 'NaN')")]
    assert len(values) == BUNDLED_HEADS and values == sorted(values)  # sorted cells carry their measured sparsity
    first = page.locator("[data-testid=head-cell]").first.get_attribute("title")
    assert "keys holding 90%" in first
    for field, value in (("q0", "3"), ("q1", "8"), ("k0", "0"), ("k1", "5")):
        page.fill(f"#zoom-{field}", value)
    page.get_by_test_id("zoom-apply").click()
    ranges = page.evaluate("() => { const l = document.querySelector('[data-testid=heatmap]').layout; return [l.xaxis.range, l.yaxis.range]; }")
    assert ranges == [[-0.5, 5.5], [8.5, 2.5]]
    with page.expect_download() as svg:
        page.get_by_test_id("export-svg").click()
    assert svg.value.suggested_filename.endswith(".svg")
    # the image says what it shows, and leaves out the page's selection box
    image = Path(svg.value.path()).read_text(encoding="utf-8")
    layer, head = heatmap_state(page)["layer"], heatmap_state(page)["head"]
    assert f"attnscope-tiny · layer {layer} head {head} · {heatmap_state(page)['n']} tokens" in image
    assert "#d6336c" not in image and "rgb(214, 51, 108)" not in image
    with page.expect_download() as png:
        page.get_by_test_id("export-png").click()
    assert Path(png.value.path()).read_bytes()[:4] == b"\x89PNG"
    with page.expect_download() as run_json:
        page.get_by_test_id("export-json").click()
    assert run_json.value.suggested_filename.endswith(".json")
    with page.expect_download() as grid_png:
        page.click("#grid-png")
    assert grid_png.value.suggested_filename == "attnscope-heads.png"


def test_every_chart_offers_svg_and_long_runs_zoom(page: object, base_url: str) -> None:
    words = ("the cat sat on the mat and the dog ran to the park while it rained " * 60).strip()
    analyse(page, base_url, words)
    n = heatmap_state(page)["n"]
    assert n >= 900
    for testid in ("heatmap", "focus-chart", "next-token-chart"):
        page.wait_for_function(f"() => document.querySelector('[data-testid={testid}]')._fullLayout")
        names = page.evaluate(f"() => document.querySelector('[data-testid={testid}]')._context.modeBarButtonsToAdd.map(b => b.name)")
        assert "Download plot as SVG" in names, testid
    # a run this long is drawn from tiles: the zoom asks for the window's tile, exact at this size
    for field, value in (("q0", "900"), ("q1", str(n - 1)), ("k0", "0"), ("k1", "99")):
        page.fill(f"#zoom-{field}", value)
    page.get_by_test_id("zoom-apply").click()
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').layout.xaxis.range[1] === 99.5")
    ranges = page.evaluate("() => { const l = document.querySelector('[data-testid=heatmap]').layout; return [l.xaxis.range, l.yaxis.range]; }")
    assert ranges == [[-0.5, 99.5], [n - 0.5, 899.5]]
    assert heatmap_state(page)["rows"] == n - 900 and page.get_by_test_id("heatmap").get_attribute("data-exact") == "1"
    with page.expect_download() as svg:
        page.locator("[data-testid=focus-chart] [data-title='Download plot as SVG']").click()
    assert svg.value.suggested_filename.endswith(".svg")
    shot(page, "zoom-1024")


def test_repeated_sentence_example_shows_an_induction_head(page: object, base_url: str) -> None:
    """The bundled model's induction head, on the explorer's own example: a head cell carries the
    *ind* badge, and its score is the engine's."""
    page.goto(base_url + "/")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy")
    page.get_by_test_id("example-repeat").click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('text') === "
                           "'The cat sat on the mat. The cat sat on the mat.' && !document.body.dataset.busy")
    page.wait_for_function("() => document.querySelector('[data-testid=head-cell] [data-badge=ind]')", timeout=30_000)
    cell = page.locator("[data-testid=head-cell]:has([data-badge=ind])").first
    assert int(cell.get_attribute("data-layer")) > 0  # an induction head reads a previous-token head's output
    shot(page, "induction-example")


def test_a_failed_analyse_marks_the_previous_runs_panels(page: object, base_url: str) -> None:
    """The new prompt sits above the last run's panels when its analyse is refused: they are faded and a
    note names the prompt they show, until a run loads again."""
    analyse(page, base_url, PROMPT)
    assert page.get_by_test_id("stale-note").is_hidden()

    def refuse(route: object) -> None:
        if route.request.method == "POST":
            route.fulfill(status=422, content_type="application/json", json={"detail": "the prompt is refused (test)"})
        else:
            route.fallback()

    page.route("**/api/runs", refuse)
    page.get_by_test_id("prompt-input").fill("A different prompt entirely")
    page.get_by_test_id("analyze-button").click()
    page.wait_for_selector("[data-testid=stale-note]:not([hidden])")
    note = page.get_by_test_id("stale-note").text_content()
    assert PROMPT in note and "previous prompt" in note
    assert page.evaluate("() => document.body.dataset.stale") == "1"
    assert page.evaluate("() => getComputedStyle(document.querySelector('#explorer')).opacity") == "0.45"
    assert "refused (test)" in page.get_by_test_id("error-message").text_content()
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]  # the refusal, expected
    # a run that loads clears the mark
    page.unroute("**/api/runs", refuse)
    page.get_by_test_id("analyze-button").click()
    page.wait_for_selector("[data-testid=stale-note][hidden]", state="attached", timeout=60_000)
    assert page.evaluate("() => document.body.dataset.stale") == "0"
    assert page.evaluate("() => getComputedStyle(document.querySelector('#explorer')).opacity") == "1"


def test_a_refused_generation_says_so_by_the_generate_button(page: object, base_url: str) -> None:
    analyse(page, base_url, PROMPT)
    page.route("**/api/generate", lambda route: route.fulfill(status=422, content_type="application/json",
                                                             json={"detail": "generation refused (test)"}))
    page.get_by_test_id("generate-button").click()
    page.wait_for_selector("[data-testid=generate-status]:not([hidden])")
    status = page.get_by_test_id("generate-status").text_content()
    assert "Generation failed" in status and "generation refused (test)" in status
    gap = page.evaluate("""() => document.querySelector('[data-testid=generate-status]').getBoundingClientRect().top
        - document.querySelector('[data-testid=generate-button]').getBoundingClientRect().bottom""")
    assert 0 <= gap < 80
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]  # the refusal, expected
