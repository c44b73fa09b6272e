"""Numbers computed from captured activations: head scores, predictions, residual
stream statistics and the logit lens. Pure tensor code; no HTTP, no locking."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.loading import LMHead


@dataclass(frozen=True)
class HeadScore:
    layer: int
    head: int
    entropy: float  # mean over query rows of the row's entropy, nats
    prev_token: float  # mean attention from i to i-1 (i >= 1)
    first_token: float  # mean attention from i to token 0 (i >= 1): the "sink"
    max: float  # mean over rows of the largest weight: how peaked the head is
    induction: float | None  # mean attention to the token after an earlier copy; None if no repeats


@dataclass(frozen=True)
class HeadSparsity:
    layer: int
    head: int
    top1: float  # mean share of a row's mass on its largest key
    top5: float  # ... on its 5 largest keys
    keys_90: float  # mean number of keys that hold 90% of a row's mass


def induction_pairs(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries, keys): key j+1 for every earlier occurrence j of query i's token (j+1 < i).

    An induction head at position i attends to the token that *followed* an earlier
    occurrence of token i ([A][B] ... [A] -> attend to [B]).
    """
    n = ids.shape[0]
    same = ids[:, None] == ids[None, :]  # (n, n): same[i, j] = token i is token j
    follows = torch.zeros(n, n, dtype=torch.bool, device=ids.device)
    follows[:, 1:] = same[:, :-1]  # follows[i, k]: token k-1 equals token i
    follows &= torch.ones(n, n, dtype=torch.bool, device=ids.device).tril(-1)  # key k < query i
    q, k = follows.nonzero(as_tuple=True)
    return q, k


SAMPLE_ROWS = 128


def previous_token_weights(pattern: torch.Tensor) -> torch.Tensor:
    """(..., n, n) -> (..., n - 1): the attention from each query i >= 1 to key i - 1."""
    rows = torch.arange(1, pattern.shape[-1], device=pattern.device)
    return pattern[..., rows, rows - 1]


def sample_rows(n: int, most: int = SAMPLE_ROWS) -> torch.Tensor:
    """Evenly spaced query rows (all of them when n <= most), the last one included."""
    if n <= most:
        return torch.arange(n)
    picked: torch.Tensor = torch.unique(torch.linspace(0, n - 1, most).round().long())
    return picked


def head_scores(layer: int, pattern: torch.Tensor, ids: torch.Tensor) -> list[HeadScore]:
    """Scores of every head of one layer, cheap enough for every run. pattern: (H, n, n).

    prev_token, first_token and induction read every query row (they are gathers);
    entropy and max need whole rows, so for prompts longer than SAMPLE_ROWS they
    average over that many evenly spaced rows: analysis stays a small fraction of the
    forward pass at n = 1,024.
    """
    pattern = pattern.float()  # analysis maths in float32, whatever the model's dtype
    ids = ids.to(pattern.device)
    n_heads, n, _ = pattern.shape
    sub = pattern if n <= SAMPLE_ROWS else pattern[:, sample_rows(n).to(pattern.device)]  # (H, S, n)
    entropy = -torch.special.xlogy(sub, sub).sum(-1).mean(-1)  # (H,)
    peak = sub.amax(-1).mean(-1)  # (H,)
    if n > 1:
        prev = previous_token_weights(pattern).mean(-1)  # (H,)
        first = pattern[:, 1:, 0].mean(-1)  # (H,)
    else:
        prev = first = torch.zeros(n_heads, device=pattern.device)
    q, k = induction_pairs(ids)
    induction: list[float | None] = [None] * n_heads
    if len(q):
        # sum over all earlier copies of a query's token, then average over those queries
        per_query = torch.zeros(n_heads, n, device=pattern.device).index_add_(1, q, pattern[:, q, k])  # (H, n)
        induction = per_query[:, torch.unique(q)].mean(-1).tolist()
    return [
        HeadScore(layer=layer, head=h, entropy=float(entropy[h]), prev_token=float(prev[h]),
                  first_token=float(first[h]), max=float(peak[h]), induction=induction[h])
        for h in range(n_heads)
    ]


def head_sparsity(layer: int, pattern: torch.Tensor, mass: float = 0.9) -> list[HeadSparsity]:
    """How concentrated each head is, exactly, over every query row. pattern: (H, n, n)."""
    ordered = pattern.float().sort(dim=-1, descending=True).values  # (H, n, n)
    cum = ordered.cumsum(-1)
    top1 = ordered[..., 0].mean(-1)
    top5 = cum[..., min(5, pattern.shape[-1]) - 1].mean(-1)
    keys = ((cum < mass - 1e-6).sum(-1) + 1).float().mean(-1)  # (H,)
    return [HeadSparsity(layer=layer, head=h, top1=float(top1[h]), top5=float(top5[h]), keys_90=float(keys[h]))
            for h in range(pattern.shape[0])]


@dataclass(frozen=True)
class Prediction:
    position: int
    top_ids: list[int]
    top_probs: list[float]
    next_id: int | None
    next_prob: float | None
    next_rank: int | None  # 1 = the model's top choice


def predictions(logits: torch.Tensor, ids: torch.Tensor, k: int, chunk: int = 64) -> list[Prediction]:
    """Next-token distribution at every position of one forward. logits: (n, V).

    Works on logits and one logsumexp per row rather than a full softmax, a block of
    rows at a time so that each block stays in cache while it is read three times
    (logsumexp, top-k, the rank of the true next token).
    """
    logits = logits.float()
    ids = ids.to(logits.device)
    n = logits.shape[0]
    k = min(k, logits.shape[-1])
    nxt = torch.cat([ids[1:], ids[:1]])  # (n,): the last row's "next" is a placeholder, dropped below
    top_ids, top_p, next_p, ranks = [], [], [], []
    for start in range(0, n, chunk):
        block = logits[start : start + chunk]  # (c, V)
        lse = block.logsumexp(-1, keepdim=True)  # (c, 1)
        top = block.topk(k, dim=-1)
        target = block.gather(1, nxt[start : start + chunk, None])  # (c, 1)
        top_ids.append(top.indices)
        top_p.append((top.values - lse).exp())
        next_p.append((target - lse).exp()[:, 0])
        ranks.append((block > target).sum(-1) + 1)
    top_id_list, top_p_list = torch.cat(top_ids).tolist(), torch.cat(top_p).tolist()
    next_list, rank_list, next_ids = torch.cat(next_p).tolist(), torch.cat(ranks).tolist(), nxt.tolist()
    out = []
    for i in range(n):
        has_next = i < n - 1
        out.append(Prediction(
            position=i, top_ids=top_id_list[i], top_probs=top_p_list[i],
            next_id=next_ids[i] if has_next else None,
            next_prob=next_list[i] if has_next else None,
            next_rank=rank_list[i] if has_next else None,
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
    head: LMHead,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read residual states as the model reads its last one: ``to_logits`` applies the final
    norm, the LM head and the family's final logit transform ((n, d) -> (n, V) float32).

    Returns top-k (probs, ids), each (S, n, k). Run one stage at a time to keep the
    (n, V) logits of only one stage in memory.
    """
    probs_out, ids_out = [], []
    with torch.inference_mode():
        for stage in resid:
            p = head.logits(stage).softmax(-1)  # (n, V)
            top = p.topk(k, dim=-1)
            probs_out.append(top.values)
            ids_out.append(top.indices)
    return torch.stack(probs_out), torch.stack(ids_out)
