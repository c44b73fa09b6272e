"""Head scores from a layer's Q, K and row normalisers, without a block of weights.

A forward through the fused kernel (``model.attention.interface.flash_attention``) never holds a weight; it
returns each row's log-sum-exp ``lse``. A single weight is then one dot product away:
p(i, j) = exp(z(i, j) - lse(i)), z the family's logit (q_i . k_j x scaling, soft-capped). So:

* previous-token and first-token: the n weights (i, i - 1) and (i, 0): O(n d);
* induction (``model.scores.analysis`` defines it): for each pair of a query i and an earlier copy j of its
  token whose next position j + 1 lies outside the query's neighbourhood (j + 1 < i - ``INDUCTION_NEAR``),
  the weight on j + 1 (the token to copy) minus the weight on j (the copy itself); the pairs are found
  once per run by sorting positions by token id (``InductionPairs``): tokens with few copies in one batched
  matmul over chunks of the sorted positions (O(n x C x d) with C = ``SMALL_GROUP``), a token with
  many (one repeated token makes n²/2 pairs) as the causal square of its own copies' queries x the
  keys after its copies, through the fused kernel (its lse is the induction mass; soft-capped logits:
  dense blocks a chunk of rows at a time), so memory stays O(n d) whatever the text;
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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnscope.model.attention.interface import BLOCK_CELLS, flash_attention
from attnscope.model.scores.analysis import INDUCTION_NEAR

SMALL_GROUP = 16  # a token with at most this many copies is computed in the batched chunks


def _logits(z: torch.Tensor, scaling: float, softcap: float | None) -> torch.Tensor:
    """q.k dot products -> the family's logits (scale, then soft-cap), in place."""
    z.mul_(scaling)
    if softcap is not None:
        z = torch.tanh(z.div_(softcap)).mul_(softcap)
    return z


@dataclass(frozen=True)
class InductionPairs:
    """Every (query i, key j + 1) with token j == token i and j + 1 < i - ``INDUCTION_NEAR``, laid out for
    matmuls, with the copy j itself beside each (``copies``: the baseline the score subtracts).

    Positions are sorted by token (ascending inside each token). A token with at most
    ``SMALL_GROUP`` = C copies fills a run of at most C consecutive sorted positions, so its pairs
    lie in one chunk of C queries against that chunk and the one before: ``queries`` (c, C) and
    ``keys`` (c, 2C) index the positions (key j + 1 for copy j), ``follows`` (c, C, 2C) says which cells
    are pairs; one batched matmul covers them all. A token with more copies (one repeated token makes
    n²/2 pairs) is a ``groups`` entry: its own queries x keys, a block of rows at a time."""

    queries: torch.Tensor  # (c, C) long: query positions (padding: 0, never in a pair)
    keys: torch.Tensor  # (c, 2C) long: key positions j + 1 (clamped to n - 1 where not a pair)
    copies: torch.Tensor  # (c, 2C) long: the copies j themselves (clamped to 0 where not a pair)
    follows: torch.Tensor  # (c, C, 2C) bool
    groups: list[torch.Tensor]  # each (m,) long, ascending: the copies of a token with many

    @staticmethod
    def of(ids: torch.Tensor) -> InductionPairs:
        """From the run's token ids (n,): O(n log n) to sort, O(n x C) to hold."""
        ids = ids.cpu()
        c_size = SMALL_GROUP
        order = torch.sort(ids, stable=True).indices  # positions grouped by token, ascending inside each
        tokens = ids[order]
        _, counts = torch.unique_consecutive(tokens, return_counts=True)
        small = counts.repeat_interleave(counts) <= c_size  # (n,) in sorted order
        pos, tok = order[small], tokens[small]
        chunks = -(-len(pos) // c_size)
        pad = torch.full((chunks * c_size - len(pos),), -1, dtype=torch.long)
        pos, tok = torch.cat([pos, pad]).view(chunks, c_size), torch.cat([tok, pad]).view(chunks, c_size)
        before = torch.full((1, c_size), -1, dtype=torch.long)
        kpos = torch.cat([torch.cat([before, pos])[:-1], pos], dim=1)  # (c, 2C): this chunk and the one before
        ktok = torch.cat([torch.cat([before, tok])[:-1], tok], dim=1)
        follows = ((tok[:, :, None] == ktok[:, None, :]) & (tok[:, :, None] >= 0)
                   & (kpos[:, None, :] + 1 + INDUCTION_NEAR < pos[:, :, None]))  # (c, C, 2C)
        used = follows.any(-1).any(-1)  # chunks holding a pair
        starts = torch.cumsum(counts, 0) - counts
        groups = [order[int(s) : int(s) + int(c)] for s, c in zip(starts, counts, strict=True) if c > c_size]
        return InductionPairs(queries=pos[used].clamp_min(0), keys=(kpos[used] + 1).clamp(0, max(0, len(ids) - 1)),
                              copies=kpos[used].clamp_min(0), follows=follows[used], groups=groups)

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries, keys) (P,) each: every pair listed (tests, small runs)."""
        c, i, j = self.follows.nonzero(as_tuple=True)
        qs, ks = [self.queries[c, i]], [self.keys[c, j]]
        for g in self.groups:
            a, b = ((g[None, :] + 1 + INDUCTION_NEAR) < g[:, None]).nonzero(as_tuple=True)
            qs.append(g[a])
            ks.append(g[b] + 1)
        return torch.cat(qs), torch.cat(ks)

    @property
    def count(self) -> int:
        """How many pairs there are in all."""
        dense = sum(int(((g[:, None] + 1 + INDUCTION_NEAR) < g[None, :]).sum()) for g in self.groups)
        return int(self.follows.sum()) + dense


def induction_sums(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, pairs: InductionPairs, *, scaling: float,
                   softcap: float | None, cells: int = BLOCK_CELLS) -> torch.Tensor:
    """(H,) float64: each head's induction evidence summed over every query: its attention on induction
    targets (j + 1 after an earlier copy j, outside the query's neighbourhood) minus its attention on
    those copies j themselves (``model.scores.analysis`` says why). q (H, n, dh), k (Hkv, n, dh) and lse
    (H, n) as ``_pair_mass`` takes them."""
    target = _pair_mass(q, k, lse, pairs, 1, scaling=scaling, softcap=softcap, cells=cells)
    return target - _pair_mass(q, k, lse, pairs, 0, scaling=scaling, softcap=softcap, cells=cells)


def _pair_mass(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    lse: torch.Tensor,  # (H, n)
    pairs: InductionPairs,
    offset: int,
    *,
    scaling: float,
    softcap: float | None,
    cells: int,
) -> torch.Tensor:
    """(H,) float64: each head's attention on key j + offset over every (query i, copy j) pair, summed."""
    dev = q.device
    n_heads, n, dh = q.shape
    hkv = k.shape[0]
    g = n_heads // hkv
    total = torch.zeros(hkv, g, dtype=torch.float64)
    lse_g = lse.reshape(hkv, g, n)
    chunks, c_size = pairs.queries.shape[0], pairs.queries.shape[-1]
    step = max(1, cells // max(1, n_heads * c_size * 2 * c_size))
    key_pos = pairs.keys if offset == 1 else pairs.copies
    for a in range(0, chunks, step):  # tokens with few copies: one batched matmul per step of chunks
        qp, kp = pairs.queries[a : a + step].to(dev), key_pos[a : a + step].to(dev)
        c = qp.shape[0]
        qs = q[:, qp.reshape(-1)].float().reshape(hkv, g, c, c_size, dh).transpose(1, 2)  # (Hkv, c, g, C, dh)
        ks = k[:, kp.reshape(-1)].float().reshape(hkv, c, 1, 2 * c_size, dh)
        z = _logits(torch.matmul(qs, ks.transpose(-1, -2)), scaling, softcap)  # (Hkv, c, g, C, 2C)
        norm = lse_g[:, :, qp].transpose(1, 2)  # (Hkv, c, g, C)
        w = (z - norm[..., None]).exp_().masked_fill_(~pairs.follows[a : a + step, None].to(dev), 0.0)
        total += w.double().sum((1, 3, 4)).cpu()
    total = total.view(n_heads)
    fused = softcap is None and q.device.type == "cpu" and q.dtype == k.dtype == torch.float32
    if fused and pairs.groups:
        return total + _groups_flash(q, k, lse, [g.to(dev) for g in pairs.groups], scaling, offset)
    for positions in pairs.groups:  # a token with many copies: its queries x its keys, in blocks
        total += _group_blocks(q, k, lse, positions.to(dev), scaling, softcap, cells, offset)
    return total


def _groups_flash(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, groups: list[torch.Tensor],
                  scaling: float, offset: int = 1) -> torch.Tensor:
    """(H,) float64: the induction mass of tokens with many copies, from the fused kernel.

    Copy a (a >= 1) of a token attends to the keys at offset from copies 0..a-1 (``offset`` 1: the
    token after each copy; 0: the copies themselves): the causal square of queries q[pos[1:]] over
    keys k[pos[:-1] + offset], whose log-sum-exp over visible keys gives the mass
    exp(lse_group - lse). The cells of that square that are not pairs are those whose copy's next
    token lies in the query's neighbourhood (copy b with pos[b] + 1 + INDUCTION_NEAR >= pos[a]: at
    most INDUCTION_NEAR + 1 copies before the query): their weights are taken off. Every token's
    queries and keys are gathered at once; one kernel call per token (padding tokens to one batch
    costs more than it saves: the kernel's cost grows with the padded square)."""
    n_heads = q.shape[0]
    queries = torch.cat([pos[1:] for pos in groups])  # (T,) every copy but each token's first
    keys = torch.cat([pos[:-1] + offset for pos in groups])  # (T,) the key at offset from the copy before it
    qs, ks = q[:, queries], k[:, keys]  # (H, T, dh), (Hkv, T, dh)
    group_lse = torch.empty(n_heads, len(queries), dtype=torch.float32, device=q.device)  # (H, T)
    a = 0
    for pos in groups:
        b = a + len(pos) - 1
        _, part = flash_attention(qs[None, :, a:b], ks[None, :, a:b], ks[None, :, a:b], scaling, True)
        group_lse[:, a:b] = part[0]
        a = b
    norm = lse[:, queries]  # (H, T)
    mass = (group_lse - norm).exp_()  # the weight on the keys at offset from copies 0..a-1
    groups_per_kv = n_heads // k.shape[0]
    for back in range(INDUCTION_NEAR + 1):  # cell (a, a - 1 - back) of the square: copy a - 1 - back
        query_at, key_at, copy_at = [], [], []  # indices into queries / keys, and that copy's position
        a = 0
        for pos in groups:
            m = len(pos) - 1  # this token's queries: its copies 1..m
            rows = torch.arange(back, m, device=pos.device)  # copies a = rows + 1 with a - 1 - back >= 0
            query_at.append(a + rows)
            key_at.append(a + rows - back)
            copy_at.append(pos[rows - back])
            a += m
        qi, ki, cp = torch.cat(query_at), torch.cat(key_at), torch.cat(copy_at)
        near = (cp + 1 + INDUCTION_NEAR >= queries[qi]).nonzero()[:, 0]  # not a pair: the copy's next is near
        if not len(near):
            continue
        qi, ki = qi[near], ki[near]
        z = (qs[:, qi].float() * ks[:, ki].float().repeat_interleave(groups_per_kv, 0)).sum(-1)  # (H, m)
        mass[:, qi] -= (z * scaling - norm[:, qi]).exp()
    return mass.double().sum(-1).cpu()


def _group_blocks(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, pos: torch.Tensor, scaling: float,
                  softcap: float | None, cells: int, offset: int = 1) -> torch.Tensor:
    """(H,) float64: one token's mass on the keys at ``offset`` from its earlier copies, as dense blocks of
    its queries x those keys (soft-capped logits, other devices), a chunk of rows at a time."""
    n_heads, _n, dh = q.shape
    hkv = k.shape[0]
    groups = n_heads // hkv
    total = torch.zeros(n_heads, dtype=torch.float64)
    m = len(pos)
    keys = k[:, pos[:-1] + offset].float()  # (Hkv, m - 1, dh): key j + offset of each copy j but the last
    rows = max(1, cells // max(1, n_heads * m))
    for a in range(1, m, rows):  # the first copy has no earlier one
        b = min(m, a + rows)
        qs = q[:, pos[a:b]].float().view(hkv, groups * (b - a), dh)  # (Hkv, g r, dh)
        z = _logits(torch.matmul(qs, keys[:, : b - 1].transpose(-1, -2)), scaling, softcap)  # copies j < i
        z = z.view(-1, b - a, b - 1)  # (H, r, b - 1)
        follows = (pos[None, : b - 1] + 1 + INDUCTION_NEAR) < pos[a:b, None]  # (r, b - 1): j + 1 not near i
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
    """(H,) float64 each: the weights (i, i - 1) and (i, 0) summed over the queries i >= 1: O(n d)."""
    n_heads, n, dh = q.shape
    hkv = k.shape[0]
    if n < 2:
        zero = torch.zeros(n_heads, dtype=torch.float64)
        return zero, zero.clone()
    qs = q[:, 1:].float().reshape(hkv, n_heads // hkv, n - 1, dh)  # (Hkv, g, n - 1, dh): queries i >= 1
    kf = k.float()
    prev = _logits((qs * kf[:, None, :-1]).sum(-1).reshape(n_heads, n - 1), scaling, softcap)  # (H, n - 1)
    first = _logits(torch.matmul(qs, kf[:, None, 0, :, None]).reshape(n_heads, n - 1), scaling, softcap)
    norm = lse[:, 1:]
    return (prev - norm).exp().double().sum(-1).cpu(), (first - norm).exp().double().sum(-1).cpu()


def row_max_logits(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    scaling: float,
    rows: int = 128,
    cols: int = 256,
    pause: Callable[[], None] | None = None,
) -> torch.Tensor:
    """(H, n) float32: each causal row's largest logit q_i . k_j x scaling over j <= i (scaling > 0).

    Tiles of (Hkv, g x rows, cols) logits (256 KiB for 2 K/V heads of 2 queries each) stay in cache and
    are written into one buffer; only the diagonal tile is masked. ``pause`` is called before each block
    of rows (a background sweep yields there to a request)."""
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
        if pause is not None:
            pause()
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
    pause: Callable[[], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H,) float64 each: the row entropies and the rows' largest weights, summed over every row of a
    causal layer with plain dot-product logits (no soft-cap, no bias): exact, without a log per cell.

    H_i = lse_i - sum_j p_ij z_ij, and sum_j p_ij z_ij = scaling x q_i . (P K)_i: the fused kernel with
    the keys as values gives P K. ``pause``: called between the passes and the row maxima's blocks."""
    pk, _ = flash_attention(q[None], k[None], k[None], scaling, True)  # (1, H, n, dh)
    mean_logit = (q * pk[0]).sum(-1).mul_(scaling)  # (H, n)
    entropy = (lse - mean_logit).double().sum(-1)
    peak = (row_max_logits(q, k, scaling, pause=pause) - lse).exp().double().sum(-1)
    return entropy.cpu(), peak.cpu()
