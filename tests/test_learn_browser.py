"""The nine Learn views in Chromium: each draws the model's real numbers, in two languages."""

from __future__ import annotations

import re

import pytest

from tests.browser import ConsoleWatch, shot

pytestmark = pytest.mark.browser
PROMPT = "I love artificial intelligence"


def open_learn(page: object, base_url: str, query: str = "") -> None:
    page.goto(f"{base_url}/learn?text={PROMPT.replace(' ', '%20')}{query}")
    page.wait_for_function("() => document.querySelectorAll('.lesson-body[data-ready]').length === 9", timeout=90_000)


def js(page: object, expr: str) -> object:
    return page.evaluate(f"() => {{ const q = (id) => document.querySelector(`[data-testid=${{id}}]`); return {expr}; }}")


def test_nine_views_draw_real_numbers(page: object, base_url: str) -> None:
    open_learn(page, base_url)
    n = 4  # "I love artificial intelligence" is 4 tokens for the bundled tokenizer
    assert js(page, "q('lesson-1').querySelector('[data-testid=l1-chart]').data.map(t => t.y.length)") == [n, n]
    assert js(page, "q('l2-table').querySelectorAll('tbody tr').length") == n
    assert js(page, "q('l2-timing').data.slice(0, 2).map(t => t.y.length)") == [n, n]
    assert js(page, "q('l3-table').querySelectorAll('tbody tr').length") == n
    assert js(page, "q('l3-chart').data[0].y.length") == 10  # ids k-1, k+1 and 8 nearest neighbours
    assert js(page, "q('l4-strip').data[0].z[0].length") == 256  # d_model cells
    assert js(page, "q('l4-neighbours').children.length") == 10
    assert js(page, "q('l5-chart').data.map(t => t.y.length)") == [4, 4, 4]  # n_layers bars
    assert "8 × 32 = 256" in js(page, "q('l5-facts').textContent")
    assert js(page, "[q('l6-positions').data[0].z.length, q('l6-positions').data[0].z[0].length]") == [64, 256]
    assert js(page, "q('l6-cos').data[0].y.length") == 4
    assert js(page, "q('l7-encoder').data.some(t => t.fillpattern)") is False
    assert js(page, "q('l7-decoder').data.some(t => t.fillpattern)") is True
    assert js(page, "q('l8-lens').data[0].z.length") == 5  # embed + 4 blocks
    assert js(page, "q('l8-flow').querySelectorAll('.stage').length") == 7
    assert js(page, "q('l9-parts').data.map(t => t.y.length)") == [4, 4]
    assert js(page, "q('lesson-1').querySelector('[data-testid=open-explorer]').getAttribute('href')").startswith("/?text=")
    for i in range(1, 10):
        page.get_by_test_id(f"lesson-{i}").screenshot(path=str(shot(page, "learn-full").parent / f"learn-{i}.png"))


def test_streamed_generation_appears_token_by_token(page: object, base_url: str) -> None:
    open_learn(page, base_url)
    page.get_by_test_id("l2-generate").click()
    page.wait_for_function("() => document.querySelector('[data-testid=l2-stream]').dataset.done", timeout=60_000)
    made = int(js(page, "q('l2-stream').dataset.done"))
    assert 1 <= made <= 16 and js(page, "q('l2-stream').querySelectorAll('.new').length") == made
    assert js(page, "q('l2-steps').data[0].y.length") == made


def test_chinese_switch_changes_the_explanations(page: object, base_url: str) -> None:
    open_learn(page, base_url)
    english = page.get_by_test_id("lesson-text").all_text_contents()
    page.get_by_test_id("lang-switch").click()
    chinese = page.get_by_test_id("lesson-text").all_text_contents()
    assert len(chinese) == 9 and all(a != b for a, b in zip(english, chinese, strict=True))
    assert all(re.search(r"[\u4e00-\u9fff]", text) for text in chinese)
    assert "lang=zh" in page.url
    shot(page, "learn-zh")
    page.get_by_test_id("lang-switch").click()
    assert page.get_by_test_id("lesson-text").all_text_contents() == english


def test_language_defaults_from_the_browser(browser: object, base_url: str) -> None:
    context = browser.new_context(locale="zh-CN")
    pg = context.new_page()
    watch = ConsoleWatch(pg)
    pg.goto(f"{base_url}/learn")
    pg.wait_for_function("() => document.querySelectorAll('.lesson-body[data-ready]').length === 9", timeout=90_000)
    assert re.search(r"[\u4e00-\u9fff]", pg.get_by_test_id("lesson-text").first.text_content())
    context.close()
    assert watch.errors == []
