"""Recording generation vs plain KV-cache generation, per token, in one run.

At a 256-token prompt on the bundled model: G new tokens greedily, plain and with
``record=True`` (every step's activations kept, then assembled into a run), alternated
R times. Reports the median per-token time of each and their ratio (prefill included in
neither: it is timed apart).

    python bench/record.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from attnscope.model.capture.generation import GenerationSession, SamplingParams  # noqa: E402
from attnscope.model.load.models import load_model  # noqa: E402
from attnscope.model.load.tokens import ids_tensor, tokenize  # noqa: E402
from bench.capture import prompt_of  # noqa: E402
from bench.report import write_section  # noqa: E402

log = logging.getLogger("bench.record")


def per_token_ms(lm: object, ids: object, new: int, record: bool) -> tuple[float, float]:
    params = SamplingParams(max_new_tokens=new, temperature=0, top_k=0, top_p=1, seed=0)
    session = GenerationSession(lm, ids, params, record=record)
    t0 = time.perf_counter()
    session.step()  # the prefill and the first token
    t1 = time.perf_counter()
    while not session.done:
        session.step()
    if record:
        session.finish_recording()
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * (t2 - t1) / max(1, session.steps - 1)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", type=Path, default=None)
    args = p.parse_args()
    lm = load_model("attnscope-tiny", "bundled:attnscope-tiny")
    lm.tokenizer.eos_token_id = None  # so that every run makes exactly --new tokens
    ids = ids_tensor(tokenize(lm.tokenizer, prompt_of(lm.tokenizer, args.prompt)))
    plain, rec, pre_plain, pre_rec = [], [], [], []
    per_token_ms(lm, ids, 4, False)  # warm-up
    for _ in range(args.repeats):
        a, b = per_token_ms(lm, ids, args.new, False)
        c, d = per_token_ms(lm, ids, args.new, True)
        pre_plain.append(a)
        plain.append(b)
        pre_rec.append(c)
        rec.append(d)
    mp, mr = statistics.median(plain), statistics.median(rec)
    text = "\n".join([
        f"attnscope-tiny, {len(ids)}-token prompt, {args.new} new tokens (greedy), median of {args.repeats} alternated runs.", "",
        "| | prefill (ms) | per new token (ms) |", "|---|---|---|",
        f"| plain KV-cache generation | {statistics.median(pre_plain):.1f} | {mp:.2f} |",
        f"| recording every step (assembly into a run included) | {statistics.median(pre_rec):.1f} | {mr:.2f} |",
        f"| **ratio** | | **{mr / mp:.2f}x** (target ≤ 1.3x) |",
    ])
    sys.stdout.write(text + "\n")
    if args.write:
        write_section(args.write, "record", text, "python bench/record.py --write BENCHMARKS.md")


if __name__ == "__main__":
    main()
