"""Capture overhead: the hooked forward and POST /api/runs vs a bare eager forward, one run.

For each model and prompt length n, alternates R times between
  bare:     model(input_ids, output_attentions=True) under inference_mode (eager attention)
  capture:  model.hooks.run_with_cache: the same forward with every hook (all patterns, the
            residual stream, attention and MLP outputs, logits) kept
  POST:     the full HTTP request POST /api/runs through the ASGI app (tokenize, hooked
            forward, head scores, predictions at every position, JSON response)
and reports medians and their ratios to bare, plus the bytes per visible cell of one
head's binary and JSON attention responses.

    python bench/capture.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from app.main import create_app  # noqa: E402
from app.memory import tune_malloc  # noqa: E402
from app.settings import Settings  # noqa: E402
from bench.report import write_section  # noqa: E402
from model.cache import RunStore  # noqa: E402
from model.engine import Engine  # noqa: E402
from model.hooks import run_with_cache  # noqa: E402
from model.loading import BUNDLED_DIR, load_model  # noqa: E402
from model.names import act_name  # noqa: E402

log = logging.getLogger("bench.capture")
BUNDLED = BUNDLED_DIR / "attnscope-tiny"
CORPUS = (ROOT / "tests" / "data" / "heldout_sample.txt")


def gpt2_small_folder(tmp: Path) -> Path:
    """GPT2Config() (124M, 12 x 12, d 768, 1,024 positions) with random weights."""
    folder = tmp / "gpt2-small-random"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(folder)
        AutoTokenizer.from_pretrained(BUNDLED).save_pretrained(folder)
    return folder


def prompt_of(tokenizer: AutoTokenizer, n: int) -> str:
    """A text of exactly n tokens, cut from held-out English."""
    text = CORPUS.read_text(encoding="utf-8")
    while len(tokenizer(text)["input_ids"]) < n + 8:
        text += "\n" + text
    ids = tokenizer(text)["input_ids"]
    for cut in range(n, n + 8):
        candidate = tokenizer.decode(ids[:cut])
        if len(tokenizer(candidate)["input_ids"]) == n:
            return candidate
    raise RuntimeError(f"no text of exactly {n} tokens")


def measure(name: str, source: str, lengths: list[int], repeats: int) -> list[dict[str, float]]:
    lm = load_model(name, source)
    engine = Engine({name: lm}, name, RunStore(8 << 30), 1024)
    client = TestClient(create_app(Settings(models={}, default_model=name, max_body_bytes=1 << 24), engine))
    rows = []
    with client:
        for n in lengths:
            if n > lm.info.max_positions:
                continue
            text = prompt_of(lm.tokenizer, n)
            ids = torch.tensor(lm.tokenizer(text)["input_ids"])[None]
            bare_t, capture_t, ours_t = [], [], []
            for rep in range(repeats + 1):  # the first round warms up and is dropped
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = lm.model(input_ids=ids, output_attentions=True)
                t1 = time.perf_counter()
                assert out.attentions[0] is not None
                del out
                with lm.lock:
                    acts = run_with_cache(lm, ids[0])
                t2 = time.perf_counter()
                assert acts[act_name("pattern", 0)].shape[-1] == n
                del acts
                r = client.post("/api/runs", json={"text": text, "top_k": 10})
                t3 = time.perf_counter()
                assert r.status_code == 201, r.text
                if rep:
                    bare_t.append(t1 - t0)
                    capture_t.append(t2 - t1)
                    ours_t.append(t3 - t2)
            run = r.json()
            assert len(run["tokens"]) == n
            visible = n * (n + 1) // 2
            url = f"/api/runs/{run['run_id']}/attention"
            b = client.get(url, params={"layer": 0, "head": 0, "format": "bin"}).content
            j = client.get(url, params={"layer": 0, "head": 0}).content
            bare, capture, ours = (statistics.median(t) for t in (bare_t, capture_t, ours_t))
            row = {"model": name, "n": n, "bare_ms": 1e3 * bare, "capture_ms": 1e3 * capture,
                   "capture_ratio": capture / bare, "ours_ms": 1e3 * ours, "ratio": ours / bare,
                   "bin_bpc": len(b) / visible, "json_bpc": len(j) / visible,
                   "forward_ms": run["timing_ms"]["forward"], "analysis_ms": run["timing_ms"]["analysis"]}
            log.info("%(model)s n=%(n)d bare %(bare_ms).0f ms capture %(capture_ms).0f ms (%(capture_ratio).2f) "
                     "POST %(ours_ms).0f ms (%(ratio).2f)", row)
            rows.append(row)
    return rows


def table(rows: list[dict[str, float]]) -> str:
    lines = ["| model | n | bare forward (ms) | capture alone (ms) | ratio | POST /api/runs (ms) | ratio "
             "| of which forward / analysis (ms) | binary B/cell | JSON B/cell |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines.extend(
        f"| {r['model']} | {r['n']} | {r['bare_ms']:.0f} | {r['capture_ms']:.0f} | **{r['capture_ratio']:.2f}x** "
        f"| {r['ours_ms']:.0f} | {r['ratio']:.2f}x "
        f"| {r['forward_ms']:.0f} / {r['analysis_ms']:.0f} | {r['bin_bpc']:.2f} | {r['json_bpc']:.2f} |"
        for r in rows
    )
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,256,1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", type=Path, default=None, help="replace this section of the given markdown file")
    p.add_argument("--tmp", type=Path, default=Path("/tmp/attnscope-bench"))
    p.add_argument("--tune-malloc", action="store_true",
                   help="first apply the malloc settings `attnscope serve` uses (app/memory.py), as the served app runs")
    args = p.parse_args()
    if args.tune_malloc and not tune_malloc():
        raise SystemExit("--tune-malloc needs glibc")
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = measure("attnscope-tiny", "bundled:attnscope-tiny", lengths, args.repeats)
    rows += measure("gpt2-small-random", str(gpt2_small_folder(args.tmp)), lengths, args.repeats)
    text = table(rows)
    sys.stdout.write(text + "\n")
    if args.write:
        flag = " --tune-malloc" if args.tune_malloc else ""
        write_section(args.write, "capture-tuned" if args.tune_malloc else "capture", text,
                      f"python bench/capture.py{flag} --write BENCHMARKS.md")


if __name__ == "__main__":
    main()
