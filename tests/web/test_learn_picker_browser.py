"""Learn's model picker: ?model= picks the model (kept in the URL when switching), the summary names it,
and every lesson draws; a model this server lacks is said, not quietly replaced."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from tests.support.browser import ConsoleWatch

pytestmark = pytest.mark.browser
READY = "() => document.querySelectorAll('.lesson-body[data-ready]').length === 9"


def test_learn_honours_model_and_its_picker_switches(page: object, base_url: str) -> None:
    watch = ConsoleWatch(page)
    page.goto(f"{base_url}/learn?model=tiny-qwen2-gqa")
    page.wait_for_function(READY, timeout=600_000)
    assert page.input_value("[data-testid=model-picker]") == "tiny-qwen2-gqa"
    assert page.get_by_test_id("model-summary").text_content().startswith("tiny-qwen2-gqa")
    page.select_option("[data-testid=model-picker]", "attnscope-tiny")
    page.wait_for_function("() => document.querySelector('[data-testid=model-summary]').textContent"
                           ".startsWith('attnscope-tiny')", timeout=600_000)
    page.wait_for_function(READY, timeout=600_000)
    assert parse_qs(urlparse(page.url).query).get("model") == ["attnscope-tiny"]
    page.goto(f"{base_url}/learn?model=no-such-model")
    page.wait_for_function("() => !document.querySelector('[data-testid=model-note]').hidden", timeout=60_000)
    assert "no-such-model" in page.get_by_test_id("model-note").text_content()
    assert watch.errors == []
