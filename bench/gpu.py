"""Issue 39's GPU table, made in one short call on a lent GPU machine (random weights, no download).

    python bench/gpu.py --write BENCHMARKS.md            # on the GPU machine: the table below, ~5 min on an H100
    python bench/gpu.py --smoke                          # anywhere: the same steps on tiny shapes, on the CPU

Rows: a Llama-3.2-1B-shaped model (16 layers, d_model 2,048, 32 heads, 8 K/V heads) in bfloat16 at 1k, 8k and
32k tokens, and a Llama-2-7B-shaped one (32 layers, d_model 4,096, 32 heads) in bfloat16 at 8k. Per row, each
step alternated with the others (``--repeats``, medians, a first round dropped), every GPU step ended with
``torch.cuda.synchronize``:

* SDPA forward: a plain forward of the same model with ``attn_implementation="sdpa"`` and every position's
  logits (the analyse reads the next-token top-k at every position), the physical limit;
* capture: the analyse's forward through attnscope's capture point (``timing_ms["forward"]``);
* analyse → response: ``engine.analyse`` until it returns; analyse + exact scores: until every head's exact
  entropy, max, previous-token, first-token and induction score is in (``wait_scores``);
* the path the attention took (the capture's log line: the fused kernel on how many layers);
* kept: the run's bytes (``RunRecord.nbytes``), and the peak GPU memory of the whole analyse
  (``torch.cuda.max_memory_allocated``, reset before it) beside the weights' own bytes.

The card's name, torch's and transformers' versions head the table. Nothing here is asserted by the tests
(tests/test_gpu_bench.py runs ``--smoke`` on the CPU so that the script is known to run).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from attnscope.model.load.models import LoadedModel, wrap_model  # noqa: E402
from attnscope.model.runs.budget import estimate  # noqa: E402
from attnscope.model.runs.record import RunStore  # noqa: E402
from attnscope.model.services.engine import Engine  # noqa: E402
from bench.report import publish  # noqa: E402
from tests.support.tinytok import tiny_tokenizer  # noqa: E402

log = logging.getLogger("bench.gpu")
MIB = 1 << 20


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    lengths: tuple[int, ...]


SHAPES = [
    Shape("llama-1b-shape", 16, 2048, 32, 8, 8192, 128256, (1024, 8192, 32768)),
    Shape("llama-7b-shape", 32, 4096, 32, 32, 11008, 32000, (8192,)),
]
SMOKE = [Shape("smoke-llama", 2, 64, 4, 2, 128, 256, (64, 300))]


def build(shape: Shape, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A Llama of ``shape`` with random weights, built on ``device`` in ``dtype`` (no float32 copy first)."""
    positions = max(shape.lengths)
    config = LlamaConfig(num_hidden_layers=shape.layers, hidden_size=shape.width, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, intermediate_size=shape.ffn, vocab_size=shape.vocab,
                         max_position_embeddings=positions, rope_theta=500000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    return wrap_model(shape.name, model, tiny_tokenizer(), source=f"config:{shape.name}")


def text_of(n: int) -> str:
    """n tokens of the tiny tokenizer (one per character)."""
    gen = torch.Generator().manual_seed(n)
    alphabet = "abcdefghij klmnopqrstuvwxyz,."
    return "".join(alphabet[i] for i in torch.randint(len(alphabet), (n,), generator=gen).tolist())


def synced(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


class PathLog(logging.Handler):
    """Keeps the capture's one line per model about the path its attention took."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "attention through the" in message:
            self.said.append(message.split(": ", 1)[1])


def rows_of(shape: Shape, device: torch.device, dtype: torch.dtype, repeats: int) -> list[dict[str, str]]:
    lm = build(shape, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    sync = synced(device)
    paths = PathLog()
    capture_log = logging.getLogger("attnscope.model.capture.forward")
    level = capture_log.level
    capture_log.setLevel(logging.INFO)  # its path line is INFO, whatever the caller's logging
    capture_log.addHandler(paths)
    out = []
    try:
        for n in shape.lengths:
            text = text_of(n)
            ids = torch.tensor(lm.tokenizer(text)["input_ids"], device=device)
            assert ids.shape[0] == n, (ids.shape, n)
            # a store that holds one run: each analyse's run pushes out the one before (after its forward)
            store = RunStore(int(1.25 * estimate(lm, n, 10).keep) + (64 << 20))
            engine = Engine({shape.name: lm}, shape.name, store, n, forward_bytes=1 << 40)

            def sdpa(ids: torch.Tensor = ids) -> float:
                lm.model.set_attn_implementation("sdpa")
                try:
                    sync()
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        lm.model(input_ids=ids[None], use_cache=False)
                    sync()
                    return time.perf_counter() - t0
                finally:
                    lm.model.set_attn_implementation(lm.spec.attn_implementation)

            times: dict[str, list[float]] = {"sdpa": [], "capture": [], "analyse": [], "scores": []}
            kept, peak = 0, 0
            try:
                for rep in range(repeats + 1):  # the first round warms up (kernels, allocator) and is dropped
                    forward = sdpa()
                    if device.type == "cuda" and rep == 0:  # the first analyse: no earlier run is kept beside it
                        torch.cuda.reset_peak_memory_stats(device)
                    sync()
                    t0 = time.perf_counter()
                    result = engine.analyse(text, shape.name, 10)
                    sync()
                    answered = time.perf_counter() - t0
                    record = engine.wait_scores(result.run_id, None)
                    sync()
                    done = time.perf_counter() - t0
                    if record.summary.scores_pending:
                        raise RuntimeError(f"{shape.name} n={n}: scores still pending {record.summary.scores_pending}")
                    if device.type == "cuda" and rep == 0:
                        peak = torch.cuda.max_memory_allocated(device)
                    kept = record.nbytes
                    capture = record.summary.timing_ms["forward"] / 1e3
                    del result, record
                    if rep:
                        for key, value in (("sdpa", forward), ("capture", capture), ("analyse", answered),
                                           ("scores", done)):
                            times[key].append(value)
            finally:
                engine.close()
            med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            base = med["sdpa"]
            log.info("%s n=%d: %s", shape.name, n, ", ".join(f"{k} {v:,.0f} ms" for k, v in med.items()))
            out.append({
                "model": f"{shape.name} ({dtype_name(dtype)})", "n": f"{n:,}", "SDPA forward": f"{base:,.0f} ms",
                "capture / SDPA": f"{med['capture'] / base:.2f}x",
                "analyse → response / SDPA": f"{med['analyse'] / base:.2f}x",
                "analyse + exact scores / SDPA": f"**{med['scores'] / base:.2f}x**",
                "attention path": paths.said[-1] if paths.said else "—",
                "kept": f"{kept / MIB:,.0f} MiB",
                "peak GPU memory (weights)": "—" if device.type != "cuda" else
                f"{peak / MIB:,.0f} MiB ({weights / MIB:,.0f} MiB)",
            })
    finally:
        capture_log.removeHandler(paths)
        capture_log.setLevel(level)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def table(rows: list[dict[str, str]]) -> str:
    columns = list(rows[0])
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                     + ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows])


def main(argv: list[str] | None = None) -> list[dict[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: the script runs, no numbers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--write", type=Path, default=None, help="the BENCHMARKS.md to write the table into")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.smoke:
        device, dtype, shapes = torch.device("cpu"), torch.bfloat16, SMOKE
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench/gpu.py: no CUDA GPU here (--smoke runs its steps on tiny shapes on the CPU)")
        device, dtype, shapes = torch.device("cuda"), torch.bfloat16, SHAPES
    wanted = {s for s in args.only.split(",") if s}
    rows = []
    for shape in shapes:
        if not wanted or shape.name in wanted:
            rows += rows_of(shape, device, dtype, args.repeats)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke)"
    import transformers

    body = (f"Card: **{card}**; torch {torch.__version__}, transformers {transformers.__version__}; random weights "
            f"in {dtype_name(dtype)}; ratios to the SDPA forward of the same model and prompt, medians of "
            f"{args.repeats} alternated rounds.\n\n{table(rows)}")
    publish([body], None if args.smoke else args.write, "gpu", "python bench/gpu.py --write BENCHMARKS.md")
    return rows


if __name__ == "__main__":
    main()
