"""A run's standalone HTML file opened from file:// in Chromium with every other request aborted: the
explorer's own views draw from what the file holds (token strip, heatmap with the causal mask, the head
grid with badges, token focus), a head click redraws the heatmap, the language switch speaks Chinese,
390 px wide has no sideways scroll, and what the page derives from the kept exact cells is byte for
byte what the server sends. A long run's file draws its kept head's overview and says, translated,
that a head it does not keep needs the server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from attnscope.app import standalone
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import load_model
from tests.support.browser import ConsoleWatch, shot
from tests.support.tiny import make_engine

pytestmark = pytest.mark.browser

SENTENCE = "The cat sat on the mat and looked at the dog. "
DRAWN = "() => { const d = document.querySelector('[data-testid=heatmap]'); return d && d.dataset.drawnAt; }"
HEAT = "() => ({...document.querySelector('[data-testid=heatmap]').dataset})"
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}
# the page's fetch, as bytes in base64 (the file's own answer: nothing leaves the page)
FETCH = """async (url) => { const r = await fetch(url); const b = new Uint8Array(await r.arrayBuffer());
  let s = ''; for (const x of b) s += String.fromCharCode(x);
  return {status: r.status, body: btoa(s), headers: Object.fromEntries(r.headers)}; }"""


class Files:
    """Runs analysed by the app (the bundled model) and their standalone files on disk."""

    def __init__(self, client: TestClient, folder: Path) -> None:
        self.client = client
        self.folder = folder
        self.tokenizer = client.app.state.engine.models["attnscope-tiny"].tokenizer  # type: ignore[attr-defined]

    def run(self, n: int) -> dict[str, Any]:
        text = self.tokenizer.decode(self.tokenizer(SENTENCE * (n // 8 + 2))["input_ids"][:n])
        run: dict[str, Any] = self.client.post("/api/runs", json={"text": text}).json()
        assert len(run["tokens"]) == n
        return run

    def saved(self, run: dict[str, Any], query: str = "") -> Path:
        r = self.client.get(f"/api/runs/{run['run_id']}/export?format=html{query}")
        assert r.status_code == 200, r.text[:300]
        path = self.folder / f"{run['run_id']}.html"
        path.write_bytes(r.content)
        return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Files]:
    tiny = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    app = create_app(Settings(models={}, default_model="attnscope-tiny"),
                     make_engine({"attnscope-tiny": tiny}, "attnscope-tiny"))
    with TestClient(app, base_url="http://localhost") as c:
        yield Files(c, tmp_path_factory.mktemp("standalone"))


def offline_page(browser: Any, path: Path, query: str = "", **context: Any) -> tuple[Any, Any, list[str], ConsoleWatch]:
    """The file opened from disk, every request but the file itself aborted (and listed)."""
    ctx = browser.new_context(**(context or {"viewport": {"width": 1400, "height": 1000}}))
    page = ctx.new_page()
    tried: list[str] = []
    me = path.as_uri() + query

    def gate(route: Any) -> None:
        if route.request.url == me:
            route.continue_()
        else:
            tried.append(route.request.url)
            route.abort()

    page.route("**/*", gate)
    watch = ConsoleWatch(page)
    page.goto(me)
    page.wait_for_function(DRAWN, timeout=60_000)
    return ctx, page, tried, watch


def same_answer(page: Any, client: TestClient, url: str, whole: bool) -> None:
    """The file's answer to ``url`` is the server's: a whole head byte for byte, a tile within float32
    rounding (the server computes tiles from the run's Q and K; one step of 8 bits)."""
    got = page.evaluate(FETCH, url)
    want = client.get(url)
    assert got["status"] == 200 == want.status_code, url
    assert {k: v for k, v in got["headers"].items() if k.startswith("x-attn-")} == \
        {k: v for k, v in want.headers.items() if k.startswith("x-attn-")}, url
    body = base64.b64decode(got["body"])
    if whole:
        assert body == want.content, url
    elif "format=f32" in url:
        np.testing.assert_allclose(np.frombuffer(body, "<f4"), np.frombuffer(want.content, "<f4"),
                                   rtol=1e-4, atol=1e-7, err_msg=url)  # NaN where both are masked
    else:
        mine, theirs = np.frombuffer(body, np.uint8).astype(int), np.frombuffer(want.content, np.uint8).astype(int)
        assert mine.shape == theirs.shape and np.abs(mine - theirs).max() <= 1, url
        assert ((mine == 255) == (theirs == 255)).all(), url  # the same masked bins


def error_text(page: Any) -> str:
    return str(page.evaluate("() => { const e = document.querySelector('#error'); return e.hidden ? '' : e.textContent; }"))


def test_the_file_draws_redraws_focuses_and_speaks_chinese_with_the_network_blocked(browser: Any, files: Files) -> None:
    run = files.run(64)
    ctx, page, tried, watch = offline_page(browser, files.saved(run))
    try:
        first = page.evaluate(HEAT)
        assert (first["n"], first["layer"], first["head"]) == ("64", "0", "0")
        assert page.locator("#tokens [data-index]").count() == 64  # the token strip
        assert page.locator("[data-testid=mask-legend]").is_visible() and page.locator("#legend-swatch").is_visible()
        page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell]').length === 48")
        page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell] [data-badge]').length > 0")
        # nothing that would ask for another run is offered: no Analyse, examples, generation or run exports
        for testid in ("analyze-button", "example-repeat", "generate-button", "export-json", "export-kept",
                       "run-open", "run-download", "run-html"):
            assert not page.get_by_test_id(testid).is_visible(), testid
        assert page.get_by_test_id("prompt-input").evaluate("e => e.readOnly")
        page.get_by_test_id("prompt-input").press("Control+Enter")  # read-only: nothing is sent
        assert not page.evaluate("() => document.body.dataset.busy") and error_text(page) == ""
        shot(page, "standalone-64")

        page.locator("[data-testid=head-cell][data-layer='4'][data-head='0']").click()
        page.wait_for_function("(t) => { const d = document.querySelector('[data-testid=heatmap]').dataset;"
                               " return d.layer === '4' && d.head === '0' && d.drawnAt !== t; }", arg=first["drawnAt"])
        page.locator("#tokens [data-index='10']").click()  # token focus: the row of query 10, keys 0..10
        page.wait_for_function("() => document.querySelector('#focus-chart').dataset.keys === '11'")

        # what the page derives from the kept exact cells is what the server sends: a head whole, byte for
        # byte (the same cells); a tile within float32 rounding (the server computes tiles its own way)
        base = f"/api/runs/{run['run_id']}/attention"
        for query, whole in (("layer=4&head=0&format=bin", True), ("layer=2&head=5&format=f32", True),
                             ("layer=3&format=bin&pool=max&q0=0&q1=64&k0=0&k1=64&size=64", False),  # thumbnails
                             ("layer=1&head=7&format=f32&pool=max&q0=10&q1=11&k0=0&k1=11", False),  # a focus row
                             ("layer=5&head=2&format=bin&q0=3&q1=40&k0=0&k1=64&pool=mean", False),
                             ("layer=0&head=1&format=f32&pool=max&q0=5&q1=64&k0=2&k1=50&size=16", False),  # pooled
                             ("layer=0&format=f32&pool=mean&q0=0&q1=64&k0=0&k1=64&size=7", False)):
            same_answer(page, files.client, f"{base}?{query}", whole)

        page.get_by_test_id("lang-switch").click()
        page.wait_for_function("() => document.documentElement.lang.startsWith('zh')")
        assert "层" in page.locator("#heat-caption").inner_text()
        assert error_text(page) == ""

        # a tool that needs the model says so, in the reader's language, and the page goes on
        page.get_by_test_id("tool-tab-ablate").click()
        page.get_by_test_id("ablate-4-0").click()
        page.wait_for_function("() => document.body.innerText.includes('此文件只包含保存时的内容')")
        shot(page, "standalone-64-zh")
        assert tried == []  # nothing was asked of any server
        assert watch.errors == []
    finally:
        ctx.close()


def test_a_tool_in_the_file_says_it_needs_the_server_in_words_not_paths(browser: Any, files: Files) -> None:
    ctx, page, tried, watch = offline_page(browser, files.saved(files.run(64)))
    try:
        page.get_by_test_id("tool-tab-ablate").click()
        page.get_by_test_id("ablate-4-0").click()
        page.wait_for_function("() => document.body.innerText.includes('This file holds only what was saved with it')")
        assert "/api/" not in page.locator("body").inner_text()  # a reader is not shown the request's path
        assert tried == [] and watch.errors == []
    finally:
        ctx.close()


def test_the_files_own_address_may_ask_for_chinese(browser: Any, files: Files) -> None:
    ctx, page, tried, watch = offline_page(browser, files.saved(files.run(64)), "?lang=zh")
    try:
        page.wait_for_function("() => document.documentElement.lang.startsWith('zh')")
        assert "层" in page.locator("#heat-caption").inner_text()
        assert tried == [] and watch.errors == []
    finally:
        ctx.close()


def test_the_file_at_phone_width_has_no_sideways_scroll(browser: Any, files: Files) -> None:
    ctx, page, tried, watch = offline_page(browser, files.saved(files.run(40), "&lang=zh"), **PHONE)
    try:
        page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell]').length === 48")
        assert page.evaluate("() => document.documentElement.lang").startswith("zh")
        assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        shot(page, "standalone-390")
        assert tried == [] and watch.errors == []
    finally:
        ctx.close()


def test_a_long_runs_file_draws_its_kept_head_and_says_what_it_lacks(browser: Any, files: Files) -> None:
    run = files.run(300)
    ctx, page, tried, watch = offline_page(browser, files.saved(run, "&heads=2.1"))
    try:
        heat = page.evaluate(HEAT)
        assert (heat["layer"], heat["head"], heat["tileRows"]) == ("2", "1", "256")  # its overview tile
        page.wait_for_function("() => document.querySelectorAll('[data-testid=head-cell]').length === 48")
        page.locator("#tokens [data-index='20']").click()  # the exact row, from the kept cells
        page.wait_for_function("() => document.querySelector('#focus-chart').dataset.keys === '21'")
        assert error_text(page) == ""
        base = f"/api/runs/{run['run_id']}/attention?layer=2&head=1"
        for query in ("&format=f32&pool=max&q0=0&q1=300&k0=0&k1=300&size=256",  # the overview, from the kept cells
                      "&format=f32&pool=mean&q0=40&q1=290&k0=10&k1=200&size=256",  # a zoom
                      "&format=bin&pool=max&q0=0&q1=300&k0=0&k1=300&size=64"):
            same_answer(page, files.client, base + query, whole=False)
        page.fill("#zoom-q0", "100")  # a zoom the page asks of the file: its tile, drawn
        page.fill("#zoom-q1", "180")
        page.fill("#zoom-k0", "60")
        page.fill("#zoom-k1", "180")
        page.click("#zoom-apply")
        page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.tileRows === '81'")
        assert error_text(page) == ""
        page.get_by_test_id("lang-switch").click()
        page.locator("[data-testid=head-cell][data-layer='5'][data-head='3']").click()
        page.wait_for_function("() => document.querySelector('#error').textContent.includes('L5H3')")
        assert "此文件只保存了 L2H1 的注意力" in error_text(page)
        assert tried == [] and watch.errors == []
    finally:
        ctx.close()


def test_a_file_whose_head_is_over_the_cap_opens_on_its_overview(browser: Any, files: Files,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standalone, "HEADS_CAP", 100_000)  # as a 16k-token head (537 MB) is over 64 MB
    run = files.run(300)
    path = files.saved(run, "&heads=3.2")
    ctx, page, tried, watch = offline_page(browser, path)
    try:
        heat = page.evaluate(HEAT)
        assert (heat["layer"], heat["head"], heat["tileRows"]) == ("3", "2", "256")
        page.wait_for_function("() => document.querySelector('#focus-chart').dataset.keys === '300'")  # the last row
        assert error_text(page) == ""
        page.locator("#tokens [data-index='20']").click()  # a row it did not keep
        page.wait_for_function("() => document.querySelector('#error').textContent.includes('L3H2')")
        assert "keeps the attention of L3H2" in error_text(page)
        assert tried == [] and watch.errors == []
    finally:
        ctx.close()
