"""Time from clicking Analyse to the first heatmap drawn, in headless Chromium.

Starts the app on loopback with the bundled model, types a prompt of exactly n tokens,
clicks Analyse and waits until the heatmap reports it was drawn (performance.now() on
both ends, inside the page). Also times clicking another head (a new binary slice and a
redraw). Median of R tries per n.

With --generate N it also compares generation in the browser with the API: the same recorded
request (N tokens, sampled with seed 0, the watched head's rows streamed) read by a plain
HTTP client, and by the page through *Generate & record*, which paints the new rows of the
growing heatmap at most once per animation frame. API and browser runs alternate, so that each
ratio compares two runs under the same load (the load average is reported). Tokens per second
count the streamed tokens from the request to the last token event; "drawn" adds the recorded
run fetched and drawn. Meanwhile the page's responsiveness is probed, separately while tokens
stream and during the final redraw: the longest event-loop stall (a 20 ms timer's lateness),
the longest blocking part of a long animation frame (the Long Animation Frames API, which also
names the scripts), the slowest round trip of a script call and of a real mouse click from
Playwright, and the click's input-to-paint time inside the page (Event Timing).

With --vs-analyse MODELS (issue 39's third target) it times, on each model and length, the
API's analyse (POST /api/runs from a plain HTTP client) and the explorer's click → first heatmap
side by side, alternating, with the page's own split: click → analyse response parsed, response →
heatmap drawn. Target: click → heatmap ≤ the API's analyse + 0.3 s. Each measurement starts with
the server idle (the last run's background scores and the page's thumbnails finished).

    python bench/browser.py --write BENCHMARKS.md
    python bench/browser.py --lengths 0 --generate 128 --write BENCHMARKS.md
    python bench/browser.py --vs-analyse bundled,gpt2-small,smollm2 --lengths 256,1024 --repeats 3 --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from attnscope.app.main import create_app  # noqa: E402
from attnscope.app.settings import Settings  # noqa: E402
from attnscope.model.load.models import LoadedModel, load_model  # noqa: E402
from attnscope.model.runs.jobthread import in_new_thread  # noqa: E402
from bench.capture import prompt_of  # noqa: E402
from bench.report import publish, write_section  # noqa: E402
from tests.support.browser import ARGS, CHROMIUM  # noqa: E402
from tests.support.servers import serve  # noqa: E402
from tests.support.tiny import make_engine  # noqa: E402

log = logging.getLogger("bench.browser")

CLICK_TO_DRAW = """async () => {
  const div = document.querySelector('[data-testid=heatmap]');
  const before = div.dataset.drawnAt || '';
  const t0 = performance.now();
  document.querySelector('[data-testid=analyze-button]').click();
  while ((div.dataset.drawnAt || '') === before) await new Promise(r => setTimeout(r, 2));
  return Number(div.dataset.drawnAt) - t0;
}"""

HEAD_SWITCH = """async (sel) => {
  const div = document.querySelector('[data-testid=heatmap]');
  const before = div.dataset.drawnAt;
  const t0 = performance.now();
  document.querySelector(sel).click();
  while (div.dataset.drawnAt === before) await new Promise(r => setTimeout(r, 2));
  return Number(div.dataset.drawnAt) - t0;
}"""


# A long run in the explorer: from the analyse response (parsed) to the first overview tile drawn,
# then zoom steps as a wheel session makes them (each halves the window around one point, down to
# single labelled cells): from the relayout to the finer tile drawn.
ANALYSE_TO_OVERVIEW = """async () => {
  const div = document.querySelector('[data-testid=heatmap]');
  const before = div.dataset.drawnAt || '';
  const t0 = performance.now();
  document.querySelector('[data-testid=analyze-button]').click();
  while ((div.dataset.drawnAt || '') === before || document.body.dataset.busy) await new Promise(r => setTimeout(r, 2));
  return {click: Number(div.dataset.drawnAt) - t0, response: Number(div.dataset.drawnAt) - Number(div.dataset.runAt),
          rows: Number(div.dataset.tileRows), exact: div.dataset.exact, n: Number(div.dataset.n),
          fetch: Number(div.dataset.tileFetchMs), draw: Number(div.dataset.tileDrawMs)};
}"""

ZOOM_STEPS = """async (n) => {
  const div = document.querySelector('[data-testid=heatmap]');
  const steps = [];
  let q = Math.floor(n * 0.7), k = Math.floor(n * 0.4), w = n;
  while (w > 16) {
    w = Math.max(16, Math.floor(w / 2));
    const before = Number(div.dataset.tiles || 0);
    const t0 = performance.now();
    window.Plotly.relayout(div, {'xaxis.range': [k - w / 2 - 0.5, k + w / 2 - 0.5], 'yaxis.range': [q + w / 2 - 0.5, q - w / 2 - 0.5]});
    while (Number(div.dataset.tiles || 0) === before) await new Promise(r => setTimeout(r, 2));
    steps.push({window: w, ms: Number(div.dataset.drawnAt) - t0, exact: div.dataset.exact,
                fetch: Number(div.dataset.tileFetchMs), draw: Number(div.dataset.tileDrawMs)});
  }
  return steps;
}"""

# the page idle: nothing busy, every owed head score in, the grid's thumbnails drawn (the overview grid of many
# heads fetches only those in view)
SETTLED = ("() => { const g = document.querySelector('[data-testid=head-grid]');"
           " return !document.body.dataset.busy && (g.dataset.mode === 'overview' || g.dataset.thumbLayers === "
           "String(document.querySelector('#layer-picker').options.length)) && "
           "!document.querySelector('[data-testid=head-cell][data-pending=\"1\"]'); }")
GEN_PROMPT = "The history of the city begins"

PROBE = """() => { window.__lag = []; window.__done = false; let last = performance.now();
  const tick = () => { const now = performance.now(); window.__lag.push([now, now - last - 20]); last = now;
                       if (!window.__done) setTimeout(tick, 20); };
  setTimeout(tick, 20);
  // what blocks the page: long animation frames (their blocking part and the scripts in them) and
  // how long a click takes from the input to the next paint (Event Timing)
  window.__loaf = []; window.__events = [];
  new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__loaf.push({ start: e.startTime, dur: e.duration,
      block: e.blockingDuration, scripts: e.scripts.map((x) => `${x.invoker} ${Math.round(x.duration)} ms`) }); })
    .observe({ type: 'long-animation-frame' });
  new PerformanceObserver((l) => { for (const e of l.getEntries()) if (/click|pointer|mouse/.test(e.name))
      window.__events.push({ start: e.startTime, name: e.name, dur: e.duration, delay: e.processingStart - e.startTime }); })
    .observe({ type: 'event', durationThreshold: 16 }); }"""


def api_generation(url: str, n: int) -> tuple[float, int, float]:
    """Seconds from the request to the last token event, the tokens streamed, and the
    server's own seconds for the steps (the events' ms)."""
    body = {"text": GEN_PROMPT, "max_new_tokens": n, "temperature": 1.0, "seed": 0, "stop_at_eos": False,
            "record": True, "watch_layer": 0, "watch_head": 0}
    t0 = time.perf_counter()
    last, count, server_ms = t0, 0, 0.0
    with httpx.stream("POST", url + "/api/generate", json=body, timeout=300) as r:
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token":
                server_ms += json.loads(line[6:])["ms"]
                count += 1
                last = time.perf_counter()
    return last - t0, count, server_ms / 1e3


def browser_generation(page: object, n: int, probe: bool = True) -> dict[str, object]:
    """One *Generate & record* of n tokens in the page. With ``probe``, every 100 ms either a
    script call (page.evaluate's round trip) or a real mouse click on a heading (Playwright's
    round trip, and the page's own input-to-paint time for it); without, Playwright only polls
    for the end every 250 ms, so that the rate is not slowed by the probing itself."""
    page.fill("[data-testid=prompt-input]", GEN_PROMPT)
    page.click("[data-testid=analyze-button]")
    page.wait_for_function("() => !document.body.dataset.busy && document.querySelector('[data-testid=heatmap]').dataset.n")
    page.fill("[data-testid=generate-count]", str(n))
    page.fill("[data-testid=generate-temperature]", "1")
    # the page's own request, with end-of-text not stopping it, so that both sides stream n tokens
    page.evaluate("""() => { if (window.__patched) return; window.__patched = true; const orig = window.fetch; window.fetch = (u, o = {}) => {
        if (String(u).endsWith('/api/generate')) { const b = JSON.parse(o.body); b.stop_at_eos = false; o = {...o, body: JSON.stringify(b)}; }
        return orig(u, o); }; }""")
    box = page.locator("section.panel h2").first.bounding_box()
    target = (box["x"] + 8, box["y"] + box["height"] / 2)  # the Tokens heading: a click that changes nothing
    page.evaluate(PROBE)
    t0 = page.evaluate("() => { window.__t0 = performance.now(); document.querySelector('[data-testid=generate-button]').click(); return window.__t0; }")
    page.evaluate("""() => { const d = document.querySelector('[data-testid=heatmap]');
        new MutationObserver(() => { window.__lastToken = performance.now(); }).observe(d, {attributes: true, attributeFilter: ['data-live-tokens']}); }""")
    trips: list[float] = []
    clicks: list[float] = []
    k = 0
    while not page.evaluate("() => !document.querySelector('#timeline-box').hidden"):
        s = time.perf_counter()
        if not probe:
            time.sleep(0.25)
            continue
        if k % 2:
            page.mouse.click(*target)
            clicks.append(1e3 * (time.perf_counter() - s))
        else:
            page.evaluate("() => performance.now()")
            trips.append(1e3 * (time.perf_counter() - s))
        k += 1
        time.sleep(0.1)
    got = page.evaluate("""() => { window.__done = true; const d = document.querySelector('[data-testid=heatmap]').dataset;
        return {tokens: Number(d.liveTokens), draws: Number(d.liveDraws), last: window.__lastToken, end: performance.now(), lag: window.__lag,
                server: Number(d.liveServerMs) / 1e3, loaf: window.__loaf.filter((e) => e.start > window.__t0),
                events: window.__events.filter((e) => e.start > window.__t0)}; }""")
    last = got["last"]

    def worst(rows: list, at: str, value: str, before: bool) -> float:
        vals = [r[value] for r in rows if (r[at] <= last) == before]
        return max(vals, default=0.0)

    lag = [{"at": a, "lag": v} for a, v in got["lag"] if a > t0]
    loaf = got["loaf"]
    final = [e for e in loaf if e["start"] > last]
    return {"tokens": got["tokens"], "draws": got["draws"], "server_s": got["server"], "stream_s": (last - t0) / 1e3,
            "total_s": (got["end"] - t0) / 1e3,
            "lag_stream_ms": worst(lag, "at", "lag", True), "lag_final_ms": worst(lag, "at", "lag", False),
            "block_stream_ms": worst(loaf, "start", "block", True), "block_final_ms": worst(loaf, "start", "block", False),
            "final_frame": max(final, key=lambda e: e["block"], default=None),
            "click_paint_ms": max((e["dur"] for e in got["events"]), default=0.0),
            "trip_max_ms": max(trips, default=0.0), "click_max_ms": max(clicks, default=0.0), "probes": len(trips) + len(clicks)}


def generation_table(url: str, page: object, n: int, repeats: int) -> str:
    """API and browser runs interleaved (API, browser, API, browser, ...), so that each ratio
    compares two runs under the same load; the load average is reported beside them."""
    api_generation(url, 8)  # warm-up
    load_before = os.getloadavg()[0]
    api, ui = [], []
    for _ in range(repeats):  # the rate: the browser only polled for the end
        api.append(api_generation(url, n))
        ui.append(browser_generation(page, n, probe=False))
    probed = [browser_generation(page, n) for _ in range(2)]  # responsiveness: probed all along
    load_after = os.getloadavg()[0]
    ratios = [(r["tokens"] / r["stream_s"]) / (c / s) for (s, c, _), r in zip(api, ui, strict=True)]
    api_rate = statistics.median(c / s for s, c, _ in api)
    ui_rate = statistics.median(r["tokens"] / r["stream_s"] for r in ui)
    ui_total = statistics.median(r["tokens"] / r["total_s"] for r in ui)
    api_server = statistics.median(c / srv for _, c, srv in api)
    ui_server = statistics.median(r["tokens"] / r["server_s"] for r in ui)
    worst = max(probed, key=lambda r: r["block_final_ms"])
    log.info("generation n=%d: API %.1f tok/s, browser %.1f tok/s streamed, ratios %s; load %.1f -> %.1f; worst final frame %s",
             n, api_rate, ui_rate, [f"{x:.2f}" for x in ratios], load_before, load_after, worst["final_frame"])
    ms = lambda key: f"{max(r[key] for r in probed):.0f} ms"  # noqa: E731 - a column formatter
    rows = ["| tokens | API (HTTP client) | browser, streamed and drawn live | browser ÷ API, each pair (median) | incl. the recorded run drawn | "
            "redraws | longest stall while streaming (timer / blocking frame), probed runs | longest stall in the final redraw (timer / blocking frame) | "
            "slowest script call | slowest click: round trip / input to paint (probed runs) | server's own step rate: API / browser runs | load average |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows.append(f"| {n} | {api_rate:.1f} tok/s | {ui_rate:.1f} tok/s | {' '.join(f'{x:.2f}' for x in ratios)} (**{statistics.median(ratios):.2f}x**) | "
                f"{ui_total:.1f} tok/s | {statistics.median(r['draws'] for r in ui):.0f} for {statistics.median(r['tokens'] for r in ui):.0f} tokens | "
                f"{ms('lag_stream_ms')} / {ms('block_stream_ms')} | {ms('lag_final_ms')} / {ms('block_final_ms')} | {ms('trip_max_ms')} | "
                f"{ms('click_max_ms')} / {ms('click_paint_ms')} | {api_server:.1f} / {ui_server:.1f} tok/s | {load_before:.1f} → {load_after:.1f} |")
    return "\n".join(rows)


def chromium_long(url: str, text: str, repeats: int = 3) -> dict[str, float]:
    """In headless Chromium on the explorer at ``url``: analyse ``text`` ``repeats`` times and
    time the first overview after the analyse response (and after the click), then one zoom
    session from the overview down to single cells. Medians; the zoom steps' median and max."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "/")
        page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy",
                               timeout=600_000)
        page.fill("[data-testid=prompt-input]", text)
        page.evaluate(PROBE)
        runs = [page.evaluate(ANALYSE_TO_OVERVIEW) for _ in range(repeats)]
        n = runs[-1]["n"]
        # the head grid's thumbnails and the late head scores load after the overview: let them finish
        # (sparsity is not waited for: above 2,048 tokens the explorer asks for it only when a sort needs it)
        page.wait_for_function(SETTLED, timeout=600_000)
        steps = page.evaluate(ZOOM_STEPS, n)
        lag = page.evaluate("() => { window.__done = true; return Math.max(0, ...window.__lag.map((x) => x[1])); }")
        browser.close()
    zooms = [s["ms"] for s in steps]
    log.info("chromium n=%d: response -> overview %s ms; zoom steps (window, ms, fetch ms, draw ms) %s", n,
             [round(r["response"]) for r in runs], [(s["window"], round(s["ms"]), round(s["fetch"]), round(s["draw"])) for s in steps])
    return {"n": n, "overview_ms": statistics.median(r["response"] for r in runs),
            "click_ms": statistics.median(r["click"] for r in runs), "zoom_ms": statistics.median(zooms),
            "zoom_max_ms": max(zooms), "steps": len(steps), "exact_at_end": float(steps[-1]["exact"] == "1"), "lag_ms": lag}


REQUESTS = "() => performance.getEntriesByType('resource').length"


def settle(page: object) -> None:
    """Until the page is idle: the heatmap drawn, every owed score in, the thumbnails fetched (in the
    overview grid only those in view: hence also no new request for half a second)."""
    page.wait_for_function(SETTLED, timeout=600_000)  # type: ignore[attr-defined]
    seen = -1
    while (now := page.evaluate(REQUESTS)) != seen:  # type: ignore[attr-defined]
        seen = now
        time.sleep(0.5)


def served_model(key: str, tmp: Path) -> LoadedModel:
    """The models --vs-analyse names: the bundled one, GPT2Config()'s shape (random weights) and SmolLM2."""
    if key == "bundled":
        return load_model("attnscope-tiny", "bundled:attnscope-tiny")
    if key == "gpt2-small":
        from bench.capture import gpt2_small_folder

        return load_model("gpt2-small-random", str(gpt2_small_folder(tmp)))
    if key == "smollm2":
        from tests.support.real import load_smollm2

        return load_smollm2()
    raise SystemExit(f"--vs-analyse: unknown model {key!r} (bundled, gpt2-small, smollm2)")


def api_analyse(url: str, text: str) -> float:
    """POST /api/runs → its JSON parsed, in ms; then waits for the run's background scores (the server idle)."""
    t0 = time.perf_counter()
    made = httpx.post(f"{url}/api/runs", json={"text": text, "top_k": 10}, timeout=600)
    made.raise_for_status()
    run_id = made.json()["run_id"]
    ms = 1e3 * (time.perf_counter() - t0)
    while httpx.get(f"{url}/api/runs/{run_id}/heads", params={"wait": 30}, timeout=600).status_code == 202:
        pass
    return ms


def vs_analyse(key: str, lengths: list[int], repeats: int, tmp: Path) -> list[dict[str, float | str]]:
    """One model served alone: per length, ``repeats`` alternating pairs of the API's analyse and the
    explorer's click → first heatmap (with the page's split at the analyse response). Medians."""
    from playwright.sync_api import sync_playwright

    # loaded and built (the engine's probe forward) on a short-lived thread: the main thread keeps no OpenMP team
    # beside the served app's compute thread (``model.runs.jobthread`` says why a second team slows both)
    lm = in_new_thread(lambda: served_model(key, tmp))
    name = lm.info.name
    engine = in_new_thread(lambda: make_engine({name: lm}, name, store_bytes=2 << 30, max_tokens=max(lengths)))
    rows: list[dict[str, float | str]] = []
    with serve(create_app(Settings(models={}, default_model=name, max_body_bytes=1 << 24), engine)) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "/")
        settle(page)
        for n in lengths:
            if n > lm.info.max_positions:
                log.info("%s: skipping n=%d (%d positions)", name, n, lm.info.max_positions)
                continue
            text = prompt_of(lm.tokenizer, n)
            page.fill("[data-testid=prompt-input]", text)
            api_analyse(url, text)  # warm-up: this length's first forward
            apis, clicks, responses, draws, tile_split = [], [], [], [], []
            for _ in range(repeats):
                apis.append(api_analyse(url, text))
                got = page.evaluate(ANALYSE_TO_OVERVIEW)
                clicks.append(got["click"])
                responses.append(got["click"] - got["response"])
                draws.append(got["response"])
                # a long run's overview tile: fetched, drawn (a short run draws its slice: no tile)
                tile_split.append(tuple(round(x) if x == x else None for x in (got["fetch"], got["draw"])))
                settle(page)  # the grid's thumbnails and late scores
            assert page.get_by_test_id("tokens").get_attribute("data-total") == str(n)
            row: dict[str, float | str] = {
                "model": name, "n": n, "api": statistics.median(apis), "click": statistics.median(clicks),
                "response": statistics.median(responses), "draw": statistics.median(draws), "draw_max": max(draws),
                "over": statistics.median(c - a for c, a in zip(clicks, apis, strict=True))}
            log.info("%s n=%d: API analyse %s ms; click -> heatmap %s ms (response %s, drawn after it %s; overview "
                     "tile fetched, drawn %s)", name, n, [round(x) for x in apis], [round(x) for x in clicks],
                     [round(x) for x in responses], [round(x) for x in draws], tile_split)
            rows.append(row)
        browser.close()
    engine.close()
    return rows


def vs_analyse_table(rows: list[dict[str, float | str]]) -> str:
    """The verdict reads the page's own split (response → heatmap drawn: what the page adds to the
    analyse, measured in one run); the API's analyse beside it shows the page's request costs what a
    plain client's does (the two are separate forwards, each as noisy as the machine)."""
    table = ["| model | n tokens | API analyse (POST /api/runs), median | click Analyse → heatmap drawn, median | "
             "click → analyse response in the page | **response → heatmap drawn** (target ≤ 300 ms), median (max) | "
             "click → heatmap minus API analyse, median of pairs |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "met" if float(r["draw"]) <= 300 else "not met"
        table.append(f"| {r['model']} | {r['n']:,} | {r['api']:,.0f} ms | {r['click']:,.0f} ms | {r['response']:,.0f} ms | "
                     f"**{r['draw']:,.0f} ms** ({r['draw_max']:,.0f} ms; {mark}) | {float(r['over']):+,.0f} ms |")
    return "\n".join(table)


def vs_analyse_main(keys: list[str], lengths: list[int], repeats: int, write: Path | None) -> None:
    import torch

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [r for key in keys for r in vs_analyse(key, lengths, repeats, Path(tmp))]
    publish([vs_analyse_table(rows)], write, "browser-vs-analyse",
            f"python bench/browser.py --vs-analyse {','.join(keys)} --lengths {','.join(map(str, lengths))} "
            f"--repeats {repeats} --write BENCHMARKS.md")


def long_table(rows: list[dict[str, float]]) -> str:
    table = ["| n tokens | analyse response → first overview drawn, median | click Analyse → overview | "
             "zoom step → finer tile drawn, median (max) over a session to single cells | longest event-loop stall |",
             "|---|---|---|---|---|"]
    table += [f"| {r['n']:,.0f} | **{r['overview_ms']:.0f} ms** | {r['click_ms']:.0f} ms | "
              f"**{r['zoom_ms']:.0f} ms** ({r['zoom_max_ms']:.0f} ms, {r['steps']:.0f} steps) | {r['lag_ms']:.0f} ms |"
              for r in rows]
    return "\n".join(table)


def chromium_for(key: str, lm: LoadedModel, text: str, repeats: int = 2) -> dict[str, float]:
    """bench/long.py's browser hook: serve ``lm`` alone and time the explorer on ``text``."""
    engine = in_new_thread(lambda: make_engine({key: lm}, key, store_bytes=8 << 30, max_tokens=lm.info.max_positions))
    settings = Settings(models={}, default_model=key, max_body_bytes=8 << 20)
    with serve(create_app(settings, engine)) as url:
        return chromium_long(url, text, repeats)


def long_main(lengths: list[int], repeats: int, write: Path | None) -> None:
    """--long: bench/long.py's long-context Llama (and prompts), served alone, one Chromium session per length."""
    import torch

    from attnscope.model.load.models import wrap_model
    from bench.long import text_of
    from tests.support.families import long_llama
    from tests.support.tinytok import tiny_tokenizer

    torch.set_num_threads(1)  # as bench/long.py: with a training job on one of two cores, one thread is faster
    lm = wrap_model("long-llama", long_llama(), tiny_tokenizer(), source="config:long-llama")
    rows = [chromium_for("long-llama", lm, text_of(n), repeats) for n in lengths]
    text = long_table(rows)
    sys.stdout.write(text + "\n")
    if write:
        write_section(write, "browser-long", text,
                      f"python bench/browser.py --long {','.join(map(str, lengths))} --repeats {repeats} --write BENCHMARKS.md")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", type=Path, default=None)
    p.add_argument("--generate", type=int, default=0, help="also compare generating N tokens in the browser with the API")
    p.add_argument("--gen-repeats", type=int, default=3, help="API / browser pairs for --generate")
    p.add_argument("--long", default="", help="comma-separated lengths: time the tiled heatmap of the config-built "
                                               "long-context model instead (overview after the analyse response, zoom steps)")
    p.add_argument("--vs-analyse", default="", help="comma-separated models (bundled, gpt2-small, smollm2): the API's "
                                                     "analyse and click -> first heatmap side by side")
    args = p.parse_args()
    if args.vs_analyse:
        vs_analyse_main(args.vs_analyse.split(","), [int(x) for x in args.lengths.split(",")], args.repeats, args.write)
        return
    if args.long:
        long_main([int(x) for x in args.long.split(",")], args.repeats, args.write)
        return
    from playwright.sync_api import sync_playwright

    lm = in_new_thread(lambda: load_model("attnscope-tiny", "bundled:attnscope-tiny"))  # as vs_analyse says
    engine = in_new_thread(lambda: make_engine({"attnscope-tiny": lm}, "attnscope-tiny", store_bytes=4 << 30))
    rows = []
    with serve(create_app(Settings(models={}, default_model="attnscope-tiny", max_body_bytes=1 << 22), engine)) as url, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(url + "/")
        page.wait_for_selector("#model-picker option", state="attached")
        # the explorer analyses its example on load: let that finish first
        page.wait_for_function("() => document.querySelector('[data-testid=heatmap]').dataset.drawnAt && !document.body.dataset.busy")
        for n in (int(x) for x in args.lengths.split(",") if int(x) > 0):
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
            assert page.get_by_test_id("tokens").get_attribute("data-total") == str(n)
            row = {"n": n, "draw": statistics.median(draws), "draw_max": max(draws), "switch": statistics.median(switches)}
            log.info("n=%d click->heatmap median %.0f ms (max %.0f), head switch %.0f ms", n, row["draw"], row["draw_max"], row["switch"])
            rows.append(row)
        gen_table = generation_table(url, page, args.generate, max(1, args.gen_repeats)) if args.generate else ""
        browser.close()
    table = ["| n tokens | click Analyse → heatmap drawn, median (max) | click another head → redrawn, median |",
             "|---|---|---|"]
    table += [f"| {r['n']} | **{r['draw']:.0f} ms** ({r['draw_max']:.0f} ms) | {r['switch']:.0f} ms |" for r in rows]
    text = "\n".join(table)
    if rows:
        sys.stdout.write(text + "\n")
    if gen_table:
        sys.stdout.write(gen_table + "\n")
    if args.write and rows:
        write_section(args.write, "browser", text,  # the command that made it, with the lengths and repeats
                      f"python bench/browser.py --lengths {args.lengths} --repeats {args.repeats} --write BENCHMARKS.md")
    if args.write and gen_table:
        write_section(args.write, "browser-generate", gen_table,
                      f"python bench/browser.py --lengths 0 --generate {args.generate} --write BENCHMARKS.md")


if __name__ == "__main__":
    main()
