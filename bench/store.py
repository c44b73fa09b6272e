"""What keeping runs on disk costs, side by side in one run.

Per model and length: the analyse → response time of an engine whose runs are also written to a run
directory (the write queued to a background thread) against the same engine in memory only, in
alternating order (ABBA; the write of one run is left to finish before the next analyse: what a person
waiting for the response sees); the run file's bytes, the time to write it (dump + fsync + rename) and to read it back (read +
every check + the record rebuilt); and after a restart, the time to the first heatmap bytes of a stored
run (GET …/attention?format=bin on a fresh app whose memory holds nothing: the file is read, the head
rebuilt from its Q and K), and a shared link ``/?run=ID`` opened in Chromium on another freshly started
server to its heatmap drawn. The bundled model at 64 and 1,024 tokens (its limit), the config-built
long-context Llama at 1,024 and 16,384. Then the standalone HTML of a 64-token bundled run: bytes, and
the time from opening it at file:// (every request blocked) to the first heatmap, in Chromium.

    python bench/store.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as `python bench/store.py`: the repository's imports below

import torch  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from attnscope.app.main import create_app  # noqa: E402
from attnscope.app.settings import Settings  # noqa: E402
from attnscope.model.load.models import LoadedModel, load_model, wrap_model  # noqa: E402
from attnscope.model.runs import runfile  # noqa: E402
from attnscope.model.runs.disk import RunDir  # noqa: E402
from attnscope.model.runs.persist import RunFiles, record_of  # noqa: E402
from attnscope.model.runs.record import RunStore  # noqa: E402
from attnscope.model.services.engine import Engine  # noqa: E402
from bench.capture import prompt_of  # noqa: E402
from bench.long import text_of  # noqa: E402
from bench.report import publish  # noqa: E402
from tests.support.browser import ARGS, CHROMIUM  # noqa: E402
from tests.support.families import long_llama  # noqa: E402
from tests.support.servers import serve  # noqa: E402
from tests.support.tinytok import tiny_tokenizer  # noqa: E402

log = logging.getLogger("bench.store")


def engine(lm: LoadedModel, folder: Path | None) -> Engine:
    store = RunStore(16 << 30)
    made = Engine({lm.info.name: lm}, lm.info.name, store, lm.info.max_positions or 1 << 20, forward_bytes=32 << 30)
    if folder is not None:
        store.backing = RunFiles(RunDir.open(folder, 64 << 30), made.origin)
    return made


def measure(lm: LoadedModel, text: str, repeats: int, folder: Path) -> dict[str, float]:
    memory, disk = engine(lm, None), engine(lm, folder)
    backing = disk.store.backing
    assert isinstance(backing, RunFiles)
    disk.origin_of(lm.info.name)  # the fingerprint once, as a server computes it at its first write
    rows: dict[str, list[float]] = {}
    run_id = ""
    for i in range(repeats + 1):  # the first pair warms up; the order alternates (ABBA), nothing else between
        pair = (("memory", memory), ("disk", disk)) if i % 2 == 0 else (("disk", disk), ("memory", memory))
        for name, eng in pair:
            t0 = time.perf_counter()
            result = eng.analyse(text)
            rows.setdefault(name, []).append(time.perf_counter() - t0)
            eng.scores.wait_idle(600)  # its late scores, and with the directory their file, before the next
            if name == "disk":
                run_id = result.run_id
                backing.wait_idle(600)
    record = disk.store.get(run_id)
    origin = disk.origin(record)
    assert origin is not None
    for i in range(repeats + 1):  # the file's own costs, measured apart (the writer thread does this)
        t0 = time.perf_counter()
        data = runfile.dump(record, model_fingerprint=origin.model_fingerprint,
                            tokenizer_fingerprint=origin.tokenizer_fingerprint, dtype=origin.dtype)
        t1 = time.perf_counter()
        backing.folder.put(f"bench{i}", data)
        t2 = time.perf_counter()
        got = backing.folder.get(f"bench{i}")
        assert got is not None
        record_of(got, max_bytes=len(got) + 1)
        t3 = time.perf_counter()
        for key, value in (("dump", t1 - t0), ("put", t2 - t1), ("read", t3 - t2), ("bytes", len(data)),
                           ("kept", record.nbytes)):
            rows.setdefault(key, []).append(value)
    # a restart: a new app on the same directory, nothing in its memory
    restarted = engine(lm, folder)
    settings = Settings(models={}, default_model=lm.info.name, max_cells=1 << 40)
    with TestClient(create_app(settings, restarted), base_url="http://localhost") as client:
        t0 = time.perf_counter()
        got_bin = client.get(f"/api/runs/{run_id}/attention", params={"layer": 0, "head": 0, "format": "bin",
                                                                      **({"size": 256} if record.n > 1024 else {})})
        first = time.perf_counter() - t0
        assert got_bin.status_code == 200, got_bin.text
    linked = link_to_heatmap(engine(lm, folder), run_id, record.n)  # another restart: a shared link opened
    for eng in (memory, disk, restarted):
        eng.close()
    out = {k: statistics.median(v[1:]) for k, v in rows.items()}  # the warm-up pair left out
    out["restart_first"] = first
    out["restart_link"] = linked
    out["n"] = float(record.n)
    log.info("%s n=%d: analyse memory %.0f ms, disk %.0f ms; file %.1f MB: dump %.0f ms, put %.0f ms, read %.0f ms; "
             "after a restart, first heatmap bytes in %.0f ms", lm.info.name, record.n, 1e3 * out["memory"],
             1e3 * out["disk"], out["bytes"] / 1e6, 1e3 * out["dump"], 1e3 * out["put"], 1e3 * out["read"], 1e3 * first)
    return out


def link_to_heatmap(eng: Engine, run_id: str, n: int) -> float:
    """ms from opening ``/?run=ID`` (a shared link) in Chromium on a freshly started server to the heatmap
    drawn: the page, its scripts and plotly.js, the run read from its file, the first heatmap."""
    from playwright.sync_api import sync_playwright

    settings = Settings(models={}, default_model=eng.default, max_cells=1 << 40)
    with serve(create_app(settings, eng)) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/?run={run_id}")
        page.wait_for_function("(n) => { const d = document.querySelector('[data-testid=heatmap]');"
                               " return d && d.dataset.drawnAt && d.dataset.n === String(n); }", arg=n, timeout=600_000)
        drawn = float(page.evaluate("() => Number(document.querySelector('[data-testid=heatmap]').dataset.drawnAt)"))
        browser.close()
    eng.close()
    return drawn


def html_timing(lm: LoadedModel, repeats: int) -> tuple[int, float]:
    """The standalone file of a 64-token run: its bytes, and file:// → first heatmap in Chromium (median)."""
    from playwright.sync_api import sync_playwright

    eng = engine(lm, None)
    settings = Settings(models={}, default_model=lm.info.name)
    with TestClient(create_app(settings, eng), base_url="http://localhost") as client, \
            tempfile.TemporaryDirectory() as tmp:
        run_id = client.post("/api/runs", json={"text": prompt_of(lm.tokenizer, 64)}).json()["run_id"]
        html = client.get(f"/api/runs/{run_id}/export", params={"format": "html"}).content
        path = Path(tmp) / "run.html"
        path.write_bytes(html)
        times = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
            for _ in range(repeats):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                           else route.abort())
                page.goto(path.as_uri())
                page.wait_for_function("() => { const d = document.querySelector('[data-testid=heatmap]');"
                                       " return d && d.dataset.drawnAt; }", timeout=120_000)
                times.append(float(page.evaluate("() => Number(document.querySelector('[data-testid=heatmap]')"
                                                 ".dataset.drawnAt)")))
                page.close()
            browser.close()
    eng.close()
    return len(html), statistics.median(times)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--long", default="1024,16384", help="lengths for the long-context model")
    p.add_argument("--write", type=Path, default=None)
    args = p.parse_args()
    bundled = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    torch.manual_seed(0)
    long = wrap_model("long-llama", long_llama(), tiny_tokenizer(), source="config:long-llama")
    cases = [(bundled, prompt_of(bundled.tokenizer, n)) for n in (64, 1024)]
    cases += [(long, text_of(int(n))) for n in args.long.split(",") if n]
    table = ["| model | tokens | analyse → response: memory only | with the run directory | added | run file | "
             "write (dump + fsync + rename, in the background) | read back (checked, rebuilt) | kept in memory | "
             "after a restart: first heatmap bytes | a shared link `/?run=ID` opened after a restart → heatmap drawn |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lm, text in cases:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure(lm, text, args.repeats, Path(tmp))
        added = r["disk"] / r["memory"] - 1
        table.append(f"| {lm.info.name} | {r['n']:,.0f} | {1e3 * r['memory']:,.0f} ms | {1e3 * r['disk']:,.0f} ms | "
                     f"**{100 * added:+.1f} %** | {r['bytes'] / 2**20:,.1f} MiB | {1e3 * (r['dump'] + r['put']):,.0f} ms | "
                     f"{1e3 * r['read']:,.0f} ms | {r['kept'] / 2**20:,.1f} MiB | {1e3 * r['restart_first']:,.0f} ms | "
                     f"{r['restart_link']:,.0f} ms |")
    size, first = html_timing(bundled, args.repeats)
    table += ["", "| standalone HTML of a 64-token bundled run | bytes | file:// → first heatmap (Chromium, every "
              "request blocked) |", "|---|---|---|", f"| every head exact | {size:,} ({size / 1e6:.2f} MB) | {first:,.0f} ms |"]
    publish(table, args.write, "store", f"python bench/store.py --repeats {args.repeats} --long {args.long} --write BENCHMARKS.md")

if __name__ == "__main__":
    main()
