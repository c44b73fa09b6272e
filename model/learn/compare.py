"""Learn §6, "Position information", its experiment with order: the same tokens in another order.
Per token, the cosine of its hidden states in two runs at every stage; per head, how much the
attention changes. Both read what the two runs kept (no forward)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.attention.kept import LayerAttention


@dataclass(frozen=True, slots=True)
class TokenMatch:
    """Token ``a`` of prompt A and the same token id in prompt B (``b``, None where B lacks it)."""

    a: int
    b: Annotated[int | None, Field(description=(
        "the position of the same token id in prompt B (None: B does not have it)"))]
    token: str  # token a's display string
    cos: Annotated[float | None, Field(description=(
        "cosine of the final hidden states of the same token in both prompts"))]
    cos_by_stage: Annotated[list[float], Field(description=(
        "the same cosine at every stage: embedding + position, then after each block"))]


@dataclass(frozen=True, slots=True)
class HeadDiff:
    layer: int
    head: int
    diff: Annotated[float, Field(description=(
        "mean total-variation distance between A's and B's attention rows, position by position"))]


def hidden_similarity(a_ids: list[int], a_resid: list[torch.Tensor], b_ids: list[int],
                      b_resid: list[torch.Tensor], a_tokens: list[str]) -> list[TokenMatch]:
    """For each token of prompt A, the same token (same id) in prompt B, matched in order of
    occurrence, and the cosine of its hidden states at every stage (embedding + position,
    then after each block). ``dog`` and `` dog`` are different ids and are not matched.
    a_resid, b_resid: per stage (n, d); a_tokens: A's display strings."""
    used: set[int] = set()
    out = []
    for i, tid in enumerate(a_ids):
        j = next((j for j, u in enumerate(b_ids) if u == tid and j not in used), None)
        stages: list[float] = []
        if j is not None:
            used.add(j)
            stages = [float(torch.nn.functional.cosine_similarity(ha[i].float(), hb[j].float(), dim=0))
                      for ha, hb in zip(a_resid, b_resid, strict=True)]
        out.append(TokenMatch(a=i, b=j, token=a_tokens[i], cos=stages[-1] if stages else None, cos_by_stage=stages))
    return out


def attention_differences(a_layers: list[LayerAttention], b_layers: list[LayerAttention]) -> list[HeadDiff]:
    """Per head: the mean |A - B| of two runs' attention, position by position, over the query
    rows both runs have (cells past a row's end are zero in both). Rebuilt a block of rows at a
    time from each run's kept Q and K: never a whole n x n."""
    out: list[HeadDiff] = []
    for layer, (la, lb) in enumerate(zip(a_layers, b_layers, strict=True)):
        n = min(la.n, lb.n)
        total = torch.zeros(la.n_heads, dtype=torch.float64)
        step = min(la.block_rows(), lb.block_rows())
        for q0 in range(0, n, step):
            q1 = min(n, q0 + step)
            wa, wb = la.weights(q0, q1)[0][..., :n], lb.weights(q0, q1)[0][..., :n]  # (H, r, n)
            total += (wa - wb).abs().sum(-1).sum(-1).double().cpu()
        rows = total / max(n, 1) / 2  # (H,): total-variation distance per row, averaged
        out.extend(HeadDiff(layer=layer, head=h, diff=float(rows[h])) for h in range(rows.shape[0]))
    return out


def block_bytes(layers: list[LayerAttention]) -> int:
    """What ``attention_differences`` holds at once: both runs' weights for one block of rows, and their
    difference (float32, CHUNK_CELLS each at most, with their visible masks)."""
    if not layers:
        return 0
    cells = max(la.block_rows() * la.n * la.n_heads for la in layers)
    return 4 * 4 * cells
