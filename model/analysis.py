"""Numbers computed from captured activations: head scores, predictions, residual
stream statistics and the logit lens. Pure tensor code; no HTTP, no locking."""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS = 1e-12


@dataclass(frozen=True)
class HeadScore:
    layer: int
    head: int
    entropy: float  # mean over query rows of the row's entropy, nats
    prev_token: float  # mean attention from i to i-1 (i >= 1)
    first_token: float  # mean attention from i to token 0 (i >= 1): the "sink"
    max: float  # mean over rows of the largest weight: how peaked the head is
    induction: float | None  # mean attention to the token after an earlier copy; None if no repeats
    top1: float  # mean share of a row's mass on its largest key
    top5: float  # ... on its 5 largest keys
    keys_90: float  # mean number of keys that hold 90% of a row's mass


def induction_targets(ids: torch.Tensor) -> list[tuple[int, list[int]]]:
    """Queries i whose token occurred earlier (at j), with the keys j+1 that followed.

    An induction head at position i attends to the token that *followed* an earlier
    occurrence of token i ([A][B] ... [A] -> attend to [B]).
    """
    seen: dict[int, list[int]] = {}
    targets: list[tuple[int, list[int]]] = []
    for i, tok in enumerate(ids.tolist()):
        earlier = [j + 1 for j in seen.get(tok, []) if j + 1 < i]
        if earlier:
            targets.append((i, earlier))
        seen.setdefault(tok, []).append(i)
    return targets


def head_scores(layer: int, pattern: torch.Tensor, ids: torch.Tensor) -> list[HeadScore]:
    """Scores of every head of one layer. pattern: (H, n, n) float32, rows sum to 1."""
    n_heads, n, _ = pattern.shape
    entropy = -(pattern * (pattern + EPS).log()).sum(-1).mean(-1)  # (H,)
    if n > 1:
        rows = torch.arange(1, n)
        prev = pattern[:, rows, rows - 1].mean(-1)  # (H,)
        first = pattern[:, 1:, 0].mean(-1)  # (H,)
    else:
        prev = first = torch.zeros(n_heads)
    peak = pattern.amax(-1).mean(-1)  # (H,)
    k = min(5, n)
    top = pattern.topk(k, dim=-1).values  # (H, n, k)
    top1 = top[..., 0].mean(-1)
    top5 = top.sum(-1).mean(-1)
    keys_90 = _keys_for_mass(pattern, 0.9)  # (H,)
    targets = induction_targets(ids)
    induction: list[float | None] = [None] * n_heads
    if targets:
        q = torch.tensor([i for i, ks in targets for _ in ks])
        kk = torch.tensor([j for _, ks in targets for j in ks])
        per_target = torch.zeros(n_heads, len(targets))
        # sum over all earlier copies of a query's token, then average over queries
        owner = torch.tensor([t for t, (_, ks) in enumerate(targets) for _ in ks])
        per_target.index_add_(1, owner, pattern[:, q, kk])
        induction = per_target.mean(-1).tolist()
    return [
        HeadScore(layer=layer, head=h, entropy=float(entropy[h]), prev_token=float(prev[h]),
                  first_token=float(first[h]), max=float(peak[h]), induction=induction[h],
                  top1=float(top1[h]), top5=float(top5[h]), keys_90=float(keys_90[h]))
        for h in range(n_heads)
    ]


def _keys_for_mass(pattern: torch.Tensor, mass: float) -> torch.Tensor:
    """(H, n, n) -> (H,): mean over rows of how many largest keys reach ``mass``."""
    n = pattern.shape[-1]
    k = min(n, 64)  # rows needing more than 64 keys are counted exactly below
    top = pattern.topk(k, dim=-1).values.cumsum(-1)  # (H, n, k)
    reached = top >= mass - 1e-6
    count = torch.where(reached.any(-1), reached.float().argmax(-1) + 1, torch.full(top.shape[:2], -1.0))
    need_full = count < 0
    if need_full.any():
        rows = pattern[need_full]  # (m, n): only the diffuse rows are sorted
        full = rows.sort(dim=-1, descending=True).values.cumsum(-1)
        count[need_full] = ((full < mass - 1e-6).sum(-1) + 1).float()
    return count.float().mean(-1)


@dataclass(frozen=True)
class Prediction:
    position: int
    top_ids: list[int]
    top_probs: list[float]
    next_id: int | None
    next_prob: float | None
    next_rank: int | None  # 1 = the model's top choice


def predictions(logits: torch.Tensor, ids: torch.Tensor, k: int) -> list[Prediction]:
    """Next-token distribution at every position of one forward. logits: (n, V)."""
    probs = logits.float().softmax(-1)  # (n, V)
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    n = probs.shape[0]
    nxt = ids[1:]  # (n-1,)
    next_p = probs[torch.arange(n - 1), nxt] if n > 1 else torch.zeros(0)
    ranks = (probs[: n - 1] > next_p[:, None]).sum(-1) + 1 if n > 1 else torch.zeros(0, dtype=torch.long)
    out = []
    for i in range(n):
        has_next = i < n - 1
        out.append(Prediction(
            position=i, top_ids=top.indices[i].tolist(), top_probs=top.values[i].tolist(),
            next_id=int(nxt[i]) if has_next else None,
            next_prob=float(next_p[i]) if has_next else None,
            next_rank=int(ranks[i]) if has_next else None,
        ))
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-8)


@dataclass(frozen=True)
class ResidualLayer:
    layer: int
    resid_norm: list[float]  # ‖resid_post‖ per token
    cos_prev: list[float]  # cos(resid_post, resid_pre) per token
    attn_norm: list[float]  # ‖attn_out‖ per token
    mlp_norm: list[float]  # ‖mlp_out‖ per token


def residual_stats(resid: torch.Tensor, attn_out: torch.Tensor, mlp_out: torch.Tensor) -> list[ResidualLayer]:
    """resid: (L+1, n, d); attn_out, mlp_out: (L, n, d)."""
    norms = resid.norm(dim=-1)  # (L+1, n)
    cos = cosine(resid[1:], resid[:-1])  # (L, n)
    a = attn_out.float().norm(dim=-1)
    m = mlp_out.float().norm(dim=-1)
    return [
        ResidualLayer(layer=i, resid_norm=norms[i + 1].tolist(), cos_prev=cos[i].tolist(),
                      attn_norm=a[i].tolist(), mlp_norm=m[i].tolist())
        for i in range(attn_out.shape[0])
    ]


def logit_lens(
    resid: torch.Tensor,  # (S, n, d) residual states to read
    final_norm: torch.nn.Module | None,
    unembed: torch.nn.Module,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Push residual states through the final norm and the LM head.

    Returns top-k (probs, ids), each (S, n, k). Run one stage at a time to keep the
    (n, V) logits of only one stage in memory.
    """
    probs_out, ids_out = [], []
    with torch.inference_mode():
        for stage in resid:
            h = final_norm(stage) if final_norm is not None else stage  # (n, d)
            p = unembed(h).float().softmax(-1)  # (n, V)
            top = p.topk(k, dim=-1)
            probs_out.append(top.values)
            ids_out.append(top.indices)
    return torch.stack(probs_out), torch.stack(ids_out)
