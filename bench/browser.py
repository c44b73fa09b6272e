"""Time from clicking Analyse to the first heatmap drawn, in headless Chromium.

Starts the app on loopback with the bundled model, types a prompt of exactly n tokens,
clicks Analyse and waits until the heatmap reports it was drawn (performance.now() on
both ends, inside the page). Also times clicking another head (a new binary slice and a
redraw). Median of R tries per n.

    python bench/browser.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from bench.capture import prompt_of  # noqa: E402
from bench.report import write_section  # noqa: E402
from model.loading import load_model  # noqa: E402
from tests.browser import ARGS, CHROMIUM  # noqa: E402
from tests.conftest import make_engine  # noqa: E402
from tests.servers import serve  # noqa: E402

log = logging.getLogger("bench.browser")

CLICK_TO_DRAW = """async () => {
  const div = document.querySelector('[data-testid=attention-heatmap]');
  const before = div.dataset.drawnAt || '';
  const t0 = performance.now();
  document.querySelector('[data-testid=analyze-button]').click();
  while ((div.dataset.drawnAt || '') === before) await new Promise(r => setTimeout(r, 2));
  return Number(div.dataset.drawnAt) - t0;
}"""

HEAD_SWITCH = """async (sel) => {
  const div = document.querySelector('[data-testid=attention-heatmap]');
  const before = div.dataset.drawnAt;
  const t0 = performance.now();
  document.querySelector(sel).click();
  while (div.dataset.drawnAt === before) await new Promise(r => setTimeout(r, 2));
  return Number(div.dataset.drawnAt) - t0;
}"""


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", type=Path, default=None)
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    lm = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    engine = make_engine({"attnscope-tiny": lm}, "attnscope-tiny", cache_bytes=4 << 30)
    rows = []
    with serve(create_app(Settings(models={}, default_model="attnscope-tiny", max_body_bytes=1 << 22), engine)) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(url + "/")
        page.wait_for_selector("#model-picker option", state="attached")
        for n in (int(x) for x in args.lengths.split(",")):
            if n > lm.info.max_positions:
                log.info("skipping n=%d: the model has %d positions", n, lm.info.max_positions)
                continue
            page.fill("[data-testid=prompt-input]", prompt_of(lm.tokenizer, n))
            page.evaluate(CLICK_TO_DRAW)  # warm-up
            draws, switches = [], []
            for rep in range(args.repeats):
                draws.append(page.evaluate(CLICK_TO_DRAW))
                page.wait_for_function("() => !document.querySelector('[data-testid=analyze-button]').disabled")
                switches.append(page.evaluate(HEAD_SWITCH, f"[data-testid=head-cell][data-layer='1'][data-head='{rep % 8}']"))
            assert page.get_by_test_id("token").count() == n
            row = {"n": n, "draw": statistics.median(draws), "draw_max": max(draws), "switch": statistics.median(switches)}
            log.info("n=%d click->heatmap median %.0f ms (max %.0f), head switch %.0f ms", n, row["draw"], row["draw_max"], row["switch"])
            rows.append(row)
        browser.close()
    table = ["| n tokens | click Analyse → heatmap drawn, median (max) | click another head → redrawn, median |",
             "|---|---|---|"]
    table += [f"| {r['n']} | **{r['draw']:.0f} ms** ({r['draw_max']:.0f} ms) | {r['switch']:.0f} ms |" for r in rows]
    text = "\n".join(table)
    sys.stdout.write(text + "\n")
    if args.write:
        write_section(args.write, "browser", text, "python bench/browser.py --write BENCHMARKS.md")


if __name__ == "__main__":
    main()
