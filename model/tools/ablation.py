"""Head ablation: run the prompt again with some heads' outputs replaced, and see what changes.

``zero`` replaces a head's ``z`` (hence its output through ``W_O``) by zeros; ``mean`` by
the head's mean ``z`` over the run's positions, which, the projection being affine, is
its mean output. The original and the ablated sequence run as one batch of two; ablating
nothing runs the sequence once and compares that distribution with itself, so its KL is 0
by construction (two rows of one batch can differ in the last bits, by thread count and CPU
kernel, so equal inputs are never left to give equal outputs). The scan ablates every head — and every
MLP — alone, many per batched forward, and only over the prefix that the position sees.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn

from attnscope.model.capture.hooks import Hook, Registration, temporary_hooks
from attnscope.model.errors import BadInput
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import token_map
from attnscope.model.results import Matrix, TokenRef, Vector
from attnscope.model.runs.record import RunRecord
from attnscope.model.tools.intervene import (
    batch_size,
    capture_z,
    first,
    kl_divergence,
    logits,
    mlp_module,
    out_proj,
    replace_first,
    require_decoder,
    split_heads,
)

Mode = Literal["zero", "mean"]


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    token: str
    prob: Annotated[float, Field(description="after the ablation")]
    prob_before: Annotated[float, Field(description="the model's own probability of this token")]


@dataclass(frozen=True, slots=True)
class AblatedNext:
    id: int
    token: str
    prob_before: float
    prob_after: float


@dataclass(frozen=True, slots=True)
class AblatedPosition:
    position: int
    kl: Annotated[float, Field(description="KL(original || ablated) of the next-token distribution, nats")]
    top: Annotated[list[Candidate], Field(description="the ablated distribution's most likely tokens")]
    actual_next: Annotated[AblatedNext | None, Field(
        description="the prompt's next token; null at the last position")]


@dataclass(frozen=True, slots=True)
class Ablation:
    """Every position's next-token distribution with ``heads`` ablated, against the original."""

    # an example: Swagger UI samples a tuple's prefixItems as nulls
    heads: Annotated[list[tuple[int, int]], Field(description="the [layer, head] pairs ablated",
                                                  examples=[[[4, 0]]])]
    mode: Mode
    positions: list[AblatedPosition]


@dataclass(frozen=True, slots=True)
class Scan:
    """The change in ln p(token) at ``position`` when each head (``effects[layer, head]``) or each MLP
    (``mlp[layer]``) alone is ablated."""

    position: int
    token: TokenRef
    mode: Mode
    logprob: Annotated[float, Field(description="ln p(token) at position without any ablation")]
    effects: Annotated[Matrix, Field(description="[layer][head] change of ln p(token) when that head alone "
                                                 "is ablated (negative: the head helped); a (layers, heads) "
                                                 "tensor in Python")]
    mlp: Annotated[Vector, Field(description="[layer] the same for each MLP")]
    forwards: Annotated[int, Field(description="batched forwards the scan ran (the clean sequence rides along "
                                               "in each)")]


def check_heads(lm: LoadedModel, heads: list[tuple[int, int]]) -> None:
    n_layers, n_heads = lm.info.n_layers, lm.info.n_heads
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise BadInput(f"head [{layer}, {head}] is out of range: this model has layers 0..{n_layers - 1} "
                           f"and heads 0..{n_heads - 1}", code="layer_head_out_of_range",
                           params={"layer": layer, "head": head, "max_layer": n_layers - 1, "max_head": n_heads - 1})


def z_editor(n_heads: int, edits: list[tuple[int, int, torch.Tensor | None]]) -> Hook:
    """A pre-hook on an output projection: for each (batch row, head, value) put value
    (d_head,) — or the row-0 (clean) mean when value is None — in place of that head's z."""

    def hook(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = split_heads(args[0].clone(), n_heads)  # (B, n, H, d_head)
        for row, head, value in edits:
            z[row, :, head] = z[0, :, head].mean(0) if value is None else value.to(z.device)
        return (z.flatten(-2), *args[1:])

    return hook


def output_editor(edits: list[tuple[int, torch.Tensor]]) -> Hook:
    """A forward hook: for each (batch row, value (d,)) put value in the module's output at every position."""

    def hook(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> Any:
        out = first(output).clone()  # (B, n, d)
        for row, value in edits:
            out[row] = value.to(out.device)
        return replace_first(output, out)

    return hook


def ablate(lm: LoadedModel, record: RunRecord, heads: list[tuple[int, int]], mode: Mode,
           top_k: int = 5) -> Ablation:
    """Every position's next-token distribution with ``heads`` ablated, against the original."""
    require_decoder(lm, "ablation")
    heads = [(int(layer), int(head)) for layer, head in heads]
    check_heads(lm, heads)
    by_layer: dict[int, list[tuple[int, int, torch.Tensor | None]]] = defaultdict(list)
    for layer, head in dict.fromkeys(heads):
        by_layer[layer].append((1, head, None if mode == "mean" else torch.zeros(())))
    regs = [Registration(out_proj(lm, layer), "pre", z_editor(lm.info.n_heads, edits))
            for layer, edits in by_layer.items()]
    ids = record.input_ids  # (n,)
    rows = 2 if regs else 1  # nothing ablated: the clean row is also the "ablated" one
    with temporary_hooks(regs):
        out = logits(lm, ids[None].expand(rows, -1))  # (rows, n, V)
    logp = out.log_softmax(-1)
    clean, edited = logp[0], logp[rows - 1]  # (n, V) each; the same tensor when nothing is ablated
    kl = kl_divergence(clean, edited)  # (n,)
    before, after = clean.exp(), edited.exp()  # (n, V)
    top = after.topk(min(top_k, after.shape[-1]), dim=-1)
    strings = token_map(lm.tokenizer, top.indices.flatten().tolist() + ids[1:].tolist())
    result = []
    for pos in range(record.n):
        actual = None
        if pos + 1 < record.n:
            nxt = int(ids[pos + 1])
            actual = AblatedNext(nxt, strings[nxt], float(before[pos, nxt]), float(after[pos, nxt]))
        result.append(AblatedPosition(
            position=pos, kl=float(kl[pos]),
            top=[Candidate(int(i), strings[int(i)], float(p), float(before[pos, i]))
                 for i, p in zip(top.indices[pos], top.values[pos], strict=True)],
            actual_next=actual))
    return Ablation(heads=heads, mode=mode, positions=result)


def default_token(record: RunRecord, lm: LoadedModel, position: int) -> int:
    """The prompt's next token at ``position``, or the top prediction at the last position."""
    if position + 1 < record.n:
        return int(record.input_ids[position + 1])
    return int(logits(lm, record.input_ids[None], keep=1)[0, -1].argmax())


ScanJob = tuple[int, int]  # (layer, head); head -1 is the layer's MLP


def scan_jobs(lm: LoadedModel) -> list[ScanJob]:
    jobs = [(layer, head) for layer in range(lm.info.n_layers) for head in range(lm.info.n_heads)]
    return jobs + [(layer, -1) for layer in range(lm.info.n_layers)]


def scan_hooks(lm: LoadedModel, part: list[ScanJob], means: tuple[list[torch.Tensor], list[torch.Tensor]] | None,
               first_row: int = 1) -> list[Registration]:
    """Hooks that ablate job r in batch row r + first_row: zero, or the given (head z, MLP output) means."""
    z_edits: dict[int, list[tuple[int, int, torch.Tensor | None]]] = defaultdict(list)
    mlp_edits: dict[int, list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for row, (layer, head) in enumerate(part, start=first_row):
        if head >= 0:
            z_edits[layer].append((row, head, torch.zeros(()) if means is None else means[0][layer][head]))
        else:
            mlp_edits[layer].append((row, torch.zeros(()) if means is None else means[1][layer]))
    regs = [Registration(out_proj(lm, layer), "pre", z_editor(lm.info.n_heads, e)) for layer, e in z_edits.items()]
    return regs + [Registration(mlp_module(lm, layer), "post", output_editor(e)) for layer, e in mlp_edits.items()]


def scan_means(lm: LoadedModel, record: RunRecord) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each head's mean z (H, d_head) and each MLP's mean output (d,) over all the run's positions."""
    zs, _ = capture_z(lm, record.input_ids)  # L x (n, H, d_head)
    return [z.mean(0) for z in zs], [m.mean(0) for m in record.mlp_out]


def scan(lm: LoadedModel, record: RunRecord, position: int, token: int, mode: Mode) -> Scan:
    """The change in ln p(token) at ``position`` from ablating each head, and each MLP, alone.

    Causal models: position P sees tokens 0..P only, so the batch runs that prefix. The
    mean of a head (or MLP) is taken over all of the run's positions, as ``ablate`` does.
    """
    require_decoder(lm, "the ablation scan")
    if not 0 <= position < record.n:
        raise BadInput(f"position {position} is out of range: this run has positions 0..{record.n - 1}",
                       code="position_out_of_range", params={"position": position, "max": record.n - 1})
    n_layers, n_heads = lm.info.n_layers, lm.info.n_heads
    prefix = record.input_ids[: position + 1]  # (P+1,)
    jobs = scan_jobs(lm)
    deltas: list[float] = []
    base = float("nan")
    forwards = 0
    means = scan_means(lm, record) if mode == "mean" else None
    chunk = max(1, batch_size(lm, prefix.shape[0], 1) - 1)
    for start in range(0, len(jobs), chunk):
        part = jobs[start : start + chunk]
        with temporary_hooks(scan_hooks(lm, part, means)):  # row 0 stays clean
            logp = logits(lm, prefix[None].expand(len(part) + 1, -1), keep=1)[:, -1].log_softmax(-1)  # (B, V)
        forwards += 1
        base = float(logp[0, token])
        deltas.extend((logp[1:, token] - logp[0, token]).tolist())
    effects = torch.tensor(deltas, dtype=torch.float32)  # (L * H + L,): the heads, then the MLPs
    return Scan(position=position, token=TokenRef(token, token_map(lm.tokenizer, [token])[token]), mode=mode,
                logprob=base, effects=effects[: n_layers * n_heads].reshape(n_layers, n_heads),
                mlp=effects[n_layers * n_heads :], forwards=forwards)
