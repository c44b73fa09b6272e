"""Batched interventions vs the same interventions one forward at a time.

For each model and prompt length n:
  scan:   ablate every head and every MLP alone (zero) and read ln p(next token) at the last
          position but one: ``model.tools.ablation.scan`` (many ablations per batched forward, the
          clean prompt riding along) against one batch-1 forward per ablation with the same hooks;
  patch:  activation patching of every site (resid stages, attention and MLP outputs by
          position, every head) for two prompts that differ at one token, ``--diff-from-end``
          tokens before the end: ``model.tools.patching.patch`` against one batch-1 forward per patch with the same hooks.
The one-at-a-time loops time ``--sample`` interventions evenly spread over all of them and
scale to the full count (each is a forward over the same prefix: their cost is the same);
the batched side runs in full. Both sides are checked to give the same numbers. Torch runs
``--threads`` intra-op threads (default 1: on a shared, loaded machine two threads spend
most of a small forward waiting for each other, which would flatter batching).

    python bench/interventions.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnscope.model.capture.hooks import temporary_hooks  # noqa: E402
from attnscope.model.load.models import LoadedModel, load_model  # noqa: E402
from attnscope.model.runs.record import RunStore  # noqa: E402
from attnscope.model.services.engine import Engine  # noqa: E402
from attnscope.model.tools import ablation, patching  # noqa: E402
from attnscope.model.tools.intervene import logits  # noqa: E402
from bench.capture import gpt2_small_folder, prompt_of  # noqa: E402
from bench.report import write_section  # noqa: E402

log = logging.getLogger("bench.interventions")


def _spread(count: int, sample: int) -> list[int]:
    return sorted({round(i * (count - 1) / max(1, sample - 1)) for i in range(min(sample, count))})


def bench_scan(lm: LoadedModel, engine: Engine, text: str, sample: int) -> dict[str, float]:
    cache = engine.analyse(text, lm.info.name).record
    position = cache.n - 2
    token = int(cache.input_ids[position + 1])
    t0 = time.perf_counter()
    result = ablation.scan(lm, cache, position, token, "zero")
    batched = time.perf_counter() - t0
    jobs = ablation.scan_jobs(lm)
    prefix = cache.input_ids[: position + 1][None]  # (1, P+1)
    flat = torch.cat([result.effects.flatten(), result.mlp]).tolist()  # in scan_jobs order
    picked = _spread(len(jobs), sample)
    with lm.lock:
        base = float(logits(lm, prefix, keep=1)[0, -1].log_softmax(-1)[token])
        t0 = time.perf_counter()
        for i in picked:
            with temporary_hooks(ablation.scan_hooks(lm, [jobs[i]], None, first_row=0)):
                got = float(logits(lm, prefix, keep=1)[0, -1].log_softmax(-1)[token]) - base
            assert abs(got - flat[i]) < 1e-3, (jobs[i], got, flat[i])
        single = (time.perf_counter() - t0) / len(picked) * len(jobs)
    return {"what": "head + MLP scan", "count": len(jobs), "forwards": result.forwards,
            "batched_s": batched, "single_s": single, "sampled": len(picked)}


def bench_patch(lm: LoadedModel, text: str, sample: int, from_end: int) -> dict[str, float]:
    clean = torch.tensor(lm.tokenizer(text)["input_ids"])  # (n,)
    n = clean.shape[0]
    corrupted = clean.clone()
    corrupted[n - from_end] = (int(clean[n - from_end]) + 1) % lm.info.vocab_size
    answer, wrong = int(clean[-1]), (int(clean[-1]) + 7) % lm.info.vocab_size
    t0 = time.perf_counter()
    result = patching.patch(lm, clean, corrupted, answer, wrong, max_flops=float("inf"))
    batched = time.perf_counter() - t0
    n_layers, first = lm.info.n_layers, result.first_difference
    jobs: list[patching.Job] = [("resid", s, p) for s in range(n_layers + 1) for p in range(first, n)]
    jobs += [(site, layer, p) for site in ("attn_out", "mlp_out") for layer in range(n_layers) for p in range(first, n)]
    jobs += [("heads", layer, h) for layer in range(n_layers) for h in range(lm.info.n_heads)]
    grids = {"resid": result.resid, "attn_out": result.attn_out, "mlp_out": result.mlp_out, "heads": result.heads}
    picked = _spread(len(jobs), sample)
    span = result.clean.metric - result.corrupted.metric
    with lm.lock:
        clean_run = patching.capture_clean(lm, clean, answer, wrong)
        t0 = time.perf_counter()
        for i in picked:
            with temporary_hooks(patching.patch_hooks(lm, clean_run, [jobs[i]], first_row=0)):
                out = logits(lm, corrupted[None], keep=1)[:, -1]  # (1, V)
            got = (float(patching.metric_of(out, answer, wrong)[0]) - result.corrupted.metric) / span
            site, row, col = jobs[i]
            assert abs(got - float(grids[site][row, col])) < 1e-2, (jobs[i], got, float(grids[site][row, col]))
        single = (time.perf_counter() - t0) / len(picked) * len(jobs)
    return {"what": "full patching", "count": len(jobs), "forwards": result.forwards,
            "batched_s": batched, "single_s": single, "sampled": len(picked)}


def measure(name: str, source: str, lengths: list[int], sample: int, from_end: int) -> list[dict[str, object]]:
    lm = load_model(name, source)
    engine = Engine({name: lm}, name, RunStore(4 << 30), 1024)
    rows: list[dict[str, object]] = []
    for n in lengths:
        text = prompt_of(lm.tokenizer, n)
        logits(lm, torch.tensor(lm.tokenizer(text)["input_ids"])[None], keep=1)  # warm-up
        for row in (bench_scan(lm, engine, text, sample), bench_patch(lm, text, sample, from_end)):
            row = {"model": name, "n": n, **row}
            log.info("%(model)s n=%(n)d %(what)s: %(count)d interventions, batched %(batched_s).2f s "
                     "(%(forwards)d forwards), one at a time %(single_s).2f s", row)
            rows.append(row)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| model | n | interventions | count | batched forwards | batched (s) | one forward each (s) | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        batched, single = float(r["batched_s"]), float(r["single_s"])  # type: ignore[arg-type]
        lines.append(f"| {r['model']} | {r['n']} | {r['what']} | {r['count']} | {r['forwards']} | {batched:.2f} "
                     f"| {single:.2f} | **{single / batched:.1f}x** |")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="64,256")
    p.add_argument("--sample", type=int, default=12, help="one-at-a-time interventions timed per row")
    p.add_argument("--write", type=Path, default=None, help="replace this section of the given markdown file")
    p.add_argument("--tmp", type=Path, default=Path("/tmp/attnscope-bench"))
    p.add_argument("--models", default="attnscope-tiny,gpt2-small-random")
    p.add_argument("--diff-from-end", type=int, default=4, help="where the patching prompts differ")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    sources = {"attnscope-tiny": "bundled:attnscope-tiny", "gpt2-small-random": None}
    for name in args.models.split(","):
        source = sources[name] or str(gpt2_small_folder(args.tmp))
        text = table(measure(name, source, lengths, args.sample, args.diff_from_end))
        sys.stdout.write(text + "\n")
        if args.write:  # one section a model, written as soon as it is measured
            command = (f"python bench/interventions.py --models {name} --lengths {args.lengths} --sample {args.sample} "
                       f"--diff-from-end {args.diff_from_end} --threads {args.threads} --write BENCHMARKS.md")
            write_section(args.write, f"interventions-{name}", text, command)


if __name__ == "__main__":
    main()
