"""Non-ASCII text in Chromium: each character shows once in the token strip, the prompt
box after a recorded generation, and Learn's prefix table."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from tests.support.browser import shot

pytestmark = pytest.mark.browser
CJK = "我爱人工智能龘"  # the last is rare: byte pieces beside whole characters
EMOJI = "I love 🤖 and 👩\u200d👩\u200d👧"


def strip_markers(s: str) -> str:
    """The strip's text as typed: invisible characters shown as ‹U+200D› back to themselves, byte markers out."""
    s = re.sub(r"‹U\+([0-9A-F]{4,6})›", lambda m: chr(int(m.group(1), 16)), s)
    return re.sub(r"‹[^›]*›", "", s)


def analyse(page: object, base_url: str, text: str) -> None:
    page.goto(base_url + "/")
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy")
    page.get_by_test_id("prompt-input").fill(text)
    page.get_by_test_id("analyze-button").click()
    page.wait_for_function("(text) => !document.body.dataset.busy && document.querySelector('#prompt').value === text && "
                           "new URLSearchParams(location.search).get('text') === text", arg=text, timeout=60_000)


@pytest.mark.parametrize("text", [CJK, EMOJI])
def test_token_strip_shows_each_character_once(page: object, base_url: str, text: str) -> None:
    analyse(page, base_url, text)
    page.wait_for_function("() => document.querySelectorAll('[data-testid=token]').length === "
                           "document.querySelector('[data-testid=heatmap]').dataset.n * 1")
    shown = strip_markers("".join(page.locator("[data-testid=token] .t").all_text_contents())).replace("␣", " ")
    assert shown == text
    partial = page.locator("[data-testid=token].partial")
    assert partial.count() > 0 and "‹" in partial.first.locator(".t").text_content()


def test_recorded_generation_keeps_the_prompt_once(page: object, base_url: str) -> None:
    analyse(page, base_url, CJK)
    page.get_by_test_id("generate-button").click()
    page.wait_for_function("() => !document.querySelector('#timeline-box').hidden", timeout=60_000)
    value = page.get_by_test_id("prompt-input").input_value()
    # the box holds the recorded run's text: the prompt once, then what was generated, each character
    # once (the strip shows the same tokens); the continuation itself may use the prompt's characters
    page.wait_for_function("(n) => document.querySelectorAll('[data-testid=token]').length > n", arg=len(CJK))
    shown = strip_markers("".join(page.locator("[data-testid=token] .t").all_text_contents())).replace("␣", " ")
    assert value.startswith(CJK) and not value.startswith(CJK + CJK) and "<|endoftext|>" not in value
    assert value == shown.replace("⏎", "\n")
    shot(page, "generate-cjk")


def test_learn_prefix_table_holds_each_character_once(page: object, base_url: str) -> None:
    page.goto(f"{base_url}/learn?text={quote(CJK)}")
    page.wait_for_function("() => document.querySelectorAll('.lesson-body[data-ready]').length === 9", timeout=90_000)
    prefixes = page.eval_on_selector_all("[data-testid=parallel-table] tbody tr td.prefix", "tds => tds.map(t => t.textContent)")
    assert prefixes[-1] == CJK
    assert all(CJK.startswith(p) for p in prefixes)


def test_chinese_renders_as_glyphs_not_boxes(page: object, base_url: str) -> None:
    """Two different characters drawn in the page's font differ; missing glyphs are identical boxes."""
    page.goto(base_url + "/learn?lang=zh")
    family = page.evaluate("() => getComputedStyle(document.body).fontFamily")
    assert "Noto Sans CJK SC" in family and "WenQuanYi Zen Hei" in family
    same = page.evaluate("""(family) => {
        const pixels = (ch) => {
            const c = document.createElement('canvas'); c.width = 40; c.height = 40;
            const ctx = c.getContext('2d'); ctx.font = `32px ${family}`; ctx.fillText(ch, 2, 32);
            return Array.from(ctx.getImageData(0, 0, 40, 40).data).join(',');
        };
        return pixels('我') === pixels('爱');
    }""", family)
    assert not same, "no CJK font: scripts/dev.sh installs fonts-wqy-zenhei next to chromium"


def test_invisible_characters_and_byte_markers_are_shown_as_such(page: object, base_url: str) -> None:
    """A zero-width joiner, a right-to-left override or a NUL is not an empty chip (nor flips its neighbours), and a
    partial character's bytes keep their marker's own spaces."""
    page.goto(base_url + "/")
    shown = page.evaluate(r"""async () => {
        const { showToken } = await import('/static/js/dom.js');
        return ['\u200d', 'a\u202eb', '\u0000', '‹e2 80›', ' the', 'x\ny', '👩\u200d👧'].map(showToken);
    }""")
    assert shown == ["‹U+200D›", "a‹U+202E›b", "‹U+0000›", "‹e2 80›", "␣the", "x⏎y", "👩‹U+200D›👧"]
