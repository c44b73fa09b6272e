"""Measure the bundled decoder and write its model card (README.md, PNG, JSON).

Everything in the card is measured here, by the same engine the app uses:
held-out loss and perplexity, per-head previous-token scores on held-out text,
induction scores on random token sequences repeated twice, and a greedy
continuation. Usage::

    python scripts/model_card.py --folder model/bundled/attnscope-tiny --heldout data/corpus/heldout.txt
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# run as `python scripts/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from bench.report import write_section  # noqa: E402
from model.analysis import head_scores  # noqa: E402
from model.hooks import run_with_cache  # noqa: E402
from model.loading import load_model  # noqa: E402
from model.probes import induction_scores  # noqa: E402

log = logging.getLogger("model_card")


def heldout_windows(tokenizer: object, path: Path, length: int, count: int) -> list[torch.Tensor]:
    """Windows of held-out text encoded as in training: documents joined by <|endoftext|>."""
    stream: list[int] = []
    for doc in path.read_text(encoding="utf-8").split("\n\n"):
        stream.extend(tokenizer(doc)["input_ids"])
        stream.append(tokenizer.eos_token_id)
    ids = torch.tensor(stream)
    step = max(length, (len(ids) - length) // count)
    return [ids[s : s + length] for s in range(0, len(ids) - length, step)][:count]


def measure(folder: Path, heldout: Path, windows: int) -> dict[str, object]:
    lm = load_model("attnscope-tiny", str(folder))
    length = min(512, lm.info.max_positions)
    chunks = heldout_windows(lm.tokenizer, heldout, length, windows)
    losses, prev = [], torch.zeros(lm.info.n_layers, lm.info.n_heads)
    for ids in chunks:
        with torch.inference_mode():
            losses.append(lm.model(input_ids=ids[None], labels=ids[None]).loss.item())
        acts = run_with_cache(lm, ids, lambda name: name.endswith("hook_pattern"))
        for layer in range(lm.info.n_layers):
            for s in head_scores(layer, acts[f"blocks.{layer}.attn.hook_pattern"], ids):
                prev[layer, s.head] += s.prev_token / len(chunks)
    induction = induction_scores(lm, length=50, seeds=8)
    prompt = "The meaning of life is"
    enc = lm.tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = lm.model.generate(**enc, max_new_tokens=20, do_sample=False, pad_token_id=lm.tokenizer.eos_token_id)
    loss = sum(losses) / len(losses)
    return {
        "n_params": lm.info.n_params, "config": {k: getattr(lm.info, k) for k in
                                                  ("n_layers", "n_heads", "d_model", "d_head", "d_mlp", "vocab_size", "max_positions")},
        "heldout_loss": loss, "heldout_ppl": math.exp(loss), "uniform_loss": math.log(lm.info.vocab_size),
        "heldout_windows": len(chunks), "window_tokens": length,
        "prev_token": prev.tolist(), "induction": induction,
        "greedy": {"prompt": prompt, "continuation": lm.tokenizer.decode(out[0, enc["input_ids"].shape[1]:])},
    }


def plot_curve(training: dict, path: Path) -> None:
    """Loss over tokens seen; beside it, the best two heads' previous-token scores where they were probed.

    One colour per training phase in both panels; each phase's held-out loss and probe read windows
    as long as that phase's own (``--seq`` and ``--probe-seq``), named in the legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chain = []  # oldest phase first: each resumed run keeps the record of the one before
    record: dict | None = training
    while record:
        chain.insert(0, record)
        record = record.get("previous")
    probed = any("prev_token_top2" in c for r in chain for c in r["curve"])
    fig, axes = plt.subplots(1, 2 if probed else 1, figsize=(11 if probed else 6, 4), dpi=120, squeeze=False)
    loss_ax = axes[0][0]
    colours = plt.get_cmap("tab10")
    offset = 0
    for number, record in enumerate(chain, 1):
        curve, args, colour = record["curve"], record["args"], colours((number - 1) % 10)
        name = f"phase {number}" if len(chain) > 1 else "training"
        tokens = [(c["tokens"] + offset) / 1e6 for c in curve]
        loss_ax.plot(tokens, [c["train_loss"] for c in curve], color=colour, alpha=0.35, linewidth=1)
        loss_ax.plot(tokens, [c["heldout_loss"] for c in curve], color=colour, marker=".",
                     label=f"{name} (held-out, {args['seq']}-token windows)")
        points = [((c["tokens"] + offset) / 1e6, c["prev_token_top2"]) for c in curve if "prev_token_top2" in c]
        if points:
            ax = axes[0][1]
            ax.plot([t for t, _ in points], [v[0] for _, v in points], color=colour, marker=".",
                    label=f"{name} ({args.get('probe_seq', '256')}-token windows)")  # runs before --probe-seq read 256
            ax.plot([t for t, _ in points], [v[1] for _, v in points], color=colour, marker=".", linestyle="--")
        offset += curve[-1]["tokens"]
    loss_ax.set_title("loss (faint: training batch; dots: held-out)", fontsize=9)
    loss_ax.set_xlabel("tokens seen (millions)")
    loss_ax.set_ylabel("cross-entropy (nats)")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=7)
    if probed:
        ax = axes[0][1]
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
        ax.set_title("previous-token score on held-out text (solid: best head; dashed: second)", fontsize=9)
        ax.set_xlabel("tokens seen (millions)")
        ax.set_ylabel("mean attention from i to i-1")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", type=Path, default=ROOT / "model/bundled/attnscope-tiny")
    p.add_argument("--heldout", type=Path, default=ROOT / "data/corpus/heldout.txt")
    p.add_argument("--windows", type=int, default=40)
    args = p.parse_args()
    stats = measure(args.folder, args.heldout, args.windows)
    (args.folder / "measurements.json").write_text(json.dumps(stats, indent=1))
    training = json.loads((args.folder / "training.json").read_text())
    plot_curve(training, args.folder / "training_curve.png")
    write_section(args.folder / "README.md", "measured", card_tables(stats),
                  "python scripts/model_card.py")
    log.info(json.dumps({k: v for k, v in stats.items() if k not in ("prev_token", "induction")}, indent=1))


def card_tables(stats: dict) -> str:
    lines = [
        f"- parameters: {stats['n_params']:,}",
        f"- held-out loss: **{stats['heldout_loss']:.3f} nats** (perplexity {stats['heldout_ppl']:.1f}; "
        f"uniform over the vocabulary would be ln V = {stats['uniform_loss']:.3f}), "
        f"{stats['heldout_windows']} windows of {stats['window_tokens']} tokens",
        f"- greedy continuation of \"{stats['greedy']['prompt']}\": \"{stats['greedy']['continuation'].strip()}\"",
        "",
    ]
    for key, title in (("prev_token", "Previous-token score (mean attention from i to i-1 on held-out text)"),
                       ("induction", "Induction score (random tokens repeated twice; attention to the token after the earlier copy)")):
        grid = stats[key]
        lines += [f"**{title}**", "", "| layer | " + " | ".join(f"h{h}" for h in range(len(grid[0]))) + " |",
                  "|---|" + "---|" * len(grid[0])]
        for layer, row in enumerate(grid):
            lines.append(f"| {layer} | " + " | ".join(f"**{v:.2f}**" if v >= 0.5 else f"{v:.2f}" for v in row) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
