"""Long prompts in bounded memory (issue 15): capture vs a plain SDPA forward, bytes kept vs dense
patterns, peak RSS, and the time to a tile, on config-built models (random weights, no download).

    python bench/long.py            # writes the "long" section of BENCHMARKS.md

Rows: the long-context Llama of tests/support/families.py (2 layers, hidden 128, 4 heads, 2 K/V heads,
32,768 positions) at n = 1k, 4k, 16k, 32k, and a GPT-2-small-shaped model (12 x 12 heads,
d_model 768, 1,024 positions) at 256 and 1,024. Per row:

* SDPA: one plain forward of the same model with ``attn_implementation="sdpa"`` (last logits only);
* capture forward: the engine's forward through attnscope's capture point (the "forward" of the run's
  ``timing_ms``): the layer outputs from torch's fused kernel with each row's lse, the kept Q/K and
  residual stream (every head score follows from these after the response);
* analyse → response: the whole ``engine.analyse`` (tokenize, the capture forward, predictions at every
  position, keeping the run) until it returns — what a client waits for the response;
* exact scores: every head score from the kept Q, K and lse -- previous-token, first-token and
  induction from single dot products, entropy and peak from every visible cell again (one tiled pass of
  log-weights, ``model.scores.pairs.entropy_and_peak``) -- which runs
  *after* the response in the engine's background worker (``model/scores/late.py``;
  ``timing_ms["exact_scores"]`` of the completed run);
* capture + exact / SDPA: both model passes against SDPA — the model work of every exact score;
* analyse → all scores: from the analyse's start until the last late score is in
  (``timing_ms["scores_ready"]``); the next row starts only then, so the worker never overlaps a timing;
* kept: the run's ``nbytes`` against every head's dense float32 pattern (L x H x n² x 4 B);
* peak RSS: the process's high-water mark during the analyse (reset through /proc/self/clear_refs);
* overview: a whole head pooled to 256 x 256 bins (max), through the API's tile code;
  exact tile: 256 x 256 single cells from the middle of the run;
* browser (``--browser``): in headless Chromium on the explorer serving the same model, the time from
  the analyse response to the first overview drawn, and a zoom session's steps from the overview
  down to single labelled cells (bench/browser.py's ``chromium_for``); "—" without ``--browser``.

The machine is shared (a training job owns one of its two cores): its load average is recorded
beside the table. Timings are wall-clock medians (SDPA and the analyse alternate, 3 of each up to 4,096
tokens, 1 above); nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from attnscope.app.memory import rss_bytes, tune_malloc  # noqa: E402
from attnscope.model.capture.forward import RESIDUAL  # noqa: E402
from attnscope.model.load.models import LoadedModel, wrap_model  # noqa: E402
from attnscope.model.runs.tiles import TileSpec, head_tiles  # noqa: E402
from attnscope.model.scores.live import scored_run  # noqa: E402
from bench.report import publish  # noqa: E402
from tests.support.families import LONG_POSITIONS, long_llama  # noqa: E402
from tests.support.tiny import make_engine  # noqa: E402
from tests.support.tinytok import tiny_tokenizer  # noqa: E402

log = logging.getLogger("bench.long")
MIB = 1 << 20
# (model key, model, prompt) -> Chromium's timings of the explorer on that prompt (bench/browser.py's
# chromium_for): "overview_ms" from the analyse response to the first overview, "zoom_ms" / "zoom_max_ms"
BrowserHook = Callable[[str, LoadedModel, str], dict[str, float]]


def gpt2_small() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
    return GPT2LMHeadModel(config).eval()


def load_average() -> str:
    try:
        return " / ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def reset_peak_rss() -> bool:
    """Reset the kernel's VmHWM (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall-clock ms of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def text_of(n: int) -> str:
    gen = torch.Generator().manual_seed(n)
    alphabet = "abcdefghij klmnopqrstuvwxyz,."
    return "".join(alphabet[i] for i in torch.randint(len(alphabet), (n,), generator=gen).tolist())


def row(key: str, lm: LoadedModel, n: int, browser: BrowserHook | None, text: str | None = None) -> dict[str, str]:
    """One table row; ``text`` (default: ``text_of(n)``) must be ``n`` tokens of the model's tokenizer."""
    model = lm.model
    engine = make_engine({key: lm}, key, store_bytes=16 << 30, max_tokens=n)
    text = text_of(n) if text is None else text
    ids = torch.tensor(lm.tokenizer(text)["input_ids"])
    assert len(ids) == n, (len(ids), n)
    repeats = 3 if n <= 4096 else 1

    def sdpa() -> None:
        model.set_attn_implementation("sdpa")
        try:
            with torch.inference_mode():
                model(input_ids=ids[None], use_cache=False, logits_to_keep=1)
        finally:
            model.set_attn_implementation(lm.spec.attn_implementation)

    if n <= 4096:  # warm-up of both paths (allocator, kernels); long rows are warm from the short ones
        sdpa()
        with lm.lock:
            scored_run(lm, ids[: min(n, 256)], RESIDUAL)
    sdpas, captures, exacts, analyses, readies = [], [], [], [], []
    for _ in range(repeats):  # SDPA and the analyse alternate: a load that comes and goes hits both alike
        t0 = time.perf_counter()
        sdpa()
        sdpas.append(1e3 * (time.perf_counter() - t0))
        reset_peak_rss()
        before = rss_bytes() or 0
        t0 = time.perf_counter()
        result = engine.analyse(text, key, top_k=10)
        analyses.append(1e3 * (time.perf_counter() - t0))
        assert "exact_scores" not in result.record.summary.timing_ms  # the response did not wait for them
        cache = engine.wait_scores(result.run_id, None)  # the background sweep for the head scores
        timing = cache.summary.timing_ms
        captures.append(timing["forward"])  # the capture forward, inside analyse
        exacts.append(timing["exact_scores"])  # the head scores' sweep, after the response
        readies.append(timing["scores_ready"])  # analyse start -> the last score in
        peak = peak_rss()
    sdpa_ms, capture_ms, analyse_ms = statistics.median(sdpas), statistics.median(captures), statistics.median(analyses)
    exact_ms, ready_ms = statistics.median(exacts), statistics.median(readies)
    engine.close()
    dense = cache.n_layers * cache.n_heads * n * n * 4
    layer, head = cache.n_layers - 1, cache.n_heads - 1
    overview_ms = timed(lambda: head_tiles(cache.attention[layer], [head], TileSpec(0, n, 0, n, size=256, pool="max")),
                        repeats)
    mid = n // 2
    exact = TileSpec(mid, min(n, mid + 256), max(0, mid - 128), min(n, mid + 128), size=None, pool="max")
    tile_ms = timed(lambda: head_tiles(cache.attention[layer], [head], exact), repeats)
    drawn = browser(key, lm, text) if browser is not None else None
    log.info("%s n=%d: sdpa %.0f ms, capture %.0f ms, kept %.1f MiB", key, n, sdpa_ms, capture_ms, cache.nbytes / MIB)
    return {
        "model": key, "n": f"{n:,}", "SDPA forward": f"{sdpa_ms:,.0f} ms", "capture forward": f"{capture_ms:,.0f} ms",
        "capture / SDPA": f"{capture_ms / sdpa_ms:.2f}x", "analyse → response": f"{analyse_ms:,.0f} ms",
        "exact scores (after the response)": f"{exact_ms:,.0f} ms",
        "capture + exact / SDPA": f"{(capture_ms + exact_ms) / sdpa_ms:.2f}x",
        "analyse → all scores": f"{ready_ms:,.0f} ms",
        "kept": f"{cache.nbytes / MIB:,.1f} MiB", "dense fp32 patterns": f"{dense / MIB:,.0f} MiB",
        "kept / dense": f"{cache.nbytes / dense:.4f} (1/{dense / cache.nbytes:,.1f})",
        "peak RSS": "—" if peak is None else f"{peak / MIB:,.0f} MiB (from {before / MIB:,.0f})",
        "overview 256² (max)": f"{overview_ms:,.0f} ms", "exact 256² tile": f"{tile_ms:,.1f} ms",
        "Chromium: response → overview": "—" if drawn is None else f"{drawn['overview_ms']:,.0f} ms",
        "Chromium: zoom step, median (max)": "—" if drawn is None else
        f"{drawn['zoom_ms']:,.0f} ms ({drawn['zoom_max_ms']:,.0f} ms)",
    }


def main(argv: list[str] | None = None, browser: BrowserHook | None = None) -> list[dict[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384,32768", help="n for the long-context Llama")
    parser.add_argument("--gpt2-lengths", default="256,1024", help="n for the GPT-2-small-shaped model")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 here: with a training job on one of two cores, two threads wait for "
                             "each other at every op and both paths run 4-5x slower)")
    parser.add_argument("--browser", action="store_true", help="also time the explorer in Chromium on each run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.browser and browser is None:
        from bench.browser import chromium_for

        browser = chromium_for
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tune_malloc()
    load_start = load_average()
    rows = []
    llama = wrap_model("long-llama", long_llama(), tiny_tokenizer(), source="config:long-llama")
    assert llama.info.max_positions == LONG_POSITIONS
    rows += [row("long-llama", llama, int(n), browser) for n in args.lengths.split(",") if n]
    del llama
    gpt2 = wrap_model("gpt2-small-shape", gpt2_small(), tiny_tokenizer(), source="config:gpt2-small")
    rows += [row("gpt2-small-shape", gpt2, int(n), browser) for n in args.gpt2_lengths.split(",") if n]
    columns = list(rows[0])
    table = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                      + ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows])
    body = (f"Load average (1/5/15 min) at the start: {load_start}; at the end: {load_average()} — a 2-core "
            "machine shared with other work (a training job on both cores and other sessions' tests, at times: the "
            "load averages say how much), so times are upper bounds and ratios are noisy.\n"
            "long-llama: Llama shape, 2 layers, d_model 128, 4 heads, 2 K/V heads, 32,768 positions; "
            "gpt2-small-shape: 12 layers x 12 heads, d_model 768. Both float32 on the CPU, random weights. "
            "'capture forward' is the forward through attnscope's capture point: layer outputs and row "
            "normalisers from torch's fused kernel (the one SDPA runs), Q/K and the residual stream kept. 'analyse → "
            "response' is the whole engine.analyse until it returns: tokenize, the capture forward, next-token "
            "predictions at every position (top-10) and keeping the run. 'exact scores' is the sweep for every head "
            "score from the kept Q, K and lse: previous-token, first-token and induction from single dot products, "
            "entropy and peak from every visible cell again (one tiled pass of log-weights, each cell's one "
            "product with the row's lse known): it runs after the response, in the engine's background worker; "
            "'capture + exact / SDPA' is the model work of every exact score against SDPA, and 'analyse → all "
            "scores' the time from the analyse's start until the last of them is in. "
            "'Chromium' (with --browser): the explorer in headless Chromium on the same prompt — from the analyse "
            "response to the first overview tile drawn, and each zoom step (a drag-sized zoom halving the window, "
            "from the overview down to 16 x 16 single cells) to its finer tile drawn.\n\n" + table)
    publish([body], None if args.no_write else args.out, "long",
            "python bench/long.py" + ("" if argv is None else " " + " ".join(argv)))
    return rows


if __name__ == "__main__":
    main()
