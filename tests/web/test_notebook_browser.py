"""The notebook widget in a real JupyterLab, in Chromium: Run → Run All Cells draws the explorer in the
output cells on the model the kernel holds; a head click redraws the heatmap with data from the kernel;
a causal tool runs; the Chinese option shows Chinese."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import ARTIFACTS, ConsoleWatch
from tests.support.jupyter import lab, notebook, run_all, widget_frame

pytest.importorskip("anywidget")
pytest.importorskip("jupyterlab")
pytestmark = pytest.mark.browser

TEXT = "The cat sat on the mat. The cat sat on the mat."
CELLS = [
    "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
    "import attnscope\n"
    "from attnscope.model.load.models import BUNDLED_DIR\n"
    "folder = BUNDLED_DIR / 'attnscope-tiny'\n"
    "model = AutoModelForCausalLM.from_pretrained(folder)\n"
    "tokenizer = AutoTokenizer.from_pretrained(folder)\n"
    "scope = attnscope.Scope(model, tokenizer)",
    f"scope.show({TEXT!r}, height=700)",
    f"attnscope.show(model, tokenizer, {TEXT!r}, lang='zh', height=700)",
]
DRAWN = "() => { const d = document.querySelector('[data-testid=heatmap]'); return d && d.dataset.drawnAt && d.dataset.n; }"


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("lab")
    (folder / "widget.ipynb").write_text(json.dumps(notebook(CELLS)), encoding="utf-8")
    with lab(folder) as url:
        yield url


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(Path(ARTIFACTS) / f"{name}.png"))


def test_the_widget_in_jupyterlab_draws_redraws_from_the_kernel_runs_a_tool_and_speaks_chinese(
        browser: Any, jupyter: str) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    watch = ConsoleWatch(page)
    try:
        run_all(page, jupyter, "widget.ipynb")
        frame = widget_frame(page, 0)
        frame.wait_for_function(DRAWN, timeout=180_000)
        n_cells = frame.locator("[data-testid=head-cell]").count()
        assert n_cells == 6 * 8  # the bundled model's 6 layers x 8 heads, each a thumbnail with its badges
        first = frame.evaluate("() => ({...document.querySelector('[data-testid=heatmap]').dataset})")
        assert int(first["n"]) > 10
        shot(page, "notebook-widget")

        # another head: the frame asks the kernel over the comm, and the heatmap redraws with its answer
        frame.locator("[data-testid=head-cell][data-layer='4'][data-head='0']").click()
        frame.wait_for_function("(t) => { const d = document.querySelector('[data-testid=heatmap]').dataset;"
                                " return d.layer === '4' && d.head === '0' && d.drawnAt !== t; }",
                                arg=first["drawnAt"], timeout=120_000)

        # a causal tool: ablate L4H0, the KL chart fills from the kernel
        frame.get_by_test_id("tool-tab-ablate").click()
        frame.wait_for_selector("[data-testid=ablation-panel]", timeout=120_000)
        frame.get_by_test_id("ablate-4-0").click()
        frame.wait_for_function("() => Number(document.querySelector('[data-testid=ablation-kl]').dataset.max) > 0",
                                timeout=120_000)
        frame.get_by_test_id("ablation-kl").scroll_into_view_if_needed()
        shot(page, "notebook-widget-ablation")

        # the Chinese widget of the next cell
        zh = widget_frame(page, 1)
        zh.wait_for_function(DRAWN, timeout=180_000)
        assert zh.evaluate("() => document.documentElement.lang").startswith("zh")
        heading = zh.locator("#attention-heading").text_content() or ""
        assert any("\u4e00" <= ch <= "\u9fff" for ch in heading), heading
        page.locator("[data-testid=attnscope-widget]").nth(1).scroll_into_view_if_needed()
        shot(page, "notebook-widget-zh")
        assert watch.errors == [], watch.errors
    finally:
        context.close()
