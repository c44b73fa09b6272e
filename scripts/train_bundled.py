"""Train the bundled decoder: a byte-level BPE tokenizer and a small Llama-shaped model, on CPU.

A plain PyTorch loop in the spirit of nanoGPT's train.py: AdamW, linear warm-up then
cosine decay, gradient clipping, a fixed seed, a held-out split, a progress bar, and a
checkpoint (weights, optimiser, generator and curve) that ``--resume`` continues from.
The only objective is the language-model loss: nothing in the recipe looks at attention.

The tokenizer: byte-level BPE (``tokenizers``) whose pre-tokenizer isolates every CJK
character, so a Chinese token is never more than one character; its training text is the
corpus plus the most frequent English words (in the forms ``word``, `` word``, ``Word``,
`` Word``) and the most frequent Chinese characters of the corpus, each given enough
weight that it becomes a single token.

The data mix (see ``get_batch``): windows of the corpus, of which a share

* repeat a segment of themselves later on (copying natural text),
* carry a run of random common words repeated two or more times (the probe's task),
* are a run of random token ids repeated until the row is full (the app's probe).

A model can only lower its loss on the repeats by looking back for the earlier copy,
which is what induction heads (and the previous-token heads feeding them) do; they are
left to emerge from the loss.

Training reads windows of ``--seq`` tokens and, from ``--long-from`` of the steps on,
windows of ``--long-seq`` (with the batch shrunk to keep the tokens per step), so every
position up to the model's context is trained.

Usage (after scripts/build_corpus.py)::

    nohup python scripts/train_bundled.py --corpus data/corpus --out data/run \
        --threads 1 > train.log 2>&1 &
    python scripts/train_bundled.py ... --resume data/run   # continue after an interruption
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from attnscope.model.scores.analysis import previous_token_weights

log = logging.getLogger("train_bundled")
EOS = "<|endoftext|>"
CJK = "\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
_WORD = re.compile(r"[A-Za-z]+")
STATE = "state.pt"  # optimiser, generator, step and curve: beside the weights, never committed


def common_words(text: str, count: int) -> list[str]:
    """The ``count`` most frequent lower-case words (2+ letters, and "a", "I") of the text."""
    words = Counter(w.lower() for w in _WORD.findall(text))
    ranked = [w for w, _ in words.most_common() if len(w) > 1 or w in ("a", "i")]
    return ranked[:count]


def common_chars(text: str, count: int, least: int = 2) -> list[str]:
    """The ``count`` most frequent CJK characters of the text that occur at least ``least`` times."""
    chars = Counter(_CJK_CHAR.findall(text))
    return [c for c, n in chars.most_common(count) if n >= least]


def word_forms(word: str, capitals: bool) -> list[str]:
    """The forms a word takes in running text: after a space, alone, and (``capitals``) capitalised."""
    word = "I" if word == "i" else word
    forms = [" " + word, word] + ([" " + word.capitalize(), word.capitalize()] if capitals else [])
    return list(dict.fromkeys(forms))


def supplement(text: str, everyday: list[str], words: int, chars: int) -> list[str]:
    """Strings the tokenizer must keep whole: the corpus's ``words`` most frequent words (capitalised
    too), the everyday words (after a space; the first 1,500 alone too) and ``chars`` CJK characters."""
    forms = [f for w in common_words(text, words) for f in word_forms(w, capitals=True)]
    forms += [f for rank, w in enumerate(everyday) for f in word_forms(w, False)[: 2 if rank < 1500 else 1]]
    return list(dict.fromkeys(forms)) + common_chars(text, chars)


def tokenizer_text(corpus: Path, words: int, chars: int, weight: int) -> Iterator[str]:
    """The tokenizer's training text: the corpus, then ``supplement`` ``weight`` times."""
    text = (corpus / "train.txt").read_text(encoding="utf-8")
    yield from text.split("\n\n")
    everyday = corpus / "everyday_words.txt"  # written by build_corpus.py: SemCor's most frequent lemmas
    listed = everyday.read_text(encoding="utf-8").split() if everyday.exists() else []
    chosen = "\n".join(supplement(text, listed, words, chars))
    for _ in range(weight):
        yield chosen


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(f"[{CJK}]"), behavior="isolated"),  # one CJK character per piece
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_tokenizer(corpus: Path, vocab_size: int, words: int = 1500, chars: int = 3000,
                    weight: int = 300) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_text(corpus, words, chars, weight), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, model_max_length=1024
    )


def encode_docs(tokenizer: PreTrainedTokenizerFast, path: Path) -> torch.Tensor:
    """The whole file as one stream of ids, documents separated by EOS."""
    docs = path.read_text(encoding="utf-8").split("\n\n")
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for start in range(0, len(docs), 4096):
        for enc in tokenizer(docs[start : start + 4096])["input_ids"]:
            ids.extend(enc)
            ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def word_ids(tokenizer: PreTrainedTokenizerFast, count: int = 2000) -> torch.Tensor:
    """Ids of single tokens that are a space and a lower-case word of 3+ letters, the most frequent first."""
    ids = []
    for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if token.startswith("\u0120") and token[1:].isascii() and token[1:].isalpha() and token[1:].islower() \
                and len(token) > 3:
            ids.append(idx)
    return torch.tensor(ids[:count], dtype=torch.long)


def repeated_words(words: torch.Tensor, length: int, copies: int, gen: torch.Generator) -> torch.Tensor:
    """``copies`` copies of a run of ``length`` random words: (length * copies,)."""
    run = words[torch.randint(0, len(words), (length,), generator=gen)]
    return run.repeat(copies)


def triples(words: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` triples of random words A B A: (3 * count,). The third word of each is the one
    before the second: a model predicts it by reading the previous token, and by nothing else."""
    pairs = words[torch.randint(0, len(words), (count, 2), generator=gen)]  # (count, 2)
    return torch.cat([pairs, pairs[:, :1]], dim=1).flatten()


def get_batch(
    data: torch.Tensor, batch: int, seq: int, gen: torch.Generator, repeat_share: float,
    words_share: float = 0.0, random_share: float = 0.0, words: torch.Tensor | None = None, vocab: int = 0,
    triples_share: float = 0.0,
) -> torch.Tensor:
    """(batch, seq+1) windows of the corpus; a share of rows carry something repeated.

    * ``repeat_share``: a segment of the row is copied to a later place in it;
    * ``words_share``: a run of 8 to 64 random common words, repeated 2 to 4 times, overwrites
      part of the row (the induction probe's task, in the middle of ordinary text);
    * ``random_share``: the row is a run of random token ids repeated until it is full;
    * ``triples_share``: 8 to 64 triples of random common words ``A B A`` overwrite part of the row.
    """
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    x = torch.stack([data[s : s + seq + 1] for s in starts])  # (B, T+1)
    for row in range(batch):
        draw = torch.rand((), generator=gen).item()
        if draw < random_share:
            period = int(torch.randint(8, max(9, seq // 4), (), generator=gen))
            segment = torch.randint(256, vocab, (period,), generator=gen)  # skip byte-level tokens
            x[row] = segment.repeat(seq // period + 2)[: seq + 1]
        elif draw < random_share + words_share and words is not None:
            length = int(torch.randint(8, min(65, max(9, seq // 4)), (), generator=gen))
            copies = int(torch.randint(2, 5, (), generator=gen))
            run = repeated_words(words, length, copies, gen)[: seq + 1]
            dst = int(torch.randint(0, seq + 2 - len(run), (), generator=gen))
            x[row, dst : dst + len(run)] = run
        elif draw < random_share + words_share + triples_share and words is not None:
            run = triples(words, int(torch.randint(8, min(65, max(9, seq // 6)), (), generator=gen)), gen)[: seq + 1]
            dst = int(torch.randint(0, seq + 2 - len(run), (), generator=gen))
            x[row, dst : dst + len(run)] = run
        elif draw < random_share + words_share + triples_share + repeat_share:
            length = int(torch.randint(min(16, seq // 8), seq // 4, (), generator=gen))
            src = int(torch.randint(0, seq // 2 - length, (), generator=gen))
            dst = int(torch.randint(src + length, seq + 1 - length, (), generator=gen))
            x[row, dst : dst + length] = x[row, src : src + length].clone()
    return x


def heldout_windows(data: torch.Tensor, seq: int, count: int) -> torch.Tensor:
    """(count, seq) evenly spaced windows of the held-out stream (fewer if it is short)."""
    step = max(seq, (len(data) - seq) // count)
    return torch.stack([data[s : s + seq] for s in range(0, len(data) - seq, step)][:count])


@torch.no_grad()
def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, data: torch.Tensor, seq: int,
             count: int = 8) -> tuple[float, float]:
    """(mean loss in nats per token, bits per UTF-8 byte) on held-out windows."""
    model.eval()
    windows = heldout_windows(data, seq, count)  # (W, T)
    nats, tokens, n_bytes = 0.0, 0, 0
    for ids in windows:
        logits = model(ids[None]).logits[0, :-1].float()  # (T-1, V)
        nats += torch.nn.functional.cross_entropy(logits, ids[1:], reduction="sum").item()
        tokens += len(ids) - 1
        # the text's own bytes: <|endoftext|> between documents is not 13 bytes of text
        n_bytes += len(tokenizer.decode(ids[1:], skip_special_tokens=True).encode("utf-8"))
    model.train()
    return nats / tokens, nats / math.log(2) / n_bytes


@torch.no_grad()
def attention_probes(model: PreTrainedModel, data: torch.Tensor, seq: int, words: torch.Tensor,
                     n_windows: int = 2, length: int = 40, seeds: int = 4) -> tuple[list[list[float]], list[list[float]]]:
    """(previous-token, induction) scores, each (layers x heads).

    previous-token: mean attention from i to i-1 on held-out windows of ``seq`` tokens;
    induction: mean attention from each token of the second copy of ``length`` random common
    words to the token after its first occurrence.
    """
    model.eval()
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the only implementation that returns weights
    x = heldout_windows(data, seq, n_windows)  # (W, T)
    attentions = model(x, output_attentions=True).attentions  # layers x (W, H, T, T)
    prev = [previous_token_weights(a).mean(dim=(0, 2)).tolist() for a in attentions]
    gen = torch.Generator().manual_seed(99)
    runs = torch.stack([repeated_words(words, length, 2, gen) for _ in range(seeds)])  # (S, 2L)
    attentions = model(runs, output_attentions=True).attentions
    q = torch.arange(length, 2 * length)
    induction = [a[:, :, q, q - length + 1].mean(dim=(0, 2)).tolist() for a in attentions]
    model.set_attn_implementation(implementation)
    model.train()
    return prev, induction


def llama_config(args: argparse.Namespace, vocab: int, eos: int) -> LlamaConfig:
    """Rotary positions (relative offsets are one rotation away: previous-token and induction heads
    need no learned table), RMSNorm, SwiGLU, tied embeddings."""
    ffn = args.ffn or -(-args.d_model * 8 // 3 // 32) * 32
    return LlamaConfig(
        vocab_size=vocab, hidden_size=args.d_model, intermediate_size=ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads or args.heads,
        max_position_embeddings=args.positions, rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, attention_dropout=0.0,
        attn_implementation="sdpa",
    )


def lr_at(step: int, max_steps: int, warmup: int, lr: float, min_lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, max_steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def lr_of(step: int, args: argparse.Namespace) -> float:
    """This step's learning rate: the schedule of ``lr_at`` counted from ``--schedule-from``."""
    min_lr = args.lr / 10 if args.min_lr is None else args.min_lr
    return lr_at(max(0, step - args.schedule_from), args.steps - args.schedule_from, args.warmup, args.lr, min_lr)


def window_at(step: int, args: argparse.Namespace) -> tuple[int, int]:
    """(batch, seq) of this step: short windows first, ``--long-seq`` from ``--long-from`` on."""
    if step >= int(args.long_from * args.steps) and args.long_seq > args.seq:
        return max(1, args.batch * args.seq // args.long_seq), args.long_seq
    return args.batch, args.seq


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--out", type=Path, default=Path("data/run"))
    p.add_argument("--vocab", type=int, default=20480)
    p.add_argument("--common-words", type=int, default=1500, help="most frequent words made whole tokens")
    p.add_argument("--common-chars", type=int, default=3000, help="most frequent CJK characters made whole tokens")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--long-seq", type=int, default=1024)
    p.add_argument("--long-from", type=float, default=0.8, help="share of the steps after which windows are --long-seq")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--min-lr", type=float, default=None, help="where the cosine ends (default: --lr / 10)")
    p.add_argument("--schedule-from", type=int, default=0,
                   help="step at which this schedule (warm-up, then cosine to --steps) begins: a cool-down of a "
                        "resumed run starts its own schedule here")
    p.add_argument("--repeat-share", type=float, default=0.15, help="rows that copy a segment of themselves")
    p.add_argument("--words-share", type=float, default=0.2, help="rows carrying a repeated run of random words")
    p.add_argument("--random-share", type=float, default=0.05, help="rows that repeat a run of random token ids")
    p.add_argument("--triples-share", type=float, default=0.0, help="rows carrying triples of random words A B A")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--probe-seq", type=int, default=1024, help="length of the held-out windows the probes read")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the forward (weights stay float32)")
    p.add_argument("--kv-heads", type=int, default=0, help="key/value heads (0 = as many as --heads)")
    p.add_argument("--ffn", type=int, default=0, help="SwiGLU width (0 = 8/3 d_model, rounded up to 32)")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--tokenizer", type=Path, default=None, help="reuse the tokenizer of this folder instead of training one")
    p.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    p.add_argument("--stop-at", type=int, default=None,
                   help="end this invocation after this step (checkpointed), the schedule still reading --steps")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    state = torch.load(args.out / STATE, weights_only=False) if args.resume else None
    if state is not None or args.tokenizer:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out if state is not None else args.tokenizer)
        tokenizer.save_pretrained(args.out)
    else:
        tokenizer = train_tokenizer(args.corpus, args.vocab, args.common_words, args.common_chars)
        tokenizer.model_max_length = args.positions
        tokenizer.save_pretrained(args.out)
    train = encode_docs(tokenizer, args.corpus / "train.txt")
    held = encode_docs(tokenizer, args.corpus / "heldout.txt")
    words = word_ids(tokenizer)
    log.info("tokenizer: %d tokens (%d common words), train %d tokens, held-out %d tokens (%.0fs)",
             len(tokenizer), len(words), len(train), len(held), time.time() - t0)

    if state is not None:
        model = AutoModelForCausalLM.from_pretrained(args.out, attn_implementation="sdpa")
    else:
        model = LlamaForCausalLM(llama_config(args, len(tokenizer), tokenizer.eos_token_id))
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %d parameters", n_params)
    # no weight decay on the (tied) token embeddings or on gains and biases
    embeddings = {id(model.get_input_embeddings().weight)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    curve: list[dict[str, object]] = []
    phases: list[dict[str, object]] = []  # each invocation (the first, then every --resume) and where it began
    first, elapsed_before = 0, 0.0
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        curve, first, elapsed_before = state["curve"], state["step"], state["seconds"]
        phases = state.get("phases", [])
        log.info("resuming at step %d", first)
    phases.append({"from_step": first, "args": {k: str(v) for k, v in vars(args).items()}})
    model.train()
    start = time.time() - elapsed_before
    last = min(args.steps, args.stop_at or args.steps)
    bar = tqdm(range(first, last), initial=first, total=args.steps, mininterval=30, desc="train")
    # tokens seen so far: the checkpoint's count (earlier phases may have read other window sizes)
    tokens = int(curve[-1]["tokens"]) + (first - int(curve[-1]["step"])) * args.batch * args.seq if curve else 0
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_of(step, args)
        batch, seq = window_at(step, args)
        x = get_batch(train, batch, seq, gen, args.repeat_share, args.words_share, args.random_share,
                      words, len(tokenizer), args.triples_share)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(x[:, :-1], labels=x[:, :-1]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += batch * seq
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == last:
            held_loss, bpb = evaluate(model, tokenizer, held, args.seq)
            prev, induction = attention_probes(model, held, args.probe_seq, words)
            prev_top = sorted((v for row in prev for v in row), reverse=True)[:2]
            ind_top = max(v for row in induction for v in row)
            elapsed = time.time() - start
            curve.append({"step": step + 1, "tokens": tokens, "train_loss": loss.item(), "heldout_loss": held_loss,
                          "heldout_bpb": bpb, "seconds": elapsed, "prev_token_top2": prev_top,
                          "induction_top": ind_top, "seq": seq})
            log.info("step %d tokens %d train %.3f held-out %.3f (%.3f bits/byte) prev-token top-2 %.2f %.2f "
                     "induction %.2f (%.0f tok/s)", step + 1, tokens, loss.item(), held_loss, bpb, prev_top[0],
                     prev_top[1], ind_top, tokens / elapsed)
            model.save_pretrained(args.out)
            (args.out / "training.json").write_text(json.dumps({
                "n_params": n_params, "train_tokens_in_corpus": len(train), "heldout_tokens": len(held),
                "args": {k: str(v) for k, v in vars(args).items()}, "phases": phases, "curve": curve,
                "hardware": f"CPU, {torch.get_num_threads()} thread(s)"}, indent=1))
            torch.save({"optimizer": opt.state_dict(), "generator": gen.get_state(), "curve": curve,
                        "step": step + 1, "seconds": elapsed, "phases": phases}, args.out / STATE)
    log.info("done in %.0f s", time.time() - start)


if __name__ == "__main__":
    main()
