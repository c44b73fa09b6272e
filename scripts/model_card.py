"""Measure the bundled decoder and write its model card (README.md sections, PNG, JSON).

Everything in the card's measured sections comes from here, through the same engine the
app uses (model.load.models, model.capture.forward, model.scores.analysis, model.scores.probes):

* held-out loss and bits per UTF-8 byte, over all of the held-out split (English and
  Chinese documents apart too), and on everyday English written for this card
  (tests/data/everyday_english.txt, outside the corpus);
* every head's previous-token score on held-out windows as long as the context, with its
  lowest value over any stretch of 128 positions ("at every position");
* every head's induction score on random common words repeated, on natural sentences
  repeated, and the app's own probe (random token ids repeated);
* the tokenization of everyday sentences and Chinese, and greedy continuations of a fixed
  list of prompts.

Usage::

    python scripts/model_card.py --folder model/bundled/attnscope-tiny --corpus data/corpus
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnscope.model.capture.forward import run_with_cache  # noqa: E402
from attnscope.model.capture.names import act_name, kind_of  # noqa: E402
from attnscope.model.load.models import LoadedModel, load_model  # noqa: E402
from attnscope.model.scores.analysis import head_scores, previous_token_weights  # noqa: E402
from attnscope.model.scores.probes import induction_scores  # noqa: E402
from bench.report import write_section  # noqa: E402

log = logging.getLogger("model_card")
EVERYDAY = ROOT / "tests/data/everyday_english.txt"
STRETCH = 128  # positions per stretch in the "at every position" previous-token check
WHOLE_WORDS = ["dog bites man", "man bites dog", "I love artificial intelligence", "The cat sat on the mat",
               "The weather today is nice and warm", "In the morning I drink a cup of coffee and read the news",
               "She opened the window and looked at the garden", "My brother lost his hat at the beach"]
CHINESE = ["我爱人工智能", "今天天气很好，我们去公园散步吧。"]  # noqa: RUF001 - Chinese punctuation on purpose
EVERYDAY_PROMPTS = ["Once upon a time", "The weather today is", "In the morning, I", "The meaning of life is",
                    "My favourite food is"]  # the first three are issue 16's; each must run on in English
PROMPTS = [*EVERYDAY_PROMPTS, "dog bites man", "I love artificial intelligence because",
           "The cat sat on the mat.", "我爱人工智能", "今天天气很好，", "床前明月光，", "在计算机科学中，"]  # noqa: RUF001 - Chinese punctuation
NATURAL_REPEATS = ["The cat sat on the mat. The cat sat on the mat.",
                   "Mary went to the market to buy some bread and milk. Mary went to the market to buy some bread and milk.",
                   "When the rain stopped, the children ran outside to play in the garden. "
                   "When the rain stopped, the children ran outside to play in the garden."]
_CJK = re.compile(r"[\u4e00-\u9fff]")


def is_chinese(text: str) -> bool:
    return len(_CJK.findall(text)) >= 0.3 * max(1, len(text.replace(" ", "")))


def document_bits(lm: LoadedModel, doc: str) -> tuple[float, int, int]:
    """(nats, tokens, bytes) of a document read after <|endoftext|>, in chunks of the context."""
    eos = lm.tokenizer.eos_token_id
    ids = [eos] + lm.tokenizer(doc)["input_ids"]
    n = lm.info.max_positions
    nats, tokens = 0.0, 0
    for start in range(0, len(ids) - 1, n - 1):
        chunk = torch.tensor(ids[start : start + n])  # (<= n,)
        if len(chunk) < 2:
            break
        with torch.inference_mode():
            logits = lm.model(input_ids=chunk[None]).logits[0, :-1].float()  # (t-1, V)
        nats += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
        tokens += len(chunk) - 1
    return nats, tokens, len(doc.encode("utf-8"))


def bits_per_byte(lm: LoadedModel, docs: list[str]) -> dict[str, float]:
    nats = tokens = n_bytes = 0
    for doc in docs:
        a, b, c = document_bits(lm, doc)
        nats, tokens, n_bytes = nats + a, tokens + b, n_bytes + c
    return {"loss": nats / max(1, tokens), "bits_per_byte": nats / math.log(2) / max(1, n_bytes),
            "documents": len(docs), "tokens": tokens, "bytes": n_bytes}


def patterns(lm: LoadedModel, ids: torch.Tensor) -> list[torch.Tensor]:
    acts = run_with_cache(lm, ids, lambda name: kind_of(name) == "pattern")
    return [acts[act_name("pattern", i)] for i in range(lm.info.n_layers)]  # L x (H, n, n)


def heldout_stream(lm: LoadedModel, docs: list[str]) -> torch.Tensor:
    stream: list[int] = []
    for doc in docs:
        stream += lm.tokenizer(doc)["input_ids"] + [lm.tokenizer.eos_token_id]
    return torch.tensor(stream)


def previous_token(lm: LoadedModel, stream: torch.Tensor, windows: int) -> tuple[list[list[float]], list[list[float]]]:
    """(mean score, lowest score over any stretch of STRETCH positions), each (layers x heads)."""
    n = lm.info.max_positions
    step = max(n, (len(stream) - n) // windows)
    starts = list(range(0, len(stream) - n, step))[:windows]
    mean = torch.zeros(lm.info.n_layers, lm.info.n_heads)
    stretches = torch.zeros(lm.info.n_layers, lm.info.n_heads, n // STRETCH)
    for s in starts:
        ids = stream[s : s + n]
        for layer, pattern in enumerate(patterns(lm, ids)):
            mean[layer] += torch.tensor([h.prev_token for h in head_scores(layer, pattern, ids)]) / len(starts)
            prev = previous_token_weights(pattern)  # (H, n-1): query i+1 -> key i
            prev = torch.cat([prev[:, :1], prev], dim=1)  # (H, n): position 0 stands in for itself
            stretches[layer] += prev.reshape(lm.info.n_heads, -1, STRETCH).mean(-1) / len(starts)
    return mean.tolist(), stretches.amin(-1).tolist()


def common_words(lm: LoadedModel, count: int = 1000) -> list[str]:
    """The first ``count`` lower-case words of 3+ letters that are one token after a space."""
    words = []
    for token, _ in sorted(lm.tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        word = token[1:]
        if token.startswith("\u0120") and word.isascii() and word.isalpha() and word.islower() and len(word) > 2:
            words.append(word)
    return words[:count]


def induction_on_texts(lm: LoadedModel, texts: list[str]) -> list[list[float]]:
    """(layers x heads) the engine's induction score (head_scores), averaged over the texts."""
    total = torch.zeros(lm.info.n_layers, lm.info.n_heads)
    for text in texts:
        ids = torch.tensor(lm.tokenizer(text)["input_ids"])
        for layer, pattern in enumerate(patterns(lm, ids)):
            total[layer] += torch.tensor([h.induction or 0.0 for h in head_scores(layer, pattern, ids)]) / len(texts)
    return total.tolist()


def random_word_texts(lm: LoadedModel, length: int = 40, seeds: int = 8) -> list[str]:
    words = common_words(lm)
    texts = []
    for seed in range(seeds):
        run = " ".join(random.Random(seed).choices(words, k=length))
        texts.append(f"{run} {run}")
    return texts


def continuation(lm: LoadedModel, prompt: str, new_tokens: int = 24) -> dict[str, Any]:
    enc = lm.tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = lm.model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                pad_token_id=lm.tokenizer.eos_token_id)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    eos = lm.tokenizer.eos_token_id
    before_eos = new[: new.index(eos)] if eos in new else new
    pieces = [lm.tokenizer.decode([i]) for i in before_eos]
    english = sum(bool(re.fullmatch(r"\s?[A-Za-z]+", p)) for p in pieces)
    chinese = sum(bool(_CJK.fullmatch(p)) for p in pieces)
    return {"prompt": prompt, "continuation": lm.tokenizer.decode(before_eos), "tokens_before_eos": len(before_eos),
            "english_word_tokens": english, "chinese_characters": chinese, "ended": eos in new}


def measure(folder: Path, corpus: Path, windows: int) -> dict[str, Any]:
    lm = load_model("attnscope-tiny", str(folder))
    docs = [d for d in (corpus / "heldout.txt").read_text(encoding="utf-8").split("\n\n") if d.strip()]
    english = [d for d in docs if not is_chinese(d)]
    chinese = [d for d in docs if is_chinese(d)]
    stream = heldout_stream(lm, docs)
    prev_mean, prev_lowest = previous_token(lm, stream, windows)
    tok = lm.tokenizer
    weights = folder / "model.safetensors"
    return {
        "n_params": lm.info.n_params, "weights_bytes": weights.stat().st_size,
        "config": {k: getattr(lm.info, k) for k in
                   ("n_layers", "n_heads", "d_model", "d_head", "d_mlp", "vocab_size", "max_positions")},
        "uniform_loss": math.log(lm.info.vocab_size),
        "heldout": bits_per_byte(lm, docs), "heldout_english": bits_per_byte(lm, english),
        "heldout_chinese": bits_per_byte(lm, chinese),
        "everyday_english": bits_per_byte(lm, [p for p in EVERYDAY.read_text(encoding="utf-8").split("\n\n") if p.strip()]),
        "prev_token": prev_mean, "prev_token_lowest_stretch": prev_lowest, "prev_token_windows": windows,
        "induction_random_words": induction_on_texts(lm, random_word_texts(lm)),
        "induction_natural": induction_on_texts(lm, NATURAL_REPEATS),
        "induction_random_ids": induction_scores(lm, length=50, seeds=8),
        "tokenization": {s: [tok.decode([i]) for i in tok(s)["input_ids"]] for s in WHOLE_WORDS + CHINESE},
        "continuations": [continuation(lm, p) for p in PROMPTS],
    }


def best(grid: list[list[float]], k: int = 1) -> list[tuple[int, int, float]]:
    cells = sorted(((layer, head, v) for layer, row in enumerate(grid) for head, v in enumerate(row)),
                   key=lambda c: -c[2])
    return cells[:k]


def targets(stats: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of issue 16's targets."""
    ind = best(stats["induction_random_words"])[0]
    lowest = sorted((v for row in stats["prev_token_lowest_stretch"] for v in row), reverse=True)
    english_prompts = [c for c in stats["continuations"] if c["prompt"] in EVERYDAY_PROMPTS]
    chinese_prompts = [c for c in stats["continuations"] if is_chinese(c["prompt"])]
    words = [s for s in WHOLE_WORDS if len(stats["tokenization"][s]) == len(s.split())]
    return [
        ("a head with induction score >= 0.4 on random words repeated",
         f"{ind[2]:.2f} (layer {ind[0]} head {ind[1]})", ind[2] >= 0.4),
        ("two heads with previous-token score >= 0.5 at every position",
         f"lowest over any 128-position stretch, best two heads: {lowest[0]:.2f}, {lowest[1]:.2f}",
         lowest[1] >= 0.5),
        ("held-out bits per byte <= 1.6", f"{stats['heldout']['bits_per_byte']:.3f} (English "
         f"{stats['heldout_english']['bits_per_byte']:.3f}, Chinese {stats['heldout_chinese']['bits_per_byte']:.3f}); "
         f"everyday English {stats['everyday_english']['bits_per_byte']:.3f}",
         stats["heldout"]["bits_per_byte"] <= 1.6),
        ("one token per word in everyday sentences", f"{len(words)} of {len(WHOLE_WORDS)} sentences",
         len(words) == len(WHOLE_WORDS)),
        ("`我爱人工智能` in <= 6 tokens", str(len(stats["tokenization"]["我爱人工智能"])),
         len(stats["tokenization"]["我爱人工智能"]) <= 6),
        (">= 8 English tokens before end-of-text on everyday prompts (" + ", ".join(EVERYDAY_PROMPTS) + ")",
         ", ".join(str(c["english_word_tokens"]) for c in english_prompts),
         all(c["english_word_tokens"] >= 8 for c in english_prompts)),
        ("Chinese prompts continue in Chinese", ", ".join(f"{c['chinese_characters']} characters" for c in chinese_prompts),
         all(c["chinese_characters"] >= 4 for c in chinese_prompts)),
        ("<= 20M parameters, <= 40 MB weights, >= 1,024 positions",
         f"{stats['n_params'] / 1e6:.1f}M, {stats['weights_bytes'] / 2**20:.1f} MiB, {stats['config']['max_positions']:,}",
         stats["n_params"] <= 20e6 and stats["weights_bytes"] <= 40 * 2**20 and stats["config"]["max_positions"] >= 1024),
    ]


def grid_table(title: str, grid: list[list[float]], line: float) -> list[str]:
    lines = [f"**{title}**", "", "| layer | " + " | ".join(f"h{h}" for h in range(len(grid[0]))) + " |",
             "|---|" + "---|" * len(grid[0])]
    for layer, row in enumerate(grid):
        lines.append(f"| {layer} | " + " | ".join(f"**{v:.2f}**" if v >= line else f"{v:.2f}" for v in row) + " |")
    return [*lines, ""]


def card_tables(stats: dict[str, Any]) -> str:
    h, e, c, d = stats["heldout"], stats["heldout_english"], stats["heldout_chinese"], stats["everyday_english"]
    lines = [
        f"- parameters: {stats['n_params']:,}; weights {stats['weights_bytes'] / 2**20:.1f} MiB; "
        f"{stats['config']['max_positions']:,} positions; vocabulary {stats['config']['vocab_size']:,}",
        f"- held-out split ({h['documents']} documents, {h['tokens']:,} tokens, {h['bytes']:,} bytes): "
        f"**{h['bits_per_byte']:.3f} bits per byte**, {h['loss']:.3f} nats per token "
        f"(uniform over the vocabulary: {stats['uniform_loss']:.3f})",
        f"- its English documents: {e['bits_per_byte']:.3f} bits per byte ({e['loss']:.3f} nats per token); "
        f"its Chinese documents: {c['bits_per_byte']:.3f} bits per byte ({c['loss']:.3f} nats per token)",
        f"- everyday English written for this card (`tests/data/everyday_english.txt`, {d['bytes']:,} bytes): "
        f"**{d['bits_per_byte']:.3f} bits per byte** ({d['loss']:.3f} nats per token)",
        "", "**Targets (issue 16)**", "", "| target | measured | met |", "|---|---|---|",
    ]
    lines += [f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in targets(stats)]
    lines += ["", "**Tokenization**", ""]
    lines += [f"- `{s}` → " + " ".join(f"`{p}`" for p in pieces) + f" ({len(pieces)})"
              for s, pieces in stats["tokenization"].items()]
    lines += ["", "**Greedy continuations** (24 new tokens at most, cut at `<|endoftext|>`)", "",
              "| prompt | continuation | English word tokens | Chinese characters | ended |", "|---|---|---|---|---|"]
    for cont in stats["continuations"]:
        text = cont["continuation"].replace("\n", " ⏎ ").replace("|", "\\|").strip()
        lines.append(f"| {cont['prompt']} | {text} | {cont['english_word_tokens']} | {cont['chinese_characters']} | "
                     f"{'yes' if cont['ended'] else 'no'} |")
    lines.append("")
    lines += grid_table(f"Previous-token score: mean attention from i to i-1 over {stats['prev_token_windows']} "
                        "held-out windows of the full context", stats["prev_token"], 0.5)
    lines += grid_table("Previous-token score, lowest over any stretch of 128 positions (0-127, 128-255, ...)",
                        stats["prev_token_lowest_stretch"], 0.5)
    lines += grid_table("Induction score: 40 random common words repeated (8 draws; the engine's score)",
                        stats["induction_random_words"], 0.4)
    lines += grid_table("Induction score: natural sentences repeated (" + str(len(NATURAL_REPEATS)) + " texts)",
                        stats["induction_natural"], 0.4)
    lines += grid_table("Induction score: the app's probe (50 random token ids repeated, 8 seeds)",
                        stats["induction_random_ids"], 0.4)
    return "\n".join(lines)


def plot_curve(training: dict[str, Any], path: Path, card_bpb: float | None = None) -> None:
    """Held-out loss and bits per byte over tokens seen; beside it, the head probes over training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = training["curve"]
    tokens = [c["tokens"] / 1e6 for c in curve]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    ax = axes[0]
    ax.plot(tokens, [c["train_loss"] for c in curve], color="tab:blue", alpha=0.35, linewidth=1, label="training batch")
    ax.plot(tokens, [c["heldout_loss"] for c in curve], color="tab:blue", marker=".", label="held-out (nats/token)")
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(tokens, [c["heldout_bpb"] for c in curve], color="tab:orange", marker=".",
              label="held-out bits/byte as logged (8 windows)")
    if card_bpb is not None:  # the card's own figure: every held-out document from its first token
        twin.plot([tokens[-1]], [card_bpb], color="tab:orange", marker="*", markersize=11, linestyle="none",
                  label=f"this card's measure: {card_bpb:.3f}")
    twin.axhline(1.6, color="tab:orange", linestyle=":", linewidth=0.8)
    twin.set_ylabel("bits per byte")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7)
    ax.set_title("loss (dotted: the 1.6 bits/byte target)", fontsize=9)
    ax = axes[1]
    ax.plot(tokens, [c["prev_token_top2"][0] for c in curve], color="tab:green", marker=".", label="previous-token, best head")
    ax.plot(tokens, [c["prev_token_top2"][1] for c in curve], color="tab:green", marker=".", linestyle="--",
            label="previous-token, second head")
    ax.plot(tokens, [c["induction_top"] for c in curve], color="tab:red", marker=".", label="induction (random words), best head")
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_title("head probes during training (held-out windows / repeated random words)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def corpus_table(sources: dict[str, Any]) -> str:
    lines = ["| source | Debian packages | documents | characters | licence (from the package's copyright file) |",
             "|---|---|---|---|---|"]
    for name, s in sources["sources"].items():
        lic = sources["licences"][name]
        lines.append(f"| {name} | {', '.join(f'`{p}`' for p in lic['packages'])} | {s['documents']:,} | "
                     f"{s['characters']:,} | {lic['licence']} |")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--folder", type=Path, default=ROOT / "model/bundled/attnscope-tiny")
    p.add_argument("--corpus", type=Path, default=ROOT / "data/corpus")
    p.add_argument("--windows", type=int, default=16, help="held-out windows of the full context for the previous-token scores")
    p.add_argument("--threads", type=int, default=1, help="torch threads (this machine's second core often trains)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    stats = measure(args.folder, args.corpus, args.windows)
    (args.folder / "measurements.json").write_text(json.dumps(stats, indent=1, ensure_ascii=False))
    training = json.loads((args.folder / "training.json").read_text())
    plot_curve(training, args.folder / "training_curve.png", stats["heldout"]["bits_per_byte"])
    sources_path = args.corpus / "sources.json"
    if sources_path.exists():
        sources = json.loads(sources_path.read_text())
        (args.folder / "corpus.json").write_text(json.dumps(sources, indent=1))
    else:
        sources = json.loads((args.folder / "corpus.json").read_text())
    command = "python scripts/model_card.py"
    write_section(args.folder / "README.md", "corpus", corpus_table(sources), command)
    write_section(args.folder / "README.md", "measured", card_tables(stats), command)
    for target, measured, met in targets(stats):
        log.info("%-4s %s: %s", "ok" if met else "MISS", target, measured)


if __name__ == "__main__":
    main()
