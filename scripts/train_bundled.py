"""Train the bundled decoder: a byte-level BPE tokenizer and a small GPT-2, on CPU.

A plain PyTorch loop in the spirit of nanoGPT's train.py: AdamW, linear warm-up then
cosine decay, gradient clipping, a fixed seed, a held-out split and a progress bar.
Every evaluation also probes each head's previous-token score on held-out text.

Options for a CPU-sized budget, each measured (see the model card):

* a share of rows repeat a segment of themselves, or a run of random tokens, so that
  in-context copying (induction heads) has a reason to form;
* the position table can start from sinusoids (``--position-spread mixed`` makes
  neighbouring positions nearly orthogonal);
* ``--guide-steps``: for a short warm-up, a term in the loss points a few heads at the
  previous token; its weight falls to 0, and from then on the language-model loss alone
  decides whether the model keeps them.

Usage (after scripts/build_corpus.py)::

    nohup python scripts/train_bundled.py --corpus data/corpus \
        --out model/bundled/attnscope-tiny > train.log 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from model.analysis import previous_token_weights

log = logging.getLogger("train_bundled")
EOS = "<|endoftext|>"


def train_tokenizer(corpus: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(corpus / "train.txt")], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, model_max_length=512
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


def get_batch(
    data: torch.Tensor, batch: int, seq: int, gen: torch.Generator, repeat_share: float,
    random_share: float = 0.0, vocab: int = 0,
) -> torch.Tensor:
    """(batch, seq+1) windows; a share of rows copy a segment of themselves later on.

    Another share of rows (``random_share``) are a run of random tokens repeated until the
    row is full: a task only attention can solve (look back one period, then copy), which
    rewards a previous-token head and an induction head composing with it.
    """
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    x = torch.stack([data[s : s + seq + 1] for s in starts])  # (B, T+1)
    for row in range(batch):
        draw = torch.rand((), generator=gen).item()
        if draw < random_share:
            period = int(torch.randint(8, seq // 2, (), generator=gen))
            segment = torch.randint(256, vocab, (period,), generator=gen)  # skip byte-level tokens
            x[row] = segment.repeat(seq // period + 2)[: seq + 1]
        elif draw < random_share + repeat_share:
            length = int(torch.randint(min(16, seq // 8), seq // 4, (), generator=gen))
            src = int(torch.randint(0, seq // 2 - length, (), generator=gen))
            dst = int(torch.randint(src + length, seq + 1 - length, (), generator=gen))
            x[row, dst : dst + length] = x[row, src : src + length].clone()
    return x


@torch.no_grad()
def evaluate(model: GPT2LMHeadModel, data: torch.Tensor, seq: int, n_batches: int = 8) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(n_batches):
        x = get_batch(data, 8, seq, gen, repeat_share=0.0)
        losses.append(model(x[:, :-1], labels=x[:, :-1]).loss.item())
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def previous_token_scores(model: GPT2LMHeadModel, data: torch.Tensor, seq: int, n_windows: int = 4) -> list[list[float]]:
    """(layers x heads) mean attention from i to i-1 on held-out windows, as the model card measures it."""
    model.eval()
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the only implementation that returns weights
    step = max(seq, (len(data) - seq) // n_windows)
    x = torch.stack([data[s : s + seq] for s in range(0, len(data) - seq, step)][:n_windows])  # (W, T)
    attentions = model(x, output_attentions=True).attentions  # layers x (W, H, T, T)
    scores = [previous_token_weights(a).mean(dim=(0, 2)).tolist() for a in attentions]
    model.set_attn_implementation(implementation)
    model.train()
    return scores


def sinusoids(positions: int, d: int, spread: str = "geometric") -> torch.Tensor:
    """A (positions, d) table of sin/cos pairs: sin on even dims, cos on odd.

    ``geometric``: the original transformer's frequencies, 1 down to 1/10000 — most of them
    low, so neighbouring positions look alike (p_i . p_j falls off slowly with |i - j|).
    ``mixed``: half the pairs keep those; the other half get frequencies spread evenly (with
    a fixed jitter) over (0, pi), whose sum of cosines is a sharp kernel: positions i and
    i - 1 are then nearly orthogonal, and because p_{i-1} is a fixed rotation of p_i, one
    linear map in a head's query/key weights can point every position at its predecessor.
    """
    pos = torch.arange(positions).float()[:, None]  # (P, 1)
    half = d // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2).float() / d)  # (d/2,)
    if spread == "mixed":
        gen = torch.Generator().manual_seed(0)
        local = half // 2
        even = (torch.arange(local).float() + torch.rand(local, generator=gen)) / local  # (0, 1)
        freq = torch.cat([math.pi * even, freq[::2][: half - local]])
    elif spread != "geometric":
        raise ValueError(spread)
    table = torch.zeros(positions, d)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


def grow_positions(model: GPT2LMHeadModel, positions: int) -> GPT2LMHeadModel:
    """Extend the learned position table to ``positions`` rows (new rows = the last one)."""
    old = model.transformer.wpe.weight.data  # (P_old, d)
    if positions <= old.shape[0]:
        return model
    grown = torch.nn.Embedding(positions, old.shape[1])
    grown.weight.data[: old.shape[0]] = old
    grown.weight.data[old.shape[0]:] = old[-1]
    model.transformer.wpe = grown
    model.config.n_positions = positions
    return model


def guide_weight(step: int, steps: int, weight: float) -> float:
    """The guide's weight: ``weight`` at step 0, falling linearly to 0 at ``steps``."""
    return weight * max(0.0, 1.0 - step / steps) if steps else 0.0


def guide_loss(attentions: tuple[torch.Tensor, ...], heads: list[tuple[int, int]]) -> torch.Tensor:
    """Mean -log of the attention from each token to the one before it, for the guided heads.

    attentions: per layer (B, H, T, T). A warm-up only: it names the behaviour (look one
    token back) for a few heads early on; the language-model loss alone decides afterwards
    whether the model keeps them.
    """
    losses = []
    for layer, head in heads:
        a = attentions[layer][:, head]  # (B, T, T)
        losses.append(-(previous_token_weights(a) + 1e-6).log().mean())
    return torch.stack(losses).mean()


def lr_at(step: int, max_steps: int, warmup: int, lr: float, min_lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, max_steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    p.add_argument("--out", type=Path, default=Path("model/bundled/attnscope-tiny"))
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--positions", type=int, default=512)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--repeat-share", type=float, default=0.15)
    p.add_argument("--random-share", type=float, default=0.0,
                   help="share of rows that repeat a run of random tokens (trains copying heads)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--probe-seq", type=int, default=256,
                   help="length of the held-out windows the previous-token probe reads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="reuse the tokenizer of this folder instead of training one (the same vocabulary)")
    p.add_argument("--sinusoid-init", type=float, default=0.05,
                   help="start the learned position table from sinusoids of this amplitude (0 = GPT-2's random init); "
                        "smooth positions let previous-token heads form within a CPU-sized budget")
    p.add_argument("--position-spread", choices=("geometric", "mixed"), default="geometric",
                   help="frequencies of the sinusoidal start (see sinusoids())")
    p.add_argument("--freeze-positions", type=int, default=0,
                   help="hold the position table fixed for this many steps (then it is learned): a relative "
                        "mechanism learnt on short windows then holds at every position")
    p.add_argument("--positions-only-from", type=int, default=None,
                   help="train only the position table's rows from this one on, every other weight held: rows "
                        "that earlier phases never reached learn to fit the trained network")
    p.add_argument("--no-attn-scale", action="store_true",
                   help="GPT-2's scale_attn_weights=False: attention logits are q.k, not q.k/sqrt(d_head)")
    p.add_argument("--guide-heads", default="0:0,0:1",
                   help="layer:head pairs the guide points at the previous token (with --guide-steps)")
    p.add_argument("--guide-steps", type=int, default=0,
                   help="add the guide to the loss for this many steps, its weight falling linearly to 0")
    p.add_argument("--guide-weight", type=float, default=0.5)
    p.add_argument("--qk-init", type=float, default=0.0,
                   help="std of the query/key weights at init (0 = GPT-2's 0.02); larger logits let heads "
                        "specialise sooner")
    p.add_argument("--resume", type=Path, default=None,
                   help="continue from a trained folder (its tokenizer too); with --positions larger than "
                        "the folder's, the position table grows and the new rows start from the last one")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    if args.resume or args.tokenizer:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.resume or args.tokenizer)
    else:
        tokenizer = train_tokenizer(args.corpus, args.vocab)
    train = encode_docs(tokenizer, args.corpus / "train.txt")
    held = encode_docs(tokenizer, args.corpus / "heldout.txt")
    log.info("tokenizer: %d tokens, train %d tokens, held-out %d tokens (%.0fs)",
             len(tokenizer), len(train), len(held), time.time() - t0)

    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=args.positions, n_embd=args.d_model,
        n_layer=args.layers, n_head=args.heads, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        scale_attn_weights=not args.no_attn_scale,
    )
    model = GPT2LMHeadModel(config) if args.resume is None else grow_positions(
        GPT2LMHeadModel.from_pretrained(args.resume), args.positions)
    tokenizer.model_max_length = model.config.n_positions  # a resumed model may have more than --positions
    tokenizer.save_pretrained(args.out)
    if args.resume is None and args.sinusoid_init > 0:
        with torch.no_grad():
            model.transformer.wpe.weight.copy_(
                args.sinusoid_init * sinusoids(args.positions, args.d_model, args.position_spread))
    if args.resume is None and args.qk_init > 0:
        with torch.no_grad():
            for block in model.transformer.h:  # c_attn is (d, 3d): columns [q | k | v]
                block.attn.c_attn.weight[:, : 2 * args.d_model].normal_(0.0, args.qk_init)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %d parameters", n_params)
    # no weight decay on embeddings (token and position tables) or on gains and biases
    embeddings = {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)}
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or id(p) in embeddings]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    previous = json.loads((args.resume / "training.json").read_text()) if args.resume else None
    curve: list[dict[str, float]] = []
    model.train()
    start = time.time()
    bar = tqdm(range(args.steps), mininterval=30, desc="train")
    implementation = model.config._attn_implementation
    guided = [tuple(int(v) for v in pair.split(":")) for pair in args.guide_heads.split(",") if pair]
    if args.guide_steps:
        log.info("guiding heads %s towards the previous token for %d steps (weight %.2f, falling to 0)",
                 guided, args.guide_steps, args.guide_weight)
        model.set_attn_implementation("eager")  # the guide needs the weights, until it ends
    wpe = model.transformer.wpe.weight
    wpe.requires_grad_(args.freeze_positions == 0)
    if args.positions_only_from is not None:
        for param in model.parameters():
            param.requires_grad_(param is wpe)
        keep = torch.zeros_like(wpe)  # (P, d): 1 on the rows that learn
        keep[args.positions_only_from :] = 1.0
        wpe.register_hook(lambda grad: grad * keep)
        log.info("training only position rows %d.. (all other weights held)", args.positions_only_from)
    for step in bar:
        if step == args.guide_steps and args.guide_steps:
            model.set_attn_implementation(implementation)
        if step == args.freeze_positions and args.freeze_positions:
            wpe.requires_grad_(True)
            log.info("step %d: the position table is learned from now on", step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.warmup, args.lr, args.lr / 10)
        x = get_batch(train, args.batch, args.seq, gen, args.repeat_share, args.random_share, len(tokenizer))
        weight = guide_weight(step, args.guide_steps, args.guide_weight)
        if weight > 0:
            out = model(x[:, :-1], labels=x[:, :-1], output_attentions=True)
            loss = out.loss
            objective = loss + weight * guide_loss(out.attentions, guided)
        else:
            loss = objective = model(x[:, :-1], labels=x[:, :-1]).loss
        opt.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            held_loss = evaluate(model, held, args.seq)
            prev = previous_token_scores(model, held, args.probe_seq)
            best = sorted((v for row in prev for v in row), reverse=True)[:2]
            elapsed = time.time() - start
            tokens = (step + 1) * args.batch * args.seq
            curve.append({"step": step + 1, "tokens": tokens, "train_loss": loss.item(),
                          "heldout_loss": held_loss, "seconds": elapsed, "prev_token_top2": best})
            log.info("step %d tokens %d train %.3f held-out %.3f prev-token top-2 %.2f %.2f (%.0f tok/s)",
                     step + 1, tokens, loss.item(), held_loss, best[0], best[1], tokens / elapsed)
            model.save_pretrained(args.out)
            (args.out / "training.json").write_text(json.dumps({
                "n_params": n_params, "train_tokens_in_corpus": len(train),
                "heldout_tokens": len(held), "args": {k: str(v) for k, v in vars(args).items()},
                "curve": curve, "previous": previous}, indent=1))
    log.info("done in %.0f s", time.time() - start)


if __name__ == "__main__":
    main()
