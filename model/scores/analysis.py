"""Numbers computed from captured activations: head scores, predictions, residual
stream statistics and the logit lens. Pure tensor code; no HTTP, no locking."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.load.models import LMHead

# The induction score counts only evidence of copying. A query i "repeats" when its token occurred
# earlier at some j whose next position j + 1 lies outside the query's own neighbourhood
# (j + 1 < i - INDUCTION_NEAR): a head that reads the last few tokens (previous-token, local heads)
# would otherwise score on any short repeat ("the dog and the cat": the token after the first "the"
# is two back). Over those queries, a head's score is the mean of its attention on the tokens
# right after the earlier copies (what an induction head reads, to copy it next) minus its attention
# on the copies themselves (the baseline: a head that reads the earlier text evenly, or the same
# token, puts as much on the copy as on its next token and scores about 0; a duplicate-token head
# scores below 0). With fewer than INDUCTION_MIN_QUERIES such queries the prompt holds too little
# evidence and the score is None (no badge): one repeated word is no proof of copying.
INDUCTION_NEAR = 3  # keys at most this far behind the query are its neighbourhood
INDUCTION_MIN_QUERIES = 4  # repeating queries needed for a score
INDUCTION_RULE = (f"mean over the queries whose token occurred earlier (at j, with j + 1 more than "
                  f"{INDUCTION_NEAR} positions back) of the attention on j + 1 minus the attention on j; "
                  f"null with fewer than {INDUCTION_MIN_QUERIES} such queries")


@dataclass(frozen=True)
class HeadScore:
    layer: int
    head: int
    entropy: Annotated[float | None, Field(description=(
        "mean row entropy, nats, exact over every row; null while pending (the run's scores_pending lists it)"))]
    prev_token: Annotated[float | None, Field(description=(
        "mean attention from token i to i-1, exact over every row; null while pending (the run's "
        "scores_pending lists it)"))]
    first_token: Annotated[float | None, Field(description=(
        "mean attention from token i to token 0 (sink), exact over every row; null while pending (the run's "
        "scores_pending lists it)"))]
    max: Annotated[float | None, Field(description=(
        "mean over rows of the largest weight, exact over every row; null while pending (the run's "
        "scores_pending lists it)"))]
    induction: Annotated[float | None, Field(description=(
        f"copying evidence: {INDUCTION_RULE} (the run's induction_queries counts them); null then, or while "
        "pending (the run's scores_pending lists it)"))]


# an accumulator's field -> the HeadScore field it fills
SCORE_NAMES = {"entropy": "entropy", "peak": "max", "prev": "prev_token", "first": "first_token",
               "induction": "induction"}


@dataclass(frozen=True)
class HeadSparsity:
    layer: int
    head: int
    top1: Annotated[float, Field(description="mean share of a row's mass on its largest key")]
    top5: Annotated[float, Field(description="mean share of a row's mass on its 5 largest keys")]
    keys_90: Annotated[float, Field(description="mean number of keys that hold 90% of a row's mass")]


def previous_token_weights(pattern: torch.Tensor) -> torch.Tensor:
    """(..., n, n) -> (..., n - 1): the attention from each query i >= 1 to key i - 1."""
    rows = torch.arange(1, pattern.shape[-1], device=pattern.device)
    return pattern[..., rows, rows - 1]


SCORE_FIELDS = ("entropy", "peak", "prev", "first", "induction")

def induction_queries(ids: torch.Tensor) -> int:
    """How many queries of a run (ids (n,)) count for the induction score."""
    return int(ScoreAccumulator(1, ids).has_copy(0, int(ids.shape[0])).sum())


class ScoreAccumulator:
    """Head scores of one layer, exact over every query row, fed a block of rows at a time.

    ``add(q0, weights)`` takes rows [q0, q0 + r) of every head's weights (H, r, n) over all n
    keys; nothing of size n x n is ever held. Induction pairs are found per block: key k is
    an induction target of query i when token k - 1 equals token i and k < i - ``INDUCTION_NEAR``; key
    k - 1 (the copy itself) is its baseline (``INDUCTION_RULE``).

    A forward through the fused kernel has no blocks: its scores come as per-head sums over every
    row (``add_sums``, from Q, K and lse: ``model.scores.pairs``), and ``todo`` names the fields
    still missing; ``add`` then computes only those.
    """

    def __init__(self, n_heads: int, ids: torch.Tensor) -> None:
        self.ids = ids  # (n,)
        self.n = int(ids.shape[0])
        zeros = torch.zeros(n_heads, dtype=torch.float64)
        self.entropy, self.peak, self.prev, self.first, self.induction = (zeros.clone() for _ in range(5))
        self.todo: set[str] = set(SCORE_FIELDS)
        self.induction_rows = 0
        # first position of each token id: query i has an earlier copy j with j + 1 outside its neighbourhood
        # (j + 1 < i - INDUCTION_NEAR) iff first[id] + 1 + INDUCTION_NEAR < i
        cpu = ids.cpu()
        self._first_seen = torch.full((int(cpu.max()) + 1 if len(cpu) else 1,), len(cpu), dtype=torch.long)
        self._first_seen.scatter_reduce_(0, cpu, torch.arange(len(cpu)), "amin")

    def add_sums(self, **sums: torch.Tensor) -> None:
        """Per-head sums over every row (H,) of some fields (``SCORE_FIELDS``), which are then done."""
        for field, value in sums.items():
            if field not in SCORE_FIELDS:
                raise ValueError(f"unknown head score {field!r}")
            getattr(self, field).add_(value.double().cpu())
            self.todo.discard(field)
            if field == "induction":
                self.induction_rows = int(self.has_copy(0, self.n).sum())

    def add(self, q0: int, weights: torch.Tensor, k0: int = 0) -> None:
        """weights: (H, r, w) float32 over keys [k0, k0 + w), zeros where masked; keys outside that
        range have weight 0 for these rows. Adds the fields in ``todo``."""
        w = weights.float()
        r, width = w.shape[1], w.shape[2]
        dev = w.device
        ids = self.ids.to(dev)
        if "entropy" in self.todo:
            self.entropy += (-torch.special.xlogy(w, w).sum((-1, -2))).double().cpu()
        if "peak" in self.todo:
            self.peak += w.amax(-1).sum(-1).double().cpu()
        rows = torch.arange(max(q0, 1), q0 + r, device=dev)  # queries i >= 1
        prev_ok = (rows - 1 >= k0) & (rows - 1 < k0 + width)
        if "prev" in self.todo and bool(prev_ok.any()):
            i = rows[prev_ok]
            self.prev += w[:, i - q0, i - 1 - k0].sum(-1).double().cpu()
        if "first" in self.todo and k0 == 0 and len(rows):
            self.first += w[:, rows - q0, 0].sum(-1).double().cpu()
        if "induction" not in self.todo:
            return
        keys = torch.arange(k0, k0 + width, device=dev)  # absolute key positions
        queries = torch.arange(q0, q0 + r, device=dev)
        before = ids[(keys - 1).clamp_min(0)]  # token k - 1 of each key k
        query_ids = ids[q0 : q0 + r, None]  # (r, 1)
        far = keys[None, :] + INDUCTION_NEAR < queries[:, None]  # (r, w): key k outside i's neighbourhood
        follows = (query_ids == before[None, :]) & (keys[None, :] >= 1) & far  # (r, w): k = j + 1
        copies = (query_ids == ids[keys][None, :]) & (keys[None, :] + 1 + INDUCTION_NEAR < queries[:, None])  # k = j
        # every query with an eligible earlier copy of its token (in or out of this key range)
        self.induction_rows += int(self.has_copy(q0, r).sum())
        if bool(follows.any()) or bool(copies.any()):
            signed = follows.to(w.dtype) - copies.to(w.dtype)  # (r, w): +1 on targets, -1 on their copies
            per_query = torch.einsum("hrk,rk->hr", w, signed)  # (H, r): 0 for rows without copies
            self.induction += per_query.sum(-1).double().cpu()

    def has_copy(self, q0: int, r: int) -> torch.Tensor:
        """(r,) bool: query i's token occurred at some j with j + 1 < i - INDUCTION_NEAR (it counts)."""
        ids = self.ids.cpu()[q0 : q0 + r]
        return self._first_seen[ids] + 1 + INDUCTION_NEAR < torch.arange(q0, q0 + r)

    def finish(self, layer: int, left: frozenset[str] = frozenset()) -> list[HeadScore]:
        """Every head's scores. ``left``: fields (``SCORE_FIELDS``) not computed here but later (a fused
        forward leaves them to ``model.runs.late``): None until then, never a partial sum."""
        n, m = self.n, max(self.n - 1, 1)
        out = []
        for h in range(len(self.entropy)):
            enough = self.induction_rows >= INDUCTION_MIN_QUERIES
            induction = float(self.induction[h] / self.induction_rows) if enough else None
            out.append(HeadScore(layer=layer, head=h,
                                 entropy=None if "entropy" in left else float(self.entropy[h] / n),
                                 prev_token=None if "prev" in left else float(self.prev[h] / m) if n > 1 else 0.0,
                                 first_token=None if "first" in left else float(self.first[h] / m) if n > 1 else 0.0,
                                 max=None if "peak" in left else float(self.peak[h] / n),
                                 induction=None if "induction" in left else induction))
        return out


def head_scores(layer: int, pattern: torch.Tensor, ids: torch.Tensor) -> list[HeadScore]:
    """Scores of every head of one layer from a whole pattern (H, n, n): exact over every row."""
    acc = ScoreAccumulator(pattern.shape[0], ids)
    acc.add(0, pattern.float())
    return acc.finish(layer)


class SparsityAccumulator:
    """How concentrated each head is, exactly over every row, fed a block of rows at a time.

    Keys for 90 %: a row's largest weights are read 64 at a time (``topk``); only a row whose 64
    largest hold less than the mass is sorted whole.
    """

    def __init__(self, n_heads: int, n: int, mass: float = 0.9) -> None:
        self.n, self.mass = n, mass
        self.top1 = torch.zeros(n_heads, dtype=torch.float64)
        self.top5 = torch.zeros(n_heads, dtype=torch.float64)
        self.keys = torch.zeros(n_heads, dtype=torch.float64)

    def add(self, weights: torch.Tensor) -> None:
        """weights: (H, r, n) float32."""
        w = weights.float()
        k = min(64, w.shape[-1])
        top = w.topk(k, dim=-1).values  # (H, r, k) descending
        cum = top.cumsum(-1)
        self.top1 += top[..., 0].sum(-1).double().cpu()
        self.top5 += cum[..., min(5, k) - 1].sum(-1).double().cpu()
        reached = cum[..., -1] >= self.mass - 1e-6  # (H, r): the 64 largest hold the mass
        keys = ((cum < self.mass - 1e-6).sum(-1) + 1).double()  # (H, r), right where reached
        if not bool(reached.all()):
            rest = w[~reached].sort(dim=-1, descending=True).values.cumsum(-1)  # (m, n)
            keys[~reached] = ((rest < self.mass - 1e-6).sum(-1) + 1).double()
        self.keys += keys.sum(-1).cpu()

    def finish(self, layer: int) -> list[HeadSparsity]:
        return [HeadSparsity(layer=layer, head=h, top1=float(self.top1[h] / self.n),
                             top5=float(self.top5[h] / self.n), keys_90=float(self.keys[h] / self.n))
                for h in range(len(self.top1))]


def head_sparsity(layer: int, pattern: torch.Tensor, mass: float = 0.9) -> list[HeadSparsity]:
    """How concentrated each head is, exactly, over every query row. pattern: (H, n, n)."""
    acc = SparsityAccumulator(pattern.shape[0], pattern.shape[-1], mass)
    acc.add(pattern)
    return acc.finish(layer)


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
    return predictions_by_block(lambda a, b: logits[a:b], logits.shape[0], ids, k)


# The LM head is applied to this many bytes of logits at a time: its weight is read once per block (SmolLM2's
# 1,024 positions: 64-row blocks 327 ms of head, 682-row blocks (128 MiB) 224 ms; the next-token analysis
# 505 -> 394 ms in all, the 64-row code beside it in one process, medians of 6).
# Each block is then read in slices of at most SLICE_BYTES, whose temporaries stay under glibc's 32 MiB mmap
# threshold and in cache (256-row slices of SmolLM2's 49,152 logits took 2-3x the time of 64-row slices for the
# same reads).
BLOCK_BYTES = 128 << 20
SLICE_BYTES = 8 << 20


def block_rows(vocab: int, nbytes: int) -> int:
    """Rows of float32 logits over ``vocab`` that fit ``nbytes`` (at least one)."""
    return max(1, nbytes // (4 * vocab))


def predictions_by_block(block_logits: Callable[[int, int], torch.Tensor], n: int, ids: torch.Tensor, k: int,
                         vocab: int | None = None) -> list[Prediction]:
    """Next-token distribution at every position, the logits of a block of positions at a time.

    ``block_logits(a, b)`` gives the (b - a, V) logits of positions [a, b) (the model's own,
    or the LM head applied to the kept final residual): the (n, V) logits are never whole, a block
    holds at most ``BLOCK_BYTES`` (``vocab``: V, if the caller knows it; else read from the first block).
    Works on logits and one log-sum-exp per row rather than a full softmax, a slice of
    ``SLICE_BYTES`` at a time so that each slice stays in cache while it is read; the true next
    token's rank comes from the top-k where it is among them, and is counted over the vocabulary
    only where it is not.
    """
    top_ids, top_p, next_p, ranks = [], [], [], []
    ids = ids.cpu()
    nxt = torch.cat([ids[1:], ids[:1]])  # (n,): the last row's "next" is a placeholder, dropped below
    rows = block_rows(vocab, BLOCK_BYTES) if vocab is not None else 1
    start = 0
    while start < n:
        block = block_logits(start, min(n, start + rows)).float()  # (c, V)
        if vocab is None:  # the first block was one row: the vocabulary sizes the rest
            vocab = block.shape[-1]
            rows = block_rows(vocab, BLOCK_BYTES)
        step = block_rows(block.shape[-1], SLICE_BYTES)
        for s in range(0, block.shape[0], step):
            e = min(s + step, block.shape[0])
            i_d, p, q, r = _next_token(block[s:e], nxt[start + s : start + e], k)
            top_ids.append(i_d)
            top_p.append(p)
            next_p.append(q)
            ranks.append(r)
        start += block.shape[0]
    if not top_ids:
        return []
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


def _next_token(logits: torch.Tensor, nxt: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """One slice: logits (c, V), the next ids (c,) -> top-k ids (c, k), their probabilities (c, k), the next
    token's probability (c,) and rank (c,: 1 = the model's top choice, 1 + the logits strictly above it)."""
    kk = min(k, logits.shape[-1])
    top = logits.topk(kk, dim=-1)  # (c, kk) descending
    peak = top.values[:, :1]  # (c, 1): each row's largest logit, the log-sum-exp's shift
    lse = peak + (logits - peak).exp_().sum(-1, keepdim=True).log_()  # (c, 1); logsumexp's passes, less one
    target = logits.gather(1, nxt[:, None].to(logits.device))  # (c, 1)
    # every logit above the target is in the top-k where the target is not below the k-th: count them there
    inside = (target[:, 0] >= top.values[:, -1]) | (kk == logits.shape[-1])  # (c,)
    rank = (top.values > target).sum(-1) + 1  # (c,)
    if not bool(inside.all()):
        out = ~inside
        rank[out] = (logits[out] > target[out]).sum(-1) + 1
    return (top.indices.cpu(), (top.values - lse).exp().cpu(), (target - lse).exp()[:, 0].cpu(), rank.cpu())


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-8)


@dataclass(frozen=True)
class ResidualLayer:
    layer: int
    resid_norm: Annotated[list[float], Field(description="‖resid_post‖ per token")]
    cos_prev: Annotated[list[float], Field(description="cosine(resid_post, resid_pre) per token")]
    attn_norm: Annotated[list[float], Field(description="‖attention sublayer output‖ per token")]
    mlp_norm: Annotated[list[float], Field(description="‖MLP sublayer output‖ per token")]


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

    Returns top-k (probs, ids), each (S, n, k). One stage and 256 positions at a time: the
    logits in memory are (256, V) whatever n is.
    """
    probs_out, ids_out = [], []
    with torch.inference_mode():
        for stage in resid:
            top_p, top_i = [], []
            for start in range(0, stage.shape[0], 256):  # (256, V) logits at a time, whatever n is
                p = head.logits(stage[start : start + 256]).softmax(-1)  # (rows, V)
                top = p.topk(k, dim=-1)
                top_p.append(top.values)
                top_i.append(top.indices)
            probs_out.append(torch.cat(top_p))
            ids_out.append(torch.cat(top_i))
    return torch.stack(probs_out), torch.stack(ids_out)
