"""Capture overhead: the hooked forward and POST /api/runs vs a bare eager forward, one run.

For each model and prompt length n, alternates R times between
  bare:     model(input_ids, output_attentions=True) under inference_mode (eager attention)
  capture:  model.capture.forward.run_with_cache: the same forward with every hook (all patterns, the
            residual stream, attention and MLP outputs, logits) kept
  POST:     the full HTTP request POST /api/runs through the ASGI app (tokenize, hooked
            forward, head scores, predictions at every position, JSON response; on the fused
            path the head scores follow the response in the background and are not in it)
and reports medians and their ratios to bare, plus the bytes per visible cell of one
head's binary and JSON attention responses.

    python bench/capture.py --write BENCHMARKS.md

``--qwen`` measures a random model of Qwen2.5-0.5B's shape instead (hidden 896, 24 layers,
14 query heads, 2 K/V heads, MLP 4,864, vocabulary 151,936) on this machine's device, in
float32 and bfloat16, against a bare forward of the same weights with transformers' SDPA
attention (what the model runs without attnscope) and with its eager attention
(``output_attentions=True``):

    python bench/capture.py --qwen --lengths 256,1024 --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from attnscope.app.main import create_app  # noqa: E402
from attnscope.app.memory import tune_malloc  # noqa: E402
from attnscope.app.settings import Settings  # noqa: E402
from attnscope.model.capture.forward import run_with_cache  # noqa: E402
from attnscope.model.capture.names import act_name  # noqa: E402
from attnscope.model.load.models import BUNDLED_DIR, load_model, resolve_device, wrap_model  # noqa: E402
from attnscope.model.runs.record import RunStore  # noqa: E402
from attnscope.model.services.engine import Engine  # noqa: E402
from bench.report import markdown, write_section  # noqa: E402

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
    client = TestClient(create_app(Settings(models={}, default_model=name, max_body_bytes=1 << 24), engine),
                        base_url="http://localhost")  # a Host the app answers to
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
                # the fused path's head scores follow the response in the background: let them finish outside the timings
                client.get(f"/api/runs/{r.json()['run_id']}/heads", params={"wait": 60})
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
    header = ["model", "n", "bare forward (ms)", "capture alone (ms)", "ratio", "POST /api/runs (ms)", "ratio",
              "of which forward / analysis (ms)", "binary B/cell", "JSON B/cell"]
    return markdown(header, [[str(r["model"]), str(r["n"]), f"{r['bare_ms']:.0f}", f"{r['capture_ms']:.0f}",
                              f"**{r['capture_ratio']:.2f}x**", f"{r['ours_ms']:.0f}", f"{r['ratio']:.2f}x",
                              f"{r['forward_ms']:.0f} / {r['analysis_ms']:.0f}", f"{r['bin_bpc']:.2f}",
                              f"{r['json_bpc']:.2f}"] for r in rows])


QWEN_SHAPE = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
              "tie_word_embeddings": True}


def _timed(fn: object, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _bare(model: Qwen2ForCausalLM, ids: torch.Tensor, impl: str) -> None:
    """One forward of the same weights with transformers' own attention (sdpa, or eager with weights)."""
    model.set_attn_implementation(impl)
    try:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False, output_attentions=impl == "eager")
    finally:
        model.set_attn_implementation("attnscope")


def _captured(lm: object, ids: torch.Tensor) -> None:
    with lm.lock:  # type: ignore[attr-defined]
        acts = run_with_cache(lm, ids)  # type: ignore[arg-type]
    assert acts["blocks.0.attn.hook_pattern"].shape[-1] == ids.shape[0]


def measure_qwen(lengths: list[int], repeats: int, dtypes: list[str]) -> list[dict[str, object]]:
    """Capture alone (run_with_cache) against bare SDPA and eager forwards of one Qwen2.5-0.5B-shaped model."""
    device = resolve_device("auto")
    rows: list[dict[str, object]] = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN_SHAPE)).to(device=device, dtype=dtype).eval()
        lm = wrap_model("qwen2.5-0.5b-shape", model, AutoTokenizer.from_pretrained(BUNDLED), "random")
        for n in lengths:
            ids = torch.randint(100, 8000, (n,), generator=torch.Generator().manual_seed(n))
            on_device = ids[None].to(device)

            times: dict[str, list[float]] = {"sdpa": [], "eager": [], "capture": []}
            for rep in range(repeats + 1):  # the first round warms up and is dropped
                for key, fn in (("sdpa", partial(_bare, model, on_device, "sdpa")),
                                ("eager", partial(_bare, model, on_device, "eager")),
                                ("capture", partial(_captured, lm, ids))):
                    t = _timed(fn, device)
                    if rep:
                        times[key].append(t)
            sdpa, eager, cap = (statistics.median(times[k]) for k in ("sdpa", "eager", "capture"))
            row = {"device": str(device), "dtype": dtype_name, "n": n, "sdpa_ms": 1e3 * sdpa, "eager_ms": 1e3 * eager,
                   "capture_ms": 1e3 * cap, "vs_sdpa": cap / sdpa, "vs_eager": cap / eager}
            log.info("qwen shape %(device)s %(dtype)s n=%(n)d sdpa %(sdpa_ms).0f ms eager %(eager_ms).0f ms "
                     "capture %(capture_ms).0f ms (%(vs_sdpa).2fx sdpa, %(vs_eager).2fx eager)", row)
            rows.append(row)
    return rows


def qwen_table(rows: list[dict[str, object]]) -> str:
    header = ["device", "dtype", "n", "bare forward, SDPA (ms)", "bare forward, eager + output_attentions (ms)",
              "capture alone (ms)", "vs SDPA", "vs eager"]
    return markdown(header, [[str(r["device"]), str(r["dtype"]), str(r["n"]), f"{r['sdpa_ms']:.0f}",
                              f"{r['eager_ms']:.0f}", f"{r['capture_ms']:.0f}", f"**{r['vs_sdpa']:.2f}x**",
                              f"{r['vs_eager']:.2f}x"] for r in rows])


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,256,1024")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", type=Path, default=None, help="replace this section of the given markdown file")
    p.add_argument("--tmp", type=Path, default=Path("/tmp/attnscope-bench"))
    p.add_argument("--tune-malloc", action="store_true",
                   help="first apply the malloc settings `attnscope serve` uses (app/memory.py), as the served app runs")
    p.add_argument("--qwen", action="store_true", help="the Qwen2.5-0.5B-shaped rows instead (see the docstring)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="with --qwen")
    args = p.parse_args()
    if args.qwen:
        lengths = [int(x) for x in args.lengths.split(",")]
        text = qwen_table(measure_qwen(lengths, args.repeats, args.dtypes.split(",")))
        sys.stdout.write(text + "\n")
        if args.write:
            device = resolve_device("auto").type
            write_section(args.write, f"capture-qwen-{device}", text,
                          f"python bench/capture.py --qwen --lengths {args.lengths} --repeats {args.repeats} "
                          "--write BENCHMARKS.md")
        return
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
