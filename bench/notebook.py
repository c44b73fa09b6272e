"""The notebook widget against the web app, side by side in one run, in headless Chromium.

Widget: JupyterLab from the dev environment with a kernel that holds the bundled model in a Scope;
the time runs from pressing Shift+Enter on a cell ``scope.show(text)`` to the first heatmap drawn in
the widget's frame (the frame's ``performance.timeOrigin + drawnAt``, against the page's clock: one
machine, one clock), and the bytes are the kernel websocket's frames in each direction meanwhile
(the page itself, 5 MB with plotly.js, travels over the comm too: counted). Web app: the same prompt
in the explorer served by uvicorn on loopback: (a) opening ``/?text=…`` in a fresh tab to the first
heatmap (page, scripts, plotly.js and the API: the widget's first view does all of this), (b) clicking
Analyse in an open page (the API only). Bytes are the encoded bodies of every resource fetched. Median
of R tries per length, widget and web app alternating.

    python bench/notebook.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as `python bench/notebook.py`: the repository's imports below

from attnscope.app.main import create_app  # noqa: E402
from attnscope.app.settings import Settings  # noqa: E402
from attnscope.model.load.models import load_model  # noqa: E402
from bench.capture import prompt_of  # noqa: E402
from bench.report import publish  # noqa: E402
from tests.support.browser import ARGS, CHROMIUM  # noqa: E402
from tests.support.jupyter import lab, notebook, run_all, widget_frame  # noqa: E402
from tests.support.servers import serve  # noqa: E402
from tests.support.tiny import make_engine  # noqa: E402

log = logging.getLogger("bench.notebook")
NAME = "attnscope-tiny"
DRAWN_AT = ("() => { const d = document.querySelector('[data-testid=heatmap]');"
            " return d && d.dataset.drawnAt ? performance.timeOrigin + Number(d.dataset.drawnAt) : 0; }")
RESOURCE_BYTES = ("() => performance.getEntriesByType('resource').reduce((s, e) => s + e.encodedBodySize, 0)"
                  " + (performance.getEntriesByType('navigation')[0] || {encodedBodySize: 0}).encodedBodySize")
CLICK_TO_DRAW = """async () => {
  const div = document.querySelector('[data-testid=heatmap]');
  const before = div.dataset.drawnAt || '';
  performance.clearResourceTimings();
  const t0 = performance.now();
  document.querySelector('[data-testid=analyze-button]').click();
  while ((div.dataset.drawnAt || '') === before || document.body.dataset.busy) await new Promise(r => setTimeout(r, 2));
  const bytes = performance.getEntriesByType('resource').reduce((s, e) => s + e.encodedBodySize, 0);
  return [Number(div.dataset.drawnAt) - t0, bytes];
}"""


class Wire:
    """Bytes over the kernel's websockets, each direction, since the last reset."""

    def __init__(self, page: Any) -> None:
        self.received = self.sent = 0
        page.on("websocket", self.attach)

    def attach(self, ws: Any) -> None:
        ws.on("framereceived", lambda payload: self.add("received", payload))
        ws.on("framesent", lambda payload: self.add("sent", payload))

    def add(self, way: str, payload: str | bytes) -> None:
        size = len(payload.encode("utf-8")) if isinstance(payload, str) else len(payload)
        setattr(self, way, getattr(self, way) + size)

    def reset(self) -> None:
        self.received = self.sent = 0


def widget_once(page: Any, wire: Wire, cell: int, timeout_s: float = 600) -> tuple[float, int, int, Any]:
    """Shift+Enter on the cell ``scope.show(text)``: ms to the first heatmap in its new widget, bytes
    received and sent over the kernel websocket meanwhile, and the widget's frame."""
    target = page.locator(".jp-Notebook .jp-Cell").nth(cell)
    target.locator(".jp-InputArea-editor").click()
    page.wait_for_timeout(300)
    wire.reset()
    t0 = page.evaluate("() => performance.timeOrigin + performance.now()")
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        frames = target.locator("[data-testid=attnscope-frame]")
        if frames.count():
            frame = frames.first.element_handle().content_frame()
            try:
                drawn = float(frame.evaluate(DRAWN_AT)) if frame is not None else 0.0
            except Exception:  # noqa: BLE001 - the frame navigated meanwhile: look again
                drawn = 0.0
            if drawn > t0:
                return drawn - t0, wire.received, wire.sent, frame
        time.sleep(0.01)
    raise TimeoutError(f"cell {cell}'s widget drew no heatmap in {timeout_s:.0f} s")


def open_once(browser: Any, url: str, text: str) -> tuple[float, int]:
    """A fresh tab on ``/?text=``: ms from navigation to the first heatmap, bytes of every resource."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(f"{url}/?{urlencode({'text': text, 'model': NAME})}")
    page.wait_for_function("() => { const d = document.querySelector('[data-testid=heatmap]');"
                           " return d.dataset.drawnAt && d.dataset.n && !document.body.dataset.busy; }", timeout=600_000)
    ms = float(page.evaluate("() => Number(document.querySelector('[data-testid=heatmap]').dataset.drawnAt)"))
    size = int(page.evaluate(RESOURCE_BYTES))
    context.close()
    return ms, size


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,1024")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--write", type=Path, default=None)
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    from playwright.sync_api import sync_playwright

    lm = load_model(NAME, f"bundled:{NAME}")
    texts = {n: prompt_of(lm.tokenizer, n) for n in lengths}
    engine = make_engine({NAME: lm}, NAME, store_bytes=4 << 30)
    setup = ("import json\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\nimport attnscope\n"
             "from attnscope.model.load.models import BUNDLED_DIR\nfolder = BUNDLED_DIR / 'attnscope-tiny'\n"
             "scope = attnscope.Scope(AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder))\n"
             "texts = {int(k): v for k, v in json.load(open('texts.json')).items()}\nscope.run(texts[64]).heads();")
    cells = [setup] + [f"scope.show(texts[{n}], height=600)" for n in lengths]
    rows: dict[int, dict[str, list[float]]] = {n: {} for n in lengths}
    with tempfile.TemporaryDirectory() as tmp, lab(Path(tmp)) as jupyter, \
            serve(create_app(Settings(models={}, default_model=NAME, max_body_bytes=1 << 22), engine)) as url, \
            sync_playwright() as pw:
        folder = Path(tmp)
        (folder / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
        (folder / "bench.ipynb").write_text(json.dumps(notebook(cells)), encoding="utf-8")
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        lab_page = browser.new_page(viewport={"width": 1400, "height": 1000})
        wire = Wire(lab_page)
        run_all(lab_page, jupyter, "bench.ipynb")  # the setup, and a first widget of each length (warm)
        for i in range(len(lengths)):  # every first widget drawn: nothing of theirs on the wire below
            widget_frame(lab_page, i, timeout_s=600).wait_for_function(DRAWN_AT, timeout=600_000)
        lab_page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=600_000)
        app_page = browser.new_page(viewport={"width": 1400, "height": 1000})
        app_page.goto(url + "/")
        app_page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt"
                                   " && !document.body.dataset.busy", timeout=600_000)
        for n in lengths:
            open_once(browser, url, texts[n])  # warm: the same work once before timing
            for _ in range(args.repeats):
                ms, got, sent, frame = widget_once(lab_page, wire, 1 + lengths.index(n))
                frame.wait_for_function("() => !document.body.dataset.busy", timeout=600_000)
                wire.reset()
                widget_click = float(frame.evaluate(CLICK_TO_DRAW)[0])  # Analyse again, inside the widget
                click_wire = wire.received
                opened, open_bytes = open_once(browser, url, texts[n])
                app_page.fill("[data-testid=prompt-input]", texts[n])
                clicked, click_bytes = app_page.evaluate(CLICK_TO_DRAW)
                for key, value in (("widget", ms), ("received", got), ("sent", sent), ("open", opened),
                                   ("open_bytes", open_bytes), ("click", clicked), ("click_bytes", click_bytes),
                                   ("widget_click", widget_click), ("click_wire", click_wire)):
                    rows[n].setdefault(key, []).append(float(value))
                log.info("n=%d widget %.0f ms (%d B in, %d B out), click %.0f ms (%d B in); web app open %.0f ms (%d B), "
                         "click %.0f ms (%d B)", n, ms, got, sent, widget_click, click_wire, opened, open_bytes, clicked,
                         click_bytes)
        browser.close()
    table = ["| tokens | first view: widget, Shift+Enter on `scope.show(text)` → heatmap | web app, open `/?text=` → "
             "heatmap | widget ÷ web app | click Analyse → heatmap: widget | web app | widget ÷ web app | "
             "bytes, first view: widget over the comm (kernel → page / page → kernel) | web app (page, scripts, "
             "plotly.js, API) | bytes, click: widget (kernel → page) | web app (API) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in lengths:
        r = {k: statistics.median(v) for k, v in rows[n].items()}
        table.append(f"| {n:,} | {r['widget']:.0f} ms | {r['open']:.0f} ms | **{r['widget'] / r['open']:.2f}×** | "  # noqa: RUF001
                     f"{r['widget_click']:.0f} ms | {r['click']:.0f} ms | **{r['widget_click'] / r['click']:.2f}×** | "  # noqa: RUF001
                     f"{r['received'] / 1e6:.2f} MB / {r['sent'] / 1e3:.1f} kB | {r['open_bytes'] / 1e6:.2f} MB | "
                     f"{r['click_wire'] / 1e3:.1f} kB | {r['click_bytes'] / 1e3:.1f} kB |")
    publish(table, args.write, "notebook", f"python bench/notebook.py --lengths {args.lengths} --repeats {args.repeats} --write BENCHMARKS.md")

if __name__ == "__main__":
    main()
