"""Activation patching: copy one activation of a clean run into a corrupted run.

The metric is logit(answer) - logit(wrong) at one position; each patch's value is
normalised as (patched - corrupted) / (clean - corrupted), so 1 means "this activation
alone restores the clean behaviour" and 0 "it does nothing". Sites, TransformerLens names:

* ``resid``: L + 1 stages by position — stage 0 is ``blocks.0.hook_resid_pre`` (the
  embeddings), stage i the output of block i - 1, the last stage the final residual;
* ``attn_out`` / ``mlp_out``: each sublayer's output, L by position;
* ``heads``: one head's ``z`` at every position, L by H.

Each patch is one row of a batched forward of the corrupted prompt. Causal models read the
answer position P from tokens 0..P only: the batch runs that prefix, positions after P
have effect 0, and so do positions before the first token where the prompts differ (both
runs are identical there) — those are skipped unless ``skip_unaffected`` is False.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn

from attnscope.model.capture.hooks import Hook, Registration, temporary_hooks
from attnscope.model.errors import BadInput, Cancelled
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import Token, ids_tensor, token_map, tokenize, tokens_of
from attnscope.model.results import Matrix, TokenRef
from attnscope.model.tools import intervene
from attnscope.model.tools.intervene import (
    attention_module,
    batch_size,
    first,
    hidden_arg,
    logits,
    mlp_module,
    out_proj,
    replace_first,
    split_heads,
    with_hidden,
)

Site = Literal["resid", "attn_out", "mlp_out", "heads"]
SITES: tuple[Site, ...] = ("resid", "attn_out", "mlp_out", "heads")
# a job: (site, layer or stage, position or head)
Job = tuple[Site, int, int]
# the most arithmetic one patching request may ask for (about a minute of two CPU cores)
MAX_FLOPS = 2e13
# below this |clean - corrupted| (in logits) the normalised maps divide by noise: the page says so instead
MIN_GAP = 0.5


@dataclass(frozen=True)
class Pair:
    """A clean / corrupted prompt pair and the two answers its metric compares."""

    clean: str
    corrupted: str
    answer: str
    wrong: str


# Default pairs, tried in order on a model with one cheap forward each (``separates``): the first it
# separates is the tool's example. IOI (SmolLM2-135M: clean +6.1, corrupted -5.5) needs a model that can
# do IOI and " Mary" as one token; the copied sentence suits the bundled model (+0.43 / -0.25: its
# induction head, layer 4 head 0, restores the most); the repeated colour any small model.
PAIRS = (
    Pair("When Mary and John went to the store, John gave a drink to",
         "When Mary and John went to the store, Mary gave a drink to", " Mary", " John"),
    Pair("My friend John lives in the city. My friend John lives in the",
         "My friend John lives in the country. My friend John lives in the", " city", " country"),
    Pair("The key is red. The key is red. The key is", "The key is blue. The key is blue. The key is", " red", " blue"),
)


PROBE_ROWS = 8  # rows of the probe forward: enough for its speed to be a batched forward's, per row


def separates(lm: LoadedModel, clean_ids: torch.Tensor, corrupted_ids: torch.Tensor, answer: int,
              wrong: int) -> tuple[float, float, float]:
    """(clean metric, corrupted metric, seconds per patched row) of one pair of equal-length prompts: one
    batched forward of the two and PROBE_ROWS - 2 copies, timed (what ``patch``'s batches cost a row)."""
    batch = torch.cat([clean_ids[None], corrupted_ids[None].expand(PROBE_ROWS - 1, -1)])  # (PROBE_ROWS, n)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = logits(lm, batch, keep=1)[:, -1]  # (PROBE_ROWS, V)
        per_row = (time.perf_counter() - t0) / PROBE_ROWS
    clean, corrupted = metric_of(out[:2], answer, wrong).tolist()
    return float(clean), float(corrupted), per_row


def jobs_for(n_layers: int, n_heads: int, lowest: int, pos: int, sites: tuple[Site, ...]) -> list[Job]:
    """Every patch one request runs: (site, layer or stage, position or head)."""
    jobs: list[Job] = []
    if "resid" in sites:
        jobs += [("resid", s, p) for s in range(n_layers + 1) for p in range(lowest, pos + 1)]
    for site in ("attn_out", "mlp_out"):
        if site in sites:
            jobs += [(site, layer, p) for layer in range(n_layers) for p in range(lowest, pos + 1)]
    if "heads" in sites:
        jobs += [("heads", layer, h) for layer in range(n_layers) for h in range(n_heads)]
    return jobs


def cost(lm: LoadedModel, clean_ids: torch.Tensor, corrupted_ids: torch.Tensor) -> tuple[int, float]:
    """(patched forwards, FLOP) of patching every site at the last position (what ``patch`` runs)."""
    n = int(clean_ids.shape[0])
    differ = (clean_ids != corrupted_ids).nonzero()
    first_diff = int(differ[0, 0]) if differ.numel() else n
    jobs = jobs_for(lm.info.n_layers, lm.info.n_heads, min(first_diff, n), n - 1, SITES)
    return len(jobs), len(jobs) * forward_flops(lm, n)


@dataclass(frozen=True, slots=True)
class PatchPrompt:
    text: str
    tokens: list[Token]
    metric: Annotated[float, Field(description="logit(answer) - logit(wrong) at position")]


@dataclass(frozen=True, slots=True)
class Patch:
    """Activation patching from ``clean`` into ``corrupted``: each value is (patched - corrupted) /
    (clean - corrupted) of the metric; 1 restores the clean answer. The maps are tensors in Python."""

    model: str
    clean: PatchPrompt
    corrupted: PatchPrompt
    answer: TokenRef
    wrong: TokenRef
    position: int
    first_difference: Annotated[int, Field(description="first position where the prompts' tokens differ")]
    resid: Annotated[Matrix, Field(description=(
        "[stage][position], L + 1 stages: stage 0 the embeddings (blocks.0.hook_resid_pre), stage i the "
        "output of block i - 1; each value (patched - corrupted) / (clean - corrupted)"))]
    attn_out: Annotated[Matrix, Field(description="[layer][position] patching the attention sublayer's output")]
    mlp_out: Annotated[Matrix, Field(description="[layer][position] patching the MLP's output")]
    heads: Annotated[Matrix, Field(description="[layer][head] patching one head's output at every position")]
    forwards: Annotated[int, Field(description="batched forwards the patches ran")]


@dataclass(frozen=True, slots=True)
class PatchExample:
    """The default pair for ``model`` (the first of ``PAIRS`` it separates, by one cheap forward each), its
    two metrics, and what patching it costs: ``forwards`` patched rows, ``tflop``, and ``seconds`` estimated
    from the probe's speed per row (a batched forward of ``PROBE_ROWS``)."""

    model: str
    clean: str
    corrupted: str
    answer: str
    wrong: str
    clean_metric: Annotated[float, Field(
        description="logit(answer) - logit(wrong) at the last position, clean prompt")]
    corrupted_metric: float
    separated: Annotated[bool, Field(description="clean > 0 and clean - corrupted >= 0.5: the pair suits this "
                                                 "model (else it is the best of the pairs tried)")]
    forwards: Annotated[int, Field(description="patched rows patching this pair runs")]
    tflop: float
    seconds: Annotated[float, Field(
        description="how long patching it should take here, from the probe forward's speed")]


@dataclass(frozen=True)
class CleanActivations:
    """The clean prefix's activations, batch dimension dropped."""

    resid: list[torch.Tensor]  # L + 1 x (P+1, d)
    attn_out: list[torch.Tensor]  # L x (P+1, d)
    mlp_out: list[torch.Tensor]  # L x (P+1, d)
    z: list[torch.Tensor]  # L x (P+1, H * d_head)
    metric: float


def metric_of(out: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    """(B, V) last-position logits -> (B,) logit(answer) - logit(wrong)."""
    return out[:, answer] - out[:, wrong]


def capture_clean(lm: LoadedModel, ids: torch.Tensor, answer: int, wrong: int) -> CleanActivations:
    n_layers = lm.info.n_layers
    store: dict[tuple[str, int], torch.Tensor] = {}

    def keep_input(key: tuple[str, int]) -> Hook:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            store[key] = hidden_arg(args, kwargs)[0].detach()

        return hook

    def keep_output(key: tuple[str, int]) -> Hook:
        def hook(_m: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
            store[key] = first(output)[0].detach()

        return hook

    def keep_z(layer: int) -> Hook:
        def hook(_m: nn.Module, args: tuple[Any, ...]) -> None:
            store[("z", layer)] = args[0][0].detach()

        return hook

    regs = [Registration(lm.blocks[0], "pre_kwargs", keep_input(("resid", 0)))]
    for layer in range(n_layers):
        regs += [Registration(lm.blocks[layer], "post", keep_output(("resid", layer + 1))),
                 Registration(attention_module(lm, layer), "post", keep_output(("attn_out", layer))),
                 Registration(mlp_module(lm, layer), "post", keep_output(("mlp_out", layer))),
                 Registration(out_proj(lm, layer), "pre", keep_z(layer))]
    with temporary_hooks(regs):
        out = logits(lm, ids[None], keep=1)[:, -1]  # (1, V)
    return CleanActivations(resid=[store[("resid", i)] for i in range(n_layers + 1)],
                  attn_out=[store[("attn_out", i)] for i in range(n_layers)],
                  mlp_out=[store[("mlp_out", i)] for i in range(n_layers)],
                  z=[store[("z", i)] for i in range(n_layers)],
                  metric=float(metric_of(out, answer, wrong)[0]))



def patch_hooks(lm: LoadedModel, clean: CleanActivations, part: list[Job], first_row: int = 2) -> list[Registration]:
    """Hooks that put, for batch row r + first_row, the clean activation of job r into the corrupted
    run (``patch`` keeps rows 0 and 1 for the corrupted and the clean run)."""
    n_heads = lm.info.n_heads
    by_site: dict[tuple[Site, int], list[tuple[int, int]]] = defaultdict(list)
    for row, (site, layer, index) in enumerate(part, start=first_row):
        by_site[(site, layer)].append((row, index))

    def resid_in(edits: list[tuple[int, int]]) -> Hook:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
            h = hidden_arg(args, kwargs).clone()  # (B, P+1, d)
            for row, pos in edits:
                h[row, pos] = clean.resid[0][pos]
            return with_hidden(args, kwargs, h)

        return hook

    def output(source: torch.Tensor, edits: list[tuple[int, int]]) -> Hook:
        def hook(_m: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
            h = first(out).clone()  # (B, P+1, d)
            for row, pos in edits:
                h[row, pos] = source[pos]
            return replace_first(out, h)

        return hook

    def z_in(source: torch.Tensor, edits: list[tuple[int, int]]) -> Hook:
        clean_heads = split_heads(source, n_heads)  # (P+1, H, d_head)

        def hook(_m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            z = split_heads(args[0].clone(), n_heads)  # (B, P+1, H, d_head)
            for row, head in edits:
                z[row, :, head] = clean_heads[:, head]
            return (z.flatten(-2), *args[1:])

        return hook

    regs = []
    for (site, layer), edits in by_site.items():
        if site == "resid" and layer == 0:
            regs.append(Registration(lm.blocks[0], "pre_kwargs", resid_in(edits)))
        elif site == "resid":
            regs.append(Registration(lm.blocks[layer - 1], "post", output(clean.resid[layer], edits)))
        elif site == "attn_out":
            regs.append(Registration(attention_module(lm, layer), "post", output(clean.attn_out[layer], edits)))
        elif site == "mlp_out":
            regs.append(Registration(mlp_module(lm, layer), "post", output(clean.mlp_out[layer], edits)))
        else:
            regs.append(Registration(out_proj(lm, layer), "pre", z_in(clean.z[layer], edits)))
    return regs


def forward_flops(lm: LoadedModel, n: int) -> float:
    """Multiply-adds x 2 of one forward over n tokens: the weights once a token, attention n^2."""
    info = lm.info
    weights = info.n_params - info.vocab_size * info.d_model  # the embedding lookup is free
    return 2.0 * weights * n + 4.0 * info.n_layers * n * n * info.d_model


def single_token(lm: LoadedModel, text: str, what: str) -> int:
    """The id of ``text`` if it is exactly one token (no special tokens added)."""
    ids: list[int] = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = [t.text for t in tokenize(lm.tokenizer, text, add_special_tokens=False)]  # display text, not BPE bytes
        space = len(pieces) > 1 and text.startswith(" ") and not pieces[0].strip()
        if space:
            hint = "here the leading space is a token of its own: try it without the space"
        else:
            hint = "a leading space is often part of an English word's token, e.g. ' Peter'"
        raise BadInput(f"{what} {text!r} is {len(ids)} tokens for this model ({pieces}); it must be exactly one "
                       f"token ({hint})", code="patch_space" if space else "patch_one",
                       params={"field": what, "text": text, "tokens": len(ids), "pieces": pieces})
    return int(ids[0])


def _prompt(lm: LoadedModel, prompt: torch.Tensor | list[Token], text: str | None) -> tuple[str, list[Token]]:
    if isinstance(prompt, torch.Tensor):
        spelt, tokens = tokens_of(lm.tokenizer, prompt.tolist())
        return spelt if text is None else text, tokens
    return "".join(t.text for t in prompt) if text is None else text, prompt


def patch(lm: LoadedModel, clean: torch.Tensor | list[Token], corrupted: torch.Tensor | list[Token], answer: int,
          wrong: int, position: int | None = None, sites: tuple[Site, ...] = SITES, skip_unaffected: bool = True,
          max_flops: float = MAX_FLOPS, stop: threading.Event | None = None,
          texts: tuple[str, str] | None = None) -> Patch:
    """Patch every site of ``sites`` from the clean prompt into the corrupted one, one at a time. Each
    prompt is its ids (n,) or its tokens; ``texts``: the two prompts as typed (default: what the tokens
    spell). ``stop`` set: Cancelled, between two batched forwards (the client went away)."""
    intervene.require_decoder(lm, "activation patching")
    clean_text, clean_tokens = _prompt(lm, clean, None if texts is None else texts[0])
    corrupted_text, corrupted_tokens = _prompt(lm, corrupted, None if texts is None else texts[1])
    clean_ids, corrupted_ids = ids_tensor(clean_tokens), ids_tensor(corrupted_tokens)  # (n,) each
    n = int(clean_ids.shape[0])
    if corrupted_ids.shape[0] != n:
        raise BadInput(f"the clean prompt has {n} tokens and the corrupted one {int(corrupted_ids.shape[0])}; "
                       "patching needs prompts of the same token count", code="patch_lengths",
                       params={"clean": n, "corrupted": int(corrupted_ids.shape[0])})
    pos = n - 1 if position is None else position
    if not 0 <= pos < n:
        raise BadInput(f"position {pos} is out of range: the prompts have positions 0..{n - 1}",
                       code="position_out_of_range", params={"position": pos, "max": n - 1})
    differ = (clean_ids != corrupted_ids).nonzero()
    first_diff = int(differ[0, 0]) if differ.numel() else n
    n_layers, n_heads = lm.info.n_layers, lm.info.n_heads
    clean_prefix, corrupted_prefix = clean_ids[: pos + 1], corrupted_ids[: pos + 1]
    lowest = min(first_diff, pos + 1) if skip_unaffected else 0
    clean_run = capture_clean(lm, clean_prefix, answer, wrong)
    corrupted_metric = float(metric_of(logits(lm, corrupted_prefix[None], keep=1)[:, -1], answer, wrong)[0])
    if abs(clean_run.metric - corrupted_metric) < 1e-6 * max(1.0, abs(clean_run.metric)):
        raise BadInput(f"both prompts give the same metric (logit(answer) - logit(wrong) = {clean_run.metric:.6g} "
                       f"and {corrupted_metric:.6g}): there is no difference for patching to recover",
                       code="patch_same",
                       params={"clean": f"{clean_run.metric:.6g}", "corrupted": f"{corrupted_metric:.6g}"})
    jobs: list[Job] = jobs_for(n_layers, n_heads, lowest, pos, sites)
    flops = len(jobs) * forward_flops(lm, pos + 1)
    if flops > max_flops:
        raise BadInput(f"patching these prompts takes {len(jobs)} patched forwards of {pos + 1} tokens "
                       f"(about {flops / 1e12:.0f} TFLOP), more than this server's limit of "
                       f"{max_flops / 1e12:.0f}; use shorter prompts, or read the metric nearer the first "
                       "difference", code="patch_flops",
                       params={"forwards": len(jobs), "tokens": pos + 1, "tflop": round(flops / 1e12),
                               "limit": round(max_flops / 1e12)})
    chunk = max(1, batch_size(lm, pos + 1, 1) - 2)
    values: dict[Job, float] = {}
    forwards = 0
    for start in range(0, len(jobs), chunk):
        if stop is not None and stop.is_set():
            raise Cancelled
        part = jobs[start : start + chunk]
        # the references ride in the batch, so that an identical row gives exactly 0 or 1
        batch = torch.cat([corrupted_prefix[None], clean_prefix[None],
                           corrupted_prefix[None].expand(len(part), -1)])  # (B, P+1)
        with temporary_hooks(patch_hooks(lm, clean_run, part)):
            out = logits(lm, batch, keep=1)[:, -1]  # (B, V)
        forwards += 1
        metric = metric_of(out, answer, wrong)  # (B,)
        low, span = metric[0], metric[1] - metric[0]
        values.update(zip(part, ((metric[2:] - low) / span).tolist(), strict=True))

    def grid(site: Site, rows: int, cols: int) -> torch.Tensor:
        """(rows, cols): 0 where a site was skipped."""
        return torch.tensor([[values.get((site, r, c), 0.0) for c in range(cols)] for r in range(rows)])

    named = token_map(lm.tokenizer, [answer, wrong])
    return Patch(model=lm.info.name, clean=PatchPrompt(clean_text, clean_tokens, clean_run.metric),
                 corrupted=PatchPrompt(corrupted_text, corrupted_tokens, corrupted_metric),
                 answer=TokenRef(answer, named[answer]), wrong=TokenRef(wrong, named[wrong]), position=pos,
                 first_difference=first_diff, resid=grid("resid", n_layers + 1, n),
                 attn_out=grid("attn_out", n_layers, n), mlp_out=grid("mlp_out", n_layers, n),
                 heads=grid("heads", n_layers, n_heads), forwards=forwards)
