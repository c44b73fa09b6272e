"""Head scores from a layer's Q, K and row normalisers, without a block of weights.

A forward through the fused kernel (``model.capture.flash_attention``) never holds a weight; it
returns each row's log-sum-exp ``lse``. A single weight is then one dot product away:
p(i, j) = exp(z(i, j) - lse(i)), z the family's logit (q_i . k_j x scaling, soft-capped). So:

* previous-token and first-token: the n weights (i, i - 1) and (i, 0): O(n d);
* induction: only the (query i, key k) pairs with token k - 1 == token i and k < i, enumerated once
  per run by grouping positions by token id (``InductionPairs``): O(pairs x d). A token with few
  copies contributes its pairs to one flat list; a token with many (one repeated token makes n²/2
  pairs) is computed as a dense block of its own queries x its own keys, a chunk of rows at a time,
  so memory stays bounded whatever the text;
* entropy and peak (the row's largest weight) need every visible cell: ``entropy_and_peak`` sweeps
  them once more, exactly, right after the forward. Entropy uses H_i = lse_i - sum_j p_ij z_ij and
  sum_j p_ij z_ij = scaling x q_i . (P K)_i, where P K is the fused kernel run with the keys as values
  (no log per cell); the peak is exp(max_j z_ij - lse_i), the row's largest logit from tiled
  matmuls (no exp per cell).

These hold where every pair above is visible: a causal mask over the whole sequence (or no mask),
no per-key bias, and for the fused sweep no soft-cap. Other layers keep the block path
(``model.capture``, ``ScoreAccumulator.add``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.capture import BLOCK_CELLS, flash_attention

PAIR_CHUNK = 1 << 15  # pairs whose (H, pairs, dh) gathered queries and keys are held at once
SMALL_GROUP = 32  # a token with at most this many copies gives its pairs to the flat list


def _logits(z: torch.Tensor, scaling: float, softcap: float | None) -> torch.Tensor:
    """q.k dot products -> the family's logits (scale, then soft-cap), in place."""
    z.mul_(scaling)
    if softcap is not None:
        z = torch.tanh(z.div_(softcap)).mul_(softcap)
    return z


def pair_weights(
    q: torch.Tensor,  # (H, n, dh) post-rotary queries
    k: torch.Tensor,  # (Hkv, n, dh) post-rotary keys, K/V heads
    lse: torch.Tensor,  # (H, n) row normalisers
    queries: torch.Tensor,  # (P,) long
    keys: torch.Tensor,  # (P,) long, each visible to its query
    *,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """(H, P) float32: the weight of each (query, key) pair, exp(logit - lse) from one dot product each."""
    groups = q.shape[0] // k.shape[0]
    hkv, dh = k.shape[0], k.shape[-1]
    out = torch.empty(q.shape[0], len(queries), dtype=torch.float32, device=q.device)
    for a in range(0, len(queries), PAIR_CHUNK):
        qi, kj = queries[a : a + PAIR_CHUNK], keys[a : a + PAIR_CHUNK]
        qs = q[:, qi].float().view(hkv, groups, len(qi), dh)  # (Hkv, g, p, dh): head h reads K/V head h // g
        ks = k[:, kj].float()[:, None]  # (Hkv, 1, p, dh)
        z = _logits((qs * ks).sum(-1).view(-1, len(qi)), scaling, softcap)  # (H, p)
        out[:, a : a + len(qi)] = (z - lse[:, qi]).exp()
    return out


@dataclass(frozen=True)
class InductionPairs:
    """Every (query i, key k) with token k - 1 == token i and k < i, grouped by token.

    ``queries``/``keys`` (P,) hold the pairs of tokens with few copies; ``groups`` the positions
    (ascending) of each token with more than ``SMALL_GROUP`` copies: its pairs are the j + 1 < i of
    those positions, computed as a block."""

    queries: torch.Tensor  # (P,) long
    keys: torch.Tensor  # (P,) long
    groups: list[torch.Tensor]  # each (m,) long, ascending

    @staticmethod
    def of(ids: torch.Tensor) -> InductionPairs:
        """From the run's token ids (n,): O(n x SMALL_GROUP) to enumerate, O(pairs) to hold."""
        ids = ids.cpu()
        order = torch.sort(ids, stable=True).indices  # positions grouped by token, ascending inside each
        tokens = ids[order]
        _, counts = torch.unique_consecutive(tokens, return_counts=True)
        size = counts.repeat_interleave(counts)  # (n,): the size of each sorted position's group
        small = size <= SMALL_GROUP
        queries, keys = [], []
        for d in range(1, min(SMALL_GROUP, len(ids))):  # copy j, then the d-th next copy i of one token
            same = (tokens[d:] == tokens[:-d]) & small[d:]
            i, j = order[d:][same], order[:-d][same]
            ok = j + 1 < i  # key j + 1 strictly before the query
            queries.append(i[ok])
            keys.append(j[ok] + 1)
        starts = torch.cumsum(counts, 0) - counts
        groups = [order[int(s) : int(s) + int(c)] for s, c in zip(starts, counts, strict=True) if c > SMALL_GROUP]
        empty = torch.empty(0, dtype=torch.long)
        return InductionPairs(queries=torch.cat(queries) if queries else empty,
                              keys=torch.cat(keys) if keys else empty, groups=groups)

    @property
    def count(self) -> int:
        """How many pairs there are in all."""
        dense = sum(int(((g[:, None] + 1) < g[None, :]).sum()) for g in self.groups)
        return len(self.queries) + dense


def induction_sums(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    lse: torch.Tensor,  # (H, n)
    pairs: InductionPairs,
    *,
    scaling: float,
    softcap: float | None,
    cells: int = BLOCK_CELLS,
) -> torch.Tensor:
    """(H,) float64: each head's attention on induction targets, summed over every query."""
    dev = q.device
    total = torch.zeros(q.shape[0], dtype=torch.float64)
    if len(pairs.queries):
        w = pair_weights(q, k, lse, pairs.queries.to(dev), pairs.keys.to(dev), scaling=scaling, softcap=softcap)
        total += w.double().sum(-1).cpu()
    groups = q.shape[0] // k.shape[0]
    hkv, dh = k.shape[0], k.shape[-1]
    for positions in pairs.groups:  # a token with many copies: its queries x its keys, a chunk of rows at a time
        pos = positions.to(dev)
        m = len(pos)
        keys = k[:, pos[:-1] + 1].float()  # (Hkv, m - 1, dh): key j + 1 after each copy j but the last
        rows = max(1, cells // max(1, q.shape[0] * m))
        for a in range(1, m, rows):  # the first copy has no earlier one
            b = min(m, a + rows)
            qs = q[:, pos[a:b]].float().view(hkv, groups * (b - a), dh)  # (Hkv, g r, dh)
            z = _logits(torch.matmul(qs, keys[:, : b - 1].transpose(-1, -2)), scaling, softcap)  # copies j < i
            z = z.view(-1, b - a, b - 1)  # (H, r, b - 1)
            follows = (pos[None, : b - 1] + 1) < pos[a:b, None]  # (r, b - 1): key j + 1 before query i
            w = (z - lse[:, pos[a:b], None]).exp_().masked_fill_(~follows, 0.0)
            total += w.double().sum((-1, -2)).cpu()
    return total


def prev_first_sums(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    lse: torch.Tensor,  # (H, n)
    *,
    scaling: float,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H,) float64 each: the weights (i, i - 1) and (i, 0) summed over the queries i >= 1."""
    n = q.shape[1]
    if n < 2:
        zero = torch.zeros(q.shape[0], dtype=torch.float64)
        return zero, zero.clone()
    rows = torch.arange(1, n, device=q.device)
    both = pair_weights(q, k, lse, torch.cat([rows, rows]), torch.cat([rows - 1, torch.zeros_like(rows)]),
                        scaling=scaling, softcap=softcap).double()  # (H, 2 (n - 1))
    return both[:, : n - 1].sum(-1).cpu(), both[:, n - 1 :].sum(-1).cpu()


def row_max_logits(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    scaling: float,
    rows: int = 128,
    cols: int = 256,
) -> torch.Tensor:
    """(H, n) float32: each causal row's largest logit q_i . k_j x scaling over j <= i (scaling > 0).

    Tiles of (Hkv, g x rows, cols) logits (256 KiB for 2 K/V heads of 2 queries each) stay in cache and
    are written into one buffer; only the diagonal tile is masked."""
    n_heads, n, dh = q.shape
    hkv = k.shape[0]
    g = n_heads // hkv
    dev = q.device
    best = torch.full((hkv, g, n), float("-inf"), dtype=torch.float32, device=dev)
    future = torch.ones(rows, rows, dtype=torch.bool, device=dev).triu(1)  # (r, r): key after query
    kt = k.float().transpose(-1, -2).contiguous()  # (Hkv, dh, n)
    tile = torch.empty(hkv, g * rows, cols, dtype=torch.float32, device=dev)
    tile_max = torch.empty(hkv, g * rows, dtype=torch.float32, device=dev)
    for q0 in range(0, n, rows):
        q1 = min(n, q0 + rows)
        r = q1 - q0
        qs = q[:, q0:q1].float().reshape(hkv, g * r, dh)  # (Hkv, g r, dh)
        m = best[:, :, q0:q1]  # (Hkv, g, r) view
        s, s_max = tile[:, : g * r], tile_max[:, : g * r]
        whole = q0 - q0 % cols  # keys [0, whole) in full tiles, [whole, q0) in a narrower one
        for c0 in range(0, whole, cols):
            torch.bmm(qs, kt[:, :, c0 : c0 + cols], out=s)  # (Hkv, g r, cols)
            torch.amax(s, -1, out=s_max)
            torch.maximum(m, s_max.view(hkv, g, r), out=m)
        if whole < q0:
            torch.maximum(m, torch.bmm(qs, kt[:, :, whole:q0]).amax(-1).view(hkv, g, r), out=m)
        diagonal = torch.bmm(qs, kt[:, :, q0:q1]).view(hkv, g, r, r)
        diagonal.masked_fill_(future[:r, :r], float("-inf"))
        torch.maximum(m, diagonal.amax(-1), out=m)
    return best.view(n_heads, n).mul_(scaling)


def entropy_and_peak(
    q: torch.Tensor,  # (H, n, dh) float32 on the CPU
    k: torch.Tensor,  # (Hkv, n, dh)
    lse: torch.Tensor,  # (H, n)
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H,) float64 each: the row entropies and the rows' largest weights, summed over every row of a
    causal layer with plain dot-product logits (no soft-cap, no bias): exact, without a log per cell.

    H_i = lse_i - sum_j p_ij z_ij, and sum_j p_ij z_ij = scaling x q_i . (P K)_i: the fused kernel with
    the keys as values gives P K."""
    pk, _ = flash_attention(q[None], k[None], k[None], scaling, True)  # (1, H, n, dh)
    mean_logit = (q * pk[0]).sum(-1).mul_(scaling)  # (H, n)
    entropy = (lse - mean_logit).double().sum(-1)
    peak = (row_max_logits(q, k, scaling) - lse).exp().double().sum(-1)
    return entropy.cpu(), peak.cpu()
