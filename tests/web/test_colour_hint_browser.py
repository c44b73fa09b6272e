"""An exact zoom into a diffuse head is almost white on the linear scale: the page names the largest weight
in view and the scales that show it; the "0 to the view's largest" scale spans exactly that weight."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from attnscope.model.load.models import load_model
from tests.support.tiny import make_engine

pytestmark = pytest.mark.browser
DRAWN = "() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy"


@pytest.fixture
def random_url(tiny_dirs: dict[str, Path]) -> Iterator[str]:
    from tests.support.servers import serve_engine

    with serve_engine(make_engine({"random-gpt2": load_model("random-gpt2", str(tiny_dirs["gpt2"]))},
                                  "random-gpt2")) as url:
        yield url


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_faint_zoom_says_which_scale_shows_it(page: object, random_url: str, lang: str) -> None:
    page.goto(f"{random_url}/?lang={lang}")
    page.wait_for_function(DRAWN, timeout=60_000)
    page.get_by_test_id("prompt-input").fill(" ".join(f"w{i}" for i in range(60)))  # random weights: diffuse heads
    page.get_by_test_id("analyze-button").click()
    page.wait_for_function(DRAWN, timeout=60_000)
    hint = page.get_by_test_id("colour-hint")
    assert hint.is_hidden()  # the whole head: row 0 reads itself with weight 1
    n = int(page.get_by_test_id("heatmap").get_attribute("data-n"))
    for field, value in (("q0", n - 20), ("q1", n - 1), ("k0", 20), ("k1", 40)):
        page.fill(f"#zoom-{field}", str(value))
    page.click("#zoom-apply")
    page.wait_for_function("() => !document.querySelector('[data-testid=colour-hint]').hidden")
    peak = float(page.get_by_test_id("heatmap").get_attribute("data-peak"))
    assert 0 < peak < 0.1
    text = hint.text_content()
    assert f"{peak:.2g}"[:3] in text and ("sqrt" in text if lang == "en" else "平方根" in text)
    page.select_option("[data-testid=colour-scale]", "view")
    page.wait_for_function("() => document.querySelector('[data-testid=colour-hint]').hidden")
    zmax = page.evaluate("() => document.querySelector('[data-testid=heatmap]').data.at(-1).zmax")
    assert zmax == pytest.approx(peak)
