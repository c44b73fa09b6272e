"""Run files in headless Chromium on the bundled model (issue 30): "Download run" saves the run's
file, "Open run" (the file picker, or a file dropped on the page) shows it as an analysed run whose
id the URL keeps, a hostile file is refused in the reader's language, a run of a model this server
has not loaded shows its attention while its tools say why they cannot run, and "Save as HTML" says
the file's size before it downloads it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.services.engine import Engine
from tests.support.browser import shot
from tests.support.i18n_check import catalogue

pytestmark = pytest.mark.browser
PROMPT = "The cat sat on the mat. The cat sat on the mat."
DRAWN = "() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy"


def lead(lang: str, key: str) -> str:
    """A catalogue text up to its first placeholder: what the page shows whatever the values."""
    return catalogue(lang)[key].split("{")[0]


def analysed(page: object, base_url: str, **extra: str) -> None:
    page.goto(f"{base_url}/?{urlencode({'text': PROMPT, 'model': 'attnscope-tiny', **extra})}")
    page.wait_for_function(DRAWN, timeout=60_000)


def tokens(page: object) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('[data-testid=token]')].map((c) => c.textContent)")


def run_param(page: object) -> str | None:
    return parse_qs(urlparse(page.url).query).get("run", [None])[0]


def opened(page: object, before: str | None) -> str:
    """The run id the URL names once a run other than `before` is drawn."""
    page.wait_for_function("(before) => { const p = new URLSearchParams(location.search).get('run');"
                           " return p && p !== before && document.querySelector('[data-testid=heatmap]').dataset.drawnAt"
                           " && !document.body.dataset.busy; }", arg=before, timeout=60_000)
    run = run_param(page)
    assert run
    return run


def download_run(page: object) -> tuple[str, bytes]:
    with page.expect_download() as info:
        page.get_by_test_id("run-download").click()
    download = info.value
    return download.suggested_filename, Path(download.path()).read_bytes()


def test_download_a_run_and_open_it_with_the_picker_by_drop_and_by_its_link(page: object, base_url: str,
                                                                          tmp_path: Path) -> None:
    page.set_viewport_size({"width": 1400, "height": 1000})
    analysed(page, base_url)
    assert run_param(page) is None  # a run analysed from its text: the link names the text
    words, n = tokens(page), page.get_by_test_id("heatmap").get_attribute("data-n")
    assert words and n == str(len(words))

    name, data = download_run(page)
    made = re.fullmatch(r"attnscope-run-([\w-]+)\.attnscope", name)
    assert made, name
    size = int.from_bytes(data[:8], "little")  # safetensors: a little-endian header length, then the JSON header
    header = json.loads(data[8:8 + size])
    assert "attnscope-run/1" in json.dumps(header["__metadata__"])
    assert len(data) > 8 + size

    # the file picker, from the keyboard
    path = tmp_path / name
    path.write_bytes(data)
    with page.expect_file_chooser() as chooser:
        page.get_by_test_id("run-open").press("Enter")
    chooser.value.set_files(str(path))
    first = opened(page, None)
    assert first != made[1]  # stored here under a new id
    assert tokens(page) == words
    assert page.get_by_test_id("heatmap").get_attribute("data-n") == n
    assert page.get_by_test_id("head-cell").count() > 0
    assert page.get_by_test_id("error-message").is_hidden()
    assert page.get_by_test_id("prompt-input").input_value() == PROMPT
    said = catalogue("en")["x.run.opened"].replace("{tokens}", str(len(words))).replace("{model}", "attnscope-tiny")
    assert page.get_by_test_id("run-note").text_content() == said  # the page says that a file was opened
    shot(page, "run-files-opened-1400")

    # a file dropped anywhere on the page
    page.evaluate("""(bytes) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], 'dropped.attnscope', {type: 'application/octet-stream'}));
        const target = document.querySelector('[data-testid=heatmap]');
        target.dispatchEvent(new DragEvent('dragenter', {dataTransfer: dt, bubbles: true, cancelable: true}));
        if (document.querySelector('[data-testid=drop-hint]').hidden) throw new Error('no drop hint');
        target.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""", list(data))
    second = opened(page, first)
    assert tokens(page) == words and page.get_by_test_id("heatmap").get_attribute("data-n") == n
    assert page.get_by_test_id("drop-hint").is_hidden()

    # the link opens the stored run again, at the head and token it names
    page.get_by_test_id("head-picker").select_option("1")
    page.wait_for_function("() => new URLSearchParams(location.search).get('head') === '1'")
    page.reload()
    page.wait_for_function(DRAWN, timeout=60_000)
    assert run_param(page) == second
    assert tokens(page) == words
    assert page.get_by_test_id("heatmap").get_attribute("data-head") == "1"
    assert page.get_by_test_id("error-message").is_hidden()


def test_a_link_to_an_unknown_run_says_so_and_analyses_its_text(page: object, base_url: str) -> None:
    page.goto(f"{base_url}/?{urlencode({'text': PROMPT, 'model': 'attnscope-tiny', 'run': 'no-such-run'})}")
    page.wait_for_function(DRAWN, timeout=60_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=error-message]').hidden")
    said = catalogue("en")["err.run_link_unknown"].replace("{run_id}", "no-such-run")
    assert page.get_by_test_id("error-message").text_content() == said
    page.get_by_test_id("lang-switch").click()  # said again in Chinese
    page.wait_for_function("() => document.documentElement.dataset.painted === 'zh'")
    said = catalogue("zh")["err.run_link_unknown"].replace("{run_id}", "no-such-run")
    assert page.get_by_test_id("error-message").text_content() == said
    assert tokens(page)  # the link's text, analysed
    assert run_param(page) is None
    assert page.get_by_test_id("run-note").is_hidden()
    page.goto(f"{base_url}/?{urlencode({'run': 'no-such-run', 'lang': 'en'})}")  # no text: the example is analysed
    page.wait_for_function(DRAWN, timeout=60_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=error-message]').hidden")
    said = catalogue("en")["err.run_link_unknown_default"].replace("{run_id}", "no-such-run")
    assert page.get_by_test_id("error-message").text_content() == said
    page.console_watch.errors = [e for e in page.console_watch.errors if "404" not in e]  # the refusal, expected


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_hostile_file_is_refused_in_the_readers_language(page: object, base_url: str, lang: str) -> None:
    analysed(page, base_url, lang=lang)
    before = tokens(page)
    hostile = os.urandom(4096)
    page.get_by_test_id("run-file").set_input_files(
        {"name": "<img src=x onerror=alert(1)>.attnscope", "mimeType": "application/octet-stream", "buffer": hostile})
    page.wait_for_function("() => !document.querySelector('[data-testid=error-message]').hidden")
    said = page.get_by_test_id("error-message").text_content()
    # English shows the server's own sentence, Chinese the catalogue's (static/js/i18n.js errorText)
    assert said.startswith("not a usable attnscope run file: " if lang == "en" else lead(lang, "err.bad_run_file")), said
    assert tokens(page) == before and run_param(page) is None  # nothing else changed
    assert page.locator("img").count() == 0
    page.console_watch.errors = [e for e in page.console_watch.errors if "422" not in e]  # the refusal, expected


def foreign_run_file(client: TestClient) -> bytes:
    """A run file made by a model the browser's server has not loaded (the tiny test engine's GPT-2)."""
    made = client.post("/api/runs", json={"text": PROMPT, "model": "tiny-gpt2"})
    assert made.status_code == 201, made.text[:300]
    got = client.get(f"/api/runs/{made.json()['run_id']}/export", params={"format": "attnscope"})
    assert got.status_code == 200, got.text[:300]
    return got.content


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_run_of_a_model_not_loaded_here_shows_its_attention_and_its_tools_say_why(
        page: object, base_url: str, client: TestClient, lang: str) -> None:
    data = foreign_run_file(client)
    analysed(page, base_url, lang=lang)
    page.get_by_test_id("run-file").set_input_files(
        {"name": "gpt2.attnscope", "mimeType": "application/octet-stream", "buffer": data})
    run = opened(page, None)
    summary = page.get_by_test_id("model-summary").text_content()
    assert summary == catalogue(lang)["x.model.not_loaded"].replace("{name}", "tiny-gpt2")
    # said under the run actions too, which a phone shows (its header hides the model line)
    assert catalogue(lang)["x.model.not_loaded"].replace("{name}", "tiny-gpt2") in page.get_by_test_id("run-note").text_content()
    page.set_viewport_size({"width": 390, "height": 900})
    assert page.get_by_test_id("run-note").is_visible() and not page.get_by_test_id("model-summary").is_visible()
    page.set_viewport_size({"width": 1400, "height": 1000})
    assert page.get_by_test_id("head-cell").count() > 0 and int(page.get_by_test_id("heatmap").get_attribute("data-n")) > 0
    assert page.get_by_test_id("error-message").is_hidden()
    # token focus: a click on a token draws its row
    page.locator("[data-testid=token][data-index='3']").click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('pos') === '3'")
    page.wait_for_function("() => document.querySelector('[data-testid=focus-chart]').data")
    # a tool that runs the model: 409, said in the reader's language
    page.goto(f"{base_url}/?{urlencode({'run': run, 'view': 'lens', 'lang': lang})}")
    page.wait_for_function("() => { const e = document.querySelector('[data-testid=tool-error]');"
                           " return e && !e.hidden && e.textContent; }", timeout=60_000)
    said = page.get_by_test_id("tool-error").text_content()
    # English: the server's own sentence; Chinese: the catalogue's
    assert said.startswith("this run was made with the model" if lang == "en" else lead(lang, "err.run_model_missing")), said
    assert "tiny-gpt2" in said
    assert run_param(page) == run and page.get_by_test_id("error-message").is_hidden()
    assert "tiny-gpt2" in page.get_by_test_id("run-note").text_content()  # a reopened link says it as well
    shot(page, f"run-files-foreign-model-{lang}")
    page.console_watch.errors = [e for e in page.console_watch.errors if "409" not in e]  # the refusal, expected


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_save_as_html_says_its_size_then_downloads_the_page(page: object, base_url: str, lang: str,
                                                          tmp_path: Path) -> None:
    offers = []
    for width in (1400, 390):  # the page drawn at each width
        page.set_viewport_size({"width": width, "height": 1000 if width > 1000 else 844})
        analysed(page, base_url, lang=lang)
        assert page.get_by_test_id("html-offer").is_hidden()
        page.get_by_test_id("run-html").focus()
        page.keyboard.press("Enter")
        page.wait_for_selector("[data-testid=html-offer]:not([hidden])")
        offers.append(page.get_by_test_id("html-offer-text").text_content())
        assert page.evaluate("() => document.activeElement.dataset.testid") == "html-offer-save"  # Enter saves
        shot(page, f"run-files-html-offer-{width}-{lang}")
    offer = offers[0]
    size = re.match(r"(\d+(?:\.\d)?) (MB|KB)", offer)
    assert size, offer
    assert offers == [catalogue(lang)["x.run.html_all"].replace("{size}", size[0])] * 2  # 14 tokens: every head exact
    with page.expect_response(lambda r: "format=html" in r.url and "dry_run" not in r.url) as answer, \
            page.expect_download() as info:
        page.keyboard.press("Enter")
    assert answer.value.headers["content-type"].startswith("text/html")
    assert info.value.suggested_filename.endswith(".html")
    html = Path(info.value.path()).read_bytes()
    assert html[:15].lower() == b"<!doctype html>"
    mb = len(html) / (1 << 20)
    assert abs(mb - float(size[1])) <= 0.05 if size[2] == "MB" else abs(len(html) / 1024 - float(size[1])) <= 1
    assert page.get_by_test_id("html-offer").is_hidden()
    assert page.get_by_test_id("export-error").is_hidden()
    # the file, opened from disk with no server: it has none to send a run to, so it offers none of the three
    saved = tmp_path / info.value.suggested_filename
    saved.write_bytes(html)
    offline = page.context.new_page()
    offline.route("**/*", lambda route: route.continue_() if route.request.url == saved.as_uri() else route.abort())
    offline.goto(saved.as_uri())
    offline.wait_for_function(DRAWN, timeout=60_000)
    for testid in ("run-download", "run-open", "run-html"):
        assert offline.get_by_test_id(testid).is_hidden(), testid
    offline.close()


def test_save_as_html_of_a_longer_run_keeps_the_selected_heads_cells(page: object, base_url: str) -> None:
    """Over the budget for every head's cells (about 100 tokens on the bundled model): every head's
    thumbnail and the exact cells of the head selected, as the offer says."""
    page.goto(f"{base_url}/?{urlencode({'text': PROMPT * 10, 'model': 'attnscope-tiny', 'layer': '2', 'head': '3'})}")
    page.wait_for_function(DRAWN, timeout=60_000)
    assert len(tokens(page)) > 120
    page.get_by_test_id("run-html").click()
    page.wait_for_selector("[data-testid=html-offer]:not([hidden])")
    offer = page.get_by_test_id("html-offer-text").text_content()
    size = re.match(r"\d+(?:\.\d)? (?:MB|KB)", offer)
    assert size and offer == catalogue("en")["x.run.html_some"].replace("{size}", size[0]).replace("{heads}", "L2H3"), offer
    with page.expect_response(lambda r: "format=html" in r.url and "dry_run" not in r.url) as answer, \
            page.expect_download() as info:
        page.get_by_test_id("html-offer-save").click()
    assert "heads=2.3" in answer.value.url and answer.value.headers["x-attnscope-exact-heads"] == "2.3"
    assert Path(info.value.path()).read_bytes()[:15].lower() == b"<!doctype html>"
    # another run takes the offer away; Escape does too
    page.get_by_test_id("run-html").click()
    page.wait_for_selector("[data-testid=html-offer]:not([hidden])")
    page.keyboard.press("Escape")
    page.wait_for_selector("[data-testid=html-offer]", state="hidden")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "run-html"


def test_a_file_over_the_size_limit_is_refused_in_chinese(page: object, base_url: str, engine: Engine) -> None:
    """The server's 413 for a run file over ATTNSCOPE_MAX_RUN_FILE_BYTES (512 MiB unless configured: here
    the answer of a server configured with 64 KiB, handed to the page as its answer to the import)."""
    small = Settings(models={}, default_model="tiny-gpt2", max_run_file_bytes=64 << 10)
    with TestClient(create_app(small, engine)) as client:
        refusal = client.post("/api/runs/import", content=bytes(100 << 10), headers={"content-type": "application/octet-stream"})
    assert refusal.status_code == 413 and refusal.json()["code"] == "body_too_large", refusal.text[:300]
    page.route("**/api/runs/import", lambda route: route.fulfill(
        status=413, content_type=refusal.headers["content-type"], body=refusal.content))
    analysed(page, base_url, lang="zh")
    page.get_by_test_id("run-file").set_input_files(
        {"name": "big.attnscope", "mimeType": "application/octet-stream", "buffer": bytes(100 << 10)})
    page.wait_for_function("() => !document.querySelector('[data-testid=error-message]').hidden")
    said = page.get_by_test_id("error-message").text_content()
    assert said == catalogue("zh")["err.body_too_large"].replace("{max_bytes}", str(64 << 10)), said
    page.console_watch.errors = [e for e in page.console_watch.errors if "413" not in e]  # the refusal, expected
