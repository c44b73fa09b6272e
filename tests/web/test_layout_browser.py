"""Layout and reading (issue 12): a legible head grid from 4 to 32 heads and up to 48 layers,
no chart label clipped at a panel edge, no sideways scrolling at phone width, a short header;
and screenshots of the explorer and Learn at 1,400 and 390 px, in English and Chinese."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import load_model
from attnscope.model.services.engine import Engine
from tests.support.browser import shot
from tests.support.tiny import BUNDLED, VOCAB, make_engine

pytestmark = pytest.mark.browser
CJK_PROMPT = "我爱人工智能，它让生活更方便"

# Every title, axis title, legend and tick label of every plotly chart must lie inside its
# chart; a legend must not cover the plotting area. Returns what is clipped or covered.
CLIPPED = """() => {
  const out = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    if (!gd.offsetParent) continue;  // hidden
    const box = gd.getBoundingClientRect();
    const name = gd.dataset.testid || gd.id;
    for (const t of gd.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text, .legend text, .xtick text, .ytick text, .cbtitle text')) {
      const r = t.getBoundingClientRect();
      if (!r.width) continue;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        out.push(`${name}: "${t.textContent}" outside its chart`);
    }
    const legend = gd.querySelector('.legend .bg');
    const plot = gd.querySelector('.draglayer .nsewdrag');
    if (legend && plot) {
      const a = legend.getBoundingClientRect(), b = plot.getBoundingClientRect();
      const overlap = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 2 && Math.min(a.right, b.right) - Math.max(a.left, b.left) > 2;
      if (overlap) out.push(`${name}: legend covers the plot`);
    }
  }
  for (const svg of document.querySelectorAll('[data-testid=focus-lines]')) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.left < box.left - 1 || r.right > box.right + 1) out.push(`focus-lines: "${t.textContent}" clipped`);
    }
  }
  return out;
}"""

# Inside each head cell: the label is not cut, the badges lie inside the cell and on none other.
GRID = """() => {
  const out = [];
  const cells = [...document.querySelectorAll('[data-testid=head-cell]')];
  const grid = document.querySelector('[data-testid=head-grid]');
  for (const c of cells) {
    const box = c.getBoundingClientRect();
    const where = `L${c.dataset.layer}H${c.dataset.head}`;
    if (box.width < 34) out.push(`${where}: ${box.width.toFixed(0)} px wide`);
    const lbl = c.querySelector('.lbl');
    if (lbl.scrollWidth > lbl.clientWidth + 1) out.push(`${where}: label "${lbl.textContent}" cut`);
    const badges = [...c.querySelectorAll('.badge')].map((b) => b.getBoundingClientRect());
    for (const [i, a] of badges.entries()) {
      if (a.left < box.left - 1 || a.right > box.right + 1 || a.bottom > box.bottom + 1) out.push(`${where}: badge outside`);
      for (const b of badges.slice(i + 1))
        if (Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5)
          out.push(`${where}: badges overlap`);
    }
  }
  const style = getComputedStyle(grid);
  if (grid.scrollWidth > grid.clientWidth + 1 && style.overflowX === 'visible') out.push('grid wider than its panel and not scrollable');
  return {problems: out, cells: cells.length, badges: document.querySelectorAll('[data-testid=head-cell] .badge').length};
}"""


@pytest.fixture(scope="module")
def wide_url(bundled_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bundled models plus a random GPT-2 with 48 layers of 32 heads."""
    from tests.support.servers import serve

    folder: Path = tmp_path_factory.mktemp("wide") / "gpt2"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=48, n_head=32, n_embd=64, n_positions=128, vocab_size=VOCAB)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(BUNDLED).save_pretrained(folder)
    models = {name: bundled_engine.model(name) for name in ("attnscope-tiny", "minilm-l6", "tiny-qwen2-gqa")}
    models["wide-48x32"] = load_model("wide-48x32", str(folder))
    with serve(create_app(Settings(models={}, default_model="attnscope-tiny"), make_engine(models, "attnscope-tiny"))) as url:
        yield url


def open_explorer(page: object, url: str, text: str, model: str | None = None) -> None:
    page.goto(f"{url}/?text={quote(text)}" + (f"&model={model}" if model else ""))
    page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.n && !document.body.dataset.busy"
                           " && !document.querySelector('[data-testid=head-cell][data-pending=\"1\"]')",  # badges in
                           timeout=120_000)


def open_learn(page: object, url: str, query: str = "") -> None:
    page.goto(f"{url}/learn{query}")
    page.wait_for_function("() => document.querySelectorAll('.lesson-body[data-ready]').length === 9", timeout=120_000)


# 48 x 32 = 1,536 heads: the overview (one canvas cell a head, tests/web/test_many_heads_browser.py) with the
# selected layer's 32 thumbnails under it
@pytest.mark.parametrize(("model", "cells"), [("tiny-qwen2-gqa", 2 * 4), ("attnscope-tiny", None), ("minilm-l6", 6 * 12),
                                              ("wide-48x32", 32)])
def test_head_grid_is_legible_from_4_to_32_heads(browser: object, wide_url: str, model: str, cells: int | None) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    open_explorer(page, wide_url, "dog bites man and the man bites the dog back", model)
    page.wait_for_function("() => document.querySelector('[data-testid=head-cell] .lbl')")
    got = page.evaluate(GRID)
    assert got["problems"] == []
    if cells:
        assert got["cells"] == cells
    mode = page.get_by_test_id("head-grid").get_attribute("data-mode")
    assert mode == ("overview" if model == "wide-48x32" else "thumbnails")
    if model == "minilm-l6":
        assert got["badges"] > 0  # the 12-head grid whose "sink sink sink" badges overlapped
    page.get_by_test_id("head-grid").screenshot(path=str(shot(page, f"grid-{model}").with_name(f"grid-{model}.png")))
    page.select_option("#grid-sort", "induction")  # sorted, each cell names its head too ("L4H0 0.6" was cut)
    page.wait_for_function("() => document.querySelector('[data-testid=head-cell] .lbl.named')")
    got = page.evaluate(GRID)
    assert got["problems"] == []
    page.close()


@pytest.mark.parametrize("width", [1400, 390])
def test_no_chart_label_is_clipped(browser: object, base_url: str, width: int) -> None:
    page = browser.new_page(viewport={"width": width, "height": 900})
    open_explorer(page, base_url, "I love artificial intelligence")
    page.wait_for_function("() => document.querySelector('[data-testid=next-token-chart]')._fullLayout")
    assert (clipped := page.evaluate(CLIPPED)) == [], "\n".join(clipped)
    open_learn(page, base_url, "?text=I%20love%20artificial%20intelligence")
    assert (clipped := page.evaluate(CLIPPED)) == [], "\n".join(clipped)
    page.close()


@pytest.mark.parametrize("path", ["/", "/learn"])
def test_phone_width_has_no_sideways_scrolling_and_a_short_header(browser: object, base_url: str, path: str) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True)
    page = context.new_page()
    if path == "/":
        open_explorer(page, base_url, "I love artificial intelligence")
    else:
        open_learn(page, base_url)
    width = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1]
    header = page.evaluate("() => document.querySelector('header.top').getBoundingClientRect().height")
    assert header <= 0.12 * 844
    context.close()


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("width", [1400, 390])
def test_screenshots_of_explorer_and_learn(browser: object, base_url: str, width: int, lang: str) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900}, locale="zh-CN" if lang == "zh" else "en-US")
    page = context.new_page()
    text = CJK_PROMPT if lang == "zh" else "I love artificial intelligence"
    open_explorer(page, base_url, text)
    assert (clipped := page.evaluate(CLIPPED)) == [], "\n".join(clipped)
    shot(page, f"explorer-{width}-{lang}")
    open_learn(page, base_url, f"?text={quote(text)}&lang={lang}")
    assert (clipped := page.evaluate(CLIPPED)) == [], "\n".join(clipped)
    assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    shot(page, f"learn-{width}-{lang}")
    context.close()
