"""The explorer's answers where the person acted, and its layout (issue 27), in Chromium: the Run
JSON refusal by the export buttons, a long paste's way forward, the head grid of 12 heads, the
zoom notice clear of the language button, compare's default pair, and the smaller views."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote

import pytest

from app.main import create_app
from app.settings import Settings
from model.engine import Engine
from tests.conftest import make_engine

pytestmark = pytest.mark.browser
READY = "() => document.querySelector('[data-testid=attention-heatmap]').dataset.n && !document.body.dataset.busy"


def open_explorer(page: object, url: str, text: str, model: str | None = None, lang: str = "en") -> None:
    page.goto(f"{url}/?text={quote(text)}&lang={lang}" + (f"&model={model}" if model else ""))
    page.wait_for_function(READY, timeout=120_000)


@pytest.fixture(scope="module")
def small_url(bundled_engine: Engine) -> Iterator[str]:
    """The bundled models behind a server that sends at most 32,768 attention cells a request (the
    thumbnails of 64 tokens) and takes at most 64 tokens a prompt: the JSON export of 48 tokens is
    refused, a paragraph is too long."""
    from tests.servers import serve

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
    n = int(page.get_by_test_id("attention-heatmap").get_attribute("data-n"))
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
    page.wait_for_function("() => document.querySelector('[data-testid=attention-heatmap]').dataset.n === '64'"
                           " && !document.body.dataset.busy", timeout=60_000)
    assert page.get_by_test_id("error-message").is_hidden()
    note = page.get_by_test_id("truncated-note").text_content()
    assert "64" in note and f"{len(long)}" in note
    assert ("first 64 tokens" in note) if lang == "en" else ("前 64 个 token" in note), note
    assert page.get_by_test_id("prompt-input").input_value() == long
    assert page.get_by_test_id("token").count() == 64
