"""The heatmap's axis titles stay clear of its token labels, however long a token is: a slanted
"␣intelligence" ran through the key axis's title at 1,400 px (plotly's margin was fixed)."""

from __future__ import annotations

import pytest

from tests.support.browser import shot
from tests.web.test_browser import analyse

pytestmark = pytest.mark.browser
LONG = "I love artificial intelligence and international understanding, extraordinarily."

OVERLAPS = """() => {
  const div = document.querySelector('[data-testid=heatmap]');
  const box = (e) => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const out = {};
  for (const axis of ['x', 'y']) {
    const title = div.querySelector(`.g-${axis}title text`);
    const labels = [...div.querySelectorAll(`.${axis}tick text`)].filter((e) => e.textContent.trim());
    out[axis] = {labels: labels.length, hits: labels.filter((e) => hit(box(e), box(title))).map((e) => e.textContent)};
  }
  return out;
}"""


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_axis_titles_clear_long_token_labels(page: object, base_url: str, lang: str) -> None:
    page.set_viewport_size({"width": 1400, "height": 1000})
    analyse(page, base_url, LONG)
    if lang == "zh":
        page.get_by_test_id("lang-switch").click()
        page.wait_for_function("() => document.documentElement.dataset.painted === 'zh'")
        page.wait_for_timeout(300)
    got = page.evaluate(OVERLAPS)
    assert got["x"]["labels"] > 5 and got["y"]["labels"] > 5
    assert got["x"]["hits"] == [] and got["y"]["hits"] == [], got
    shot(page, f"heatmap-long-labels-{lang}")


# plotly's automargin finds the margins its labels need by drawing the chart a second time (half of a
# 256-token heatmap's drawing): the explorer gives it margins measured from the labels, which it need
# not grow (automargin stays on behind them)
MARGINS = """() => { const d = document.querySelector('[data-testid=heatmap]');
  return {asked: {l: d.layout.margin.l, t: d.layout.margin.t}, drawn: {l: d._fullLayout._size.l, t: d._fullLayout._size.t}}; }"""


@pytest.mark.parametrize("text", [LONG, "我爱人工智能和国际理解。今天天气很好。", "supercalifragilisticexpialidocious "
                                  "antidisestablishmentarianism & <b>internationalization</b>", "a b c"])
def test_the_heatmap_is_given_the_margins_its_labels_need(page: object, base_url: str, text: str) -> None:
    page.set_viewport_size({"width": 1400, "height": 1000})
    analyse(page, base_url, text)
    got = page.evaluate(MARGINS)
    assert got["drawn"] == got["asked"], got  # automargin grew nothing: one draw
    assert got["asked"]["l"] < 200 and got["asked"]["t"] < 220, got  # and no room wasted
    assert page.evaluate(OVERLAPS)["x"]["hits"] == []
