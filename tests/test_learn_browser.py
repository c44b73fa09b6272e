"""The nine Learn views in Chromium: each draws the model's real numbers, in two languages,
and the language switches without a reload."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, quote, urlparse

import pytest

from tests.browser import ARTIFACTS, ConsoleWatch, shot
from tests.i18n_check import english_ui_words, visible_strings

pytestmark = pytest.mark.browser
PROMPT = "I love artificial intelligence"
CJK = re.compile(r"[\u4e00-\u9fff]")
READY = "() => document.querySelectorAll('.lesson-body[data-ready]').length === 9"
MEASURED = "() => document.querySelector('.lessons').dataset.measured === '1'"


def open_learn(page: object, base_url: str, query: str = "", text: str = PROMPT, measured: bool = True) -> None:
    page.goto(f"{base_url}/learn?text={quote(text)}{query}")
    page.wait_for_function(READY, timeout=600_000)
    if measured:
        page.wait_for_function(MEASURED, timeout=600_000)


def js(page: object, expr: str) -> object:
    return page.evaluate(f"() => {{ const q = (id) => document.querySelector(`[data-testid=${{id}}]`); return {expr}; }}")


def lesson_texts(page: object) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('.lesson')].map(s => s.innerText)")


def test_nine_views_draw_real_numbers(page: object, base_url: str) -> None:
    open_learn(page, base_url, "&lang=en")
    n = 4  # "I love artificial intelligence" is 4 tokens for the bundled tokenizer
    # 1: the RNN's n-1, n-2, ... updates beside one attention step; weights and shares
    assert js(page, "q('l1-path').data.map(t => t.y)") == [[3, 2, 1, 0], [1, 1, 1, 1]]
    assert js(page, "q('l1-chart').data.map(t => t.y.length)") == [n, n]
    # the head shown first is one where the largest weight and the largest contribution differ
    weights, shares = js(page, "q('l1-chart').data.map(t => t.y)")
    assert weights.index(max(weights)) != shares.index(max(shares))
    assert sum(shares) == pytest.approx(1, abs=1e-4)
    # 2: one row per position; timing on the prompt and on 64 tokens
    assert js(page, "q('l2-table').querySelectorAll('tbody tr').length") == n
    assert js(page, "q('l2-timing').data.slice(0, 2).map(t => t.y.length)") == [n, n]
    assert js(page, "q('l2-timing-long').data.slice(0, 2).map(t => t.y.length)") == [24, 24]
    assert re.search(r"At 4 tokens (the cache wins|the cache does not win|neither wins)", js(page, "q('l2-verdict').textContent"))
    # a winner only where the repeats' totals do not overlap
    keys = page.evaluate("""async () => { const { verdictKey } = await import('/static/js/learn/l2.js');
        return [verdictKey([10, 12], [20, 25], 11, 22), verdictKey([30, 31], [20, 25], 30, 22),
                verdictKey([10, 21], [20, 25], 11, 22), verdictKey([5], [5], 5, 5)]; }""")
    assert keys == ["l2.verdict.win", "l2.verdict.nowin", "l2.verdict.tie", "l2.verdict.tie"]
    # 3: k-1, k+1, 2k and 8 nearest neighbours, a trained token by default
    assert js(page, "q('l3-table').querySelectorAll('tbody tr').length") == n
    assert js(page, "q('l3-chart').data.slice(0, 3).map(t => t.y.length)") == [2, 1, 8]
    # the band of random pairs is a range of cosines (within [-1, 1]); the nearest row is called
    # close only when it lies above that band
    band = js(page, "q('l3-chart').layout.shapes[0]")
    assert -1 <= band["y0"] <= band["y1"] <= 1
    note = js(page, "q('l3-note').textContent")
    nearest = max(js(page, "q('l3-chart').data[2].y"))
    assert ("reaches" in note) == (nearest > band["y1"]) and ("stays inside that band" in note) == (nearest <= band["y1"])
    assert js(page, "q('l3-untrained').hidden") is True
    # 4-5: the row of E (d_model cells) and its neighbours; parameters per block
    assert js(page, "q('l4-strip').data[0].z[0].length") == 256
    assert js(page, "q('l4-neighbours').children.length") == 10
    layers = js(page, "q('l5-chart').data.map(t => t.y.length)")
    assert len(layers) == 3 and len(set(layers)) == 1 and 4 <= layers[0] <= 8  # one bar per block
    # blocks numbered on the axis (its title says what they are), named in the hover: no long labels to overlap
    assert js(page, "q('l5-chart').data[0].x") == list(range(layers[0]))
    assert js(page, "q('l5-chart').layout.xaxis.title.text") == "block (layer)"
    assert "8 × 32 = 256" in js(page, "q('l5-facts').textContent")
    # 6: position table; the two orders, their difference, the same tokens stage by stage
    assert js(page, "[q('l6-positions').data[0].z.length, q('l6-positions').data[0].z[0].length]") == [64, 16]  # rotary: one column per pair of d_head's 32 dimensions
    assert js(page, "q('l6-diff').data[0].z.length") == 5  # "the dog bites the man": one token per word
    stages = js(page, "q('l6-cos').data.map(t => t.y.length)")
    assert len(stages) == 5 and set(stages) == {7}  # every token matched by id; embedding + 6 blocks
    # rotary positions: a moved token is the same vector at the embedding, and differs from the first block on
    assert js(page, "q('l6-cos').data.every(t => t.y[0] > 0.999) && q('l6-cos').data.some(t => t.y[1] < 0.99)")
    assert "identical" in js(page, "q('l6-cos-note').textContent")
    # the head shown is the one whose attention changes most: its two heatmaps differ
    assert js(page, "q('l6-diff').data[0].z.flat().some(v => v !== null && Math.abs(v) > 0.1)")
    # 7: full attention vs the causal mask
    assert js(page, "q('l7-encoder').data.some(t => t.fillpattern)") is False
    assert js(page, "q('l7-decoder').data.some(t => t.fillpattern)") is True
    # 8-9
    assert js(page, "q('l8-lens').data[0].z.length") == 7  # embedding + 6 blocks
    assert js(page, "q('l8-flow').querySelectorAll('.stage').length") == 7
    assert js(page, "q('l9-norms').data.map(t => t.y.length)") == [7, 6]  # 7 residual stages, 6 blocks
    assert js(page, "q('l9-parts').data.map(t => t.y.length)") == [6, 6]  # attention and FFN, per block
    # the first stage is named by the model: a rotary model adds no position vector to its embedding
    assert js(page, "[q('l8-lens').data[0].y[0], q('l9-norms').data[0].x[0]]") == ["embedding", "embedding"]
    assert "(embedding)" in js(page, "q('l9-note').textContent")
    named = page.evaluate("""async () => { const c = await import('/static/js/learn/charts.js'); const { t } = await import('/static/js/i18n.js');
      return ['learned', 'sinusoidal', 'rotary', 'alibi', 'none'].map((p) => c.embedStage(t, { position_encoding: p })); }""")
    assert named == ["embedding + position", "embedding + position", "embedding", "embedding", "embedding"]
    # "Open in the explorer" carries the lesson's prompt, layer, head and position
    href = js(page, "q('lesson-1').querySelector('[data-testid=open-explorer]').getAttribute('href')")
    params = {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}
    assert params["text"] == PROMPT and params["lang"] == "en"
    assert (params["layer"], params["head"], params["pos"]) == (js(page, "q('l1-chart').dataset.layer"), js(page, "q('l1-chart').dataset.head"), "3")
    # 2 again: generation streams one step at a time
    page.get_by_test_id("l2-generate").click()
    page.wait_for_function("() => document.querySelector('[data-testid=l2-stream]').dataset.done", timeout=120_000)
    made = int(js(page, "q('l2-stream').dataset.done"))
    assert 1 <= made <= 16 and js(page, "q('l2-stream').querySelectorAll('.new').length") == made
    assert js(page, "q('l2-steps').data[0].y.length") == made
    six = parse_qs(urlparse(js(page, "q('lesson-6').querySelector('[data-testid=open-explorer]').getAttribute('href')")).query)
    assert six["text"] == ["the dog bites the man"] and six["layer"] == [js(page, "q('l6-diff').dataset.layer")]


def test_switch_changes_everything_without_reload(page: object, base_url: str) -> None:
    open_learn(page, base_url, "&lang=en")
    english = lesson_texts(page)
    page.evaluate("() => { window.__sameDocument = true; }")
    page.get_by_test_id("lang-switch").click()
    page.wait_for_function("() => document.documentElement.dataset.painted === 'zh'")
    assert page.evaluate("() => window.__sameDocument") is True  # no reload
    assert "lang=zh" in page.url
    chinese = lesson_texts(page)
    assert all(a != b and CJK.search(b) for a, b in zip(english, chinese, strict=True))
    # tables, buttons, pipeline boxes, captions, axis titles and legends changed at once
    assert CJK.search(js(page, "q('l2-table').querySelector('thead').textContent"))
    assert CJK.search(js(page, "q('l6-compare').textContent"))
    assert CJK.search(js(page, "q('l8-flow').textContent"))
    assert CJK.search(js(page, "q('l1-chart').data[0].name")) and CJK.search(js(page, "q('l2-timing').layout.yaxis.title.text"))
    assert CJK.search(js(page, "q('l6-heat-a').layout.xaxis.title.text"))
    assert "lang=zh" in js(page, "q('lesson-1').querySelector('[data-testid=open-explorer]').href")
    bad = english_ui_words(visible_strings(page), base_url, page)
    assert bad == {}, f"English UI words in Chinese mode: {bad}"
    for i in range(1, 10):
        page.get_by_test_id(f"lesson-{i}").screenshot(path=str(ARTIFACTS / f"learn-zh-{i}.png"))
    page.get_by_test_id("lang-switch").click()
    page.wait_for_function("() => document.documentElement.dataset.painted === 'en'")
    assert lesson_texts(page) == english


def test_chinese_from_the_browser_has_no_english_ui_words(browser: object, base_url: str) -> None:
    context = browser.new_context(locale="zh-CN", viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    watch = ConsoleWatch(pg)
    pg.goto(f"{base_url}/learn")
    pg.wait_for_function(READY, timeout=600_000)
    pg.wait_for_function(MEASURED, timeout=600_000)
    assert pg.evaluate("() => document.documentElement.lang") == "zh-CN"
    assert all(CJK.search(text) for text in pg.get_by_test_id("lesson-text").all_text_contents())
    bad = english_ui_words(visible_strings(pg), base_url, pg)
    assert bad == {}, f"English UI words in Chinese mode: {bad}"
    shot(pg, "learn-zh")
    context.close()
    assert watch.errors == []


def test_chinese_prompt_gets_a_note_and_the_lens_window_moves(page: object, base_url: str) -> None:
    text = "我爱人工智能，注意力直接读取前文。"
    open_learn(page, base_url, "&lang=zh", text=text)
    note = page.get_by_test_id("lang-note")
    assert note.is_visible() and re.search(r"\d+ 个汉字", note.text_content()) and re.search(r"0\.\d{3}", note.text_content())
    assert "训练" not in note.text_content()  # it says what was measured, not what the model saw in training
    assert page.evaluate("() => document.querySelector('[data-testid=l9-note]').textContent").startswith("这里第一个阶段（Embedding）")
    n = js(page, "q('l3-table').querySelectorAll('tbody tr').length")  # every token
    shown = js(page, "q('l8-lens').data[0].x.length")
    assert shown < n  # a window, not every position squeezed in
    assert js(page, "q('l8-lens').data[0].x[0]") == n - shown  # the end of the prompt first
    page.get_by_test_id("l8-window").fill("0")
    page.get_by_test_id("l8-window").dispatch_event("input")
    page.wait_for_function("() => document.querySelector('[data-testid=l8-lens]').dataset.start === '0'")
    assert js(page, "q('l8-lens').data[0].x") == list(range(shown))
    assert js(page, "q('lesson-8').querySelector('[data-testid=open-explorer]').href").endswith(f"pos={shown - 1}&lang=zh")
