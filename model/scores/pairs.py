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
  keys after its copies and the copies themselves: a dense square up to ``DENSE_GROUP`` copies, above it
  through the fused kernel (its lse is the induction mass; soft-capped logits: dense blocks a chunk of
  rows at a time), so memory stays O(n d) whatever the text;
* entropy and peak (the row's largest weight) need every visible cell: ``entropy_and_peak`` sweeps
  them once more, exactly, in one tiled pass: with lse known a cell's log-weight l_ij = z_ij - lse_i is
  one fused product, the peak is exp(max_j l_ij) and the entropy -sum_j exp(l_ij) l_ij (no log per cell).

These hold where every pair above is visible: a causal mask over the whole sequence (or no mask),
no per-key bias, and for the fused sweep no soft-cap. Other layers keep the block path
(``model.capture``, ``ScoreAccumulator.add``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnscope.model import compat
from attnscope.model.attention.interface import BLOCK_CELLS, flash_attention
from attnscope.model.scores.analysis import INDUCTION_NEAR

SMALL_GROUP = 16  # a token with at most this many copies is computed in the batched chunks
# A token with at most this many copies has its pairs in a batch of squares (both sides in one product, one
# matmul per size class); above it, through the fused kernel. SmolLM2 at 1,024 tokens (7 tokens of 19-82
# copies, 30 layers): those tokens through the fused kernel, each side apart, 155 ms; a square per token, both
# sides in one product, 88 ms; the whole induction sum 267 -> 172 ms with the batched squares.
DENSE_GROUP = 256


def _logits(z: torch.Tensor, scaling: float, softcap: float | None) -> torch.Tensor:
    """q.k dot products -> the family's logits (scale, then soft-cap), in place."""
    z.mul_(scaling)
    if softcap is not None:
        z = torch.tanh(z.div_(softcap)).mul_(softcap)
    return z


@dataclass(frozen=True)
class PairBatch:
    """Query positions against key positions, laid out for one batched matmul: ``follows`` says which
    cells are (query i, copy j) pairs; ``keys`` holds j + 1 (the target), ``copies`` j (the baseline)."""

    queries: torch.Tensor  # (c, Q) long: query positions (padding: 0, never in a pair)
    keys: torch.Tensor  # (c, W) long: key positions j + 1 (clamped to n - 1 where not a pair)
    copies: torch.Tensor  # (c, W) long: the copies j themselves (clamped to 0 where not a pair)
    follows: torch.Tensor  # (c, Q, W) bool

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries, keys) (P,) each: every pair listed."""
        c, i, j = self.follows.nonzero(as_tuple=True)
        return self.queries[c, i], self.keys[c, j]


@dataclass(frozen=True)
class InductionPairs:
    """Every (query i, key j + 1) with token j == token i and j + 1 < i - ``INDUCTION_NEAR``, laid out for
    matmuls, with the copy j itself beside each (the baseline the score subtracts).

    Positions are sorted by token (ascending inside each token). A token with at most
    ``SMALL_GROUP`` = C copies fills a run of at most C consecutive sorted positions, so its pairs
    lie in one chunk of C queries against that chunk and the one before: ``chunks`` (c, C) queries against
    (c, 2C) keys. A token with up to ``DENSE_GROUP`` copies is a square of its copies against themselves,
    the tokens of one size class (up to 32, 64, ... copies) padded to one batch in ``squares``. A token with
    more (one repeated token makes n²/2 pairs) is a ``groups`` entry: its own queries x keys, a block of rows
    at a time. Held: O(n x C) for the chunks, O(n x DENSE_GROUP) bytes at most for the squares."""

    chunks: PairBatch
    squares: list[PairBatch]
    groups: list[torch.Tensor]  # each (m,) long, ascending: the copies of a token with more than DENSE_GROUP

    @staticmethod
    def of(ids: torch.Tensor) -> InductionPairs:
        """From the run's token ids (n,): O(n log n) to sort."""
        ids = ids.cpu()
        c_size = SMALL_GROUP
        last = max(0, len(ids) - 1)
        order = torch.sort(ids, stable=True).indices  # positions grouped by token, ascending inside each
        tokens = ids[order]
        _, counts = torch.unique_consecutive(tokens, return_counts=True)
        small = counts.repeat_interleave(counts) <= c_size  # (n,) in sorted order
        pos, tok = order[small], tokens[small]
        n_chunks = -(-len(pos) // c_size)
        pad = torch.full((n_chunks * c_size - len(pos),), -1, dtype=torch.long)
        pos, tok = torch.cat([pos, pad]).view(n_chunks, c_size), torch.cat([tok, pad]).view(n_chunks, c_size)
        before = torch.full((1, c_size), -1, dtype=torch.long)
        kpos = torch.cat([torch.cat([before, pos])[:-1], pos], dim=1)  # (c, 2C): this chunk and the one before
        ktok = torch.cat([torch.cat([before, tok])[:-1], tok], dim=1)
        follows = ((tok[:, :, None] == ktok[:, None, :]) & (tok[:, :, None] >= 0)
                   & (kpos[:, None, :] + 1 + INDUCTION_NEAR < pos[:, :, None]))  # (c, C, 2C)
        used = follows.any(-1).any(-1)  # chunks holding a pair
        chunks = PairBatch(queries=pos[used].clamp_min(0), keys=(kpos[used] + 1).clamp(0, last),
                           copies=kpos[used].clamp_min(0), follows=follows[used])
        starts = torch.cumsum(counts, 0) - counts
        many = [order[int(s) : int(s) + int(c)] for s, c in zip(starts, counts, strict=True) if c > c_size]
        by_class: dict[int, list[torch.Tensor]] = {}
        for g in many:
            if len(g) <= DENSE_GROUP:
                by_class.setdefault(1 << (len(g) - 1).bit_length(), []).append(g)
        squares = [_square(gs, width, last) for width, gs in sorted(by_class.items())]
        return InductionPairs(chunks=chunks, squares=squares, groups=[g for g in many if len(g) > DENSE_GROUP])

    @property
    def batches(self) -> list[PairBatch]:
        """The chunks and the squares: every pair but the groups'."""
        return [self.chunks, *self.squares]

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries, keys) (P,) each: every pair listed (tests, small runs)."""
        listed = [b.pairs() for b in self.batches]
        qs, ks = [q for q, _ in listed], [k for _, k in listed]
        for g in self.groups:
            a, b = ((g[None, :] + 1 + INDUCTION_NEAR) < g[:, None]).nonzero(as_tuple=True)
            qs.append(g[a])
            ks.append(g[b] + 1)
        return torch.cat(qs), torch.cat(ks)

    @property
    def count(self) -> int:
        """How many pairs there are in all."""
        dense = sum(int(((g[:, None] + 1 + INDUCTION_NEAR) < g[None, :]).sum()) for g in self.groups)
        return sum(int(b.follows.sum()) for b in self.batches) + dense


def _square(groups: list[torch.Tensor], width: int, last: int) -> PairBatch:
    """Tokens' copies (each (m,) ascending, m <= width) against themselves, padded to ``width``: the pairs
    (copy a, copy b) with pos[b] + 1 + INDUCTION_NEAR < pos[a]."""
    pos = torch.full((len(groups), width), -1, dtype=torch.long)  # (G, M)
    for row, g in enumerate(groups):
        pos[row, : len(g)] = g
    real = pos >= 0
    follows = (pos[:, None, :] + 1 + INDUCTION_NEAR < pos[:, :, None]) & real[:, :, None] & real[:, None, :]
    return PairBatch(queries=pos.clamp_min(0), keys=(pos + 1).clamp(0, last), copies=pos.clamp_min(0),
                     follows=follows)


def induction_sums(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, pairs: InductionPairs, *, scaling: float,
                   softcap: float | None, cells: int = BLOCK_CELLS) -> torch.Tensor:
    """(H,) float64: each head's induction evidence summed over every query: its attention on induction
    targets (j + 1 after an earlier copy j, outside the query's neighbourhood) minus its attention on
    those copies j themselves (``model.scores.analysis`` says why). q (H, n, dh), k (Hkv, n, dh), lse (H, n).

    Both sides of each pair come from one product: the tokens with few copies in batched chunks, a token
    with up to ``DENSE_GROUP`` copies in a batch of squares, a token with more through the fused kernel."""
    dev = q.device
    total = torch.zeros(q.shape[0], dtype=torch.float64)
    for batch in pairs.batches:
        total += _batch_evidence(q, k, lse, batch, scaling, softcap, cells)
    fused = softcap is None and q.dtype == k.dtype == torch.float32 and compat.fused_on(q.device, q.dtype)
    if fused and pairs.groups:
        groups = [g.to(dev) for g in pairs.groups]
        return total + _groups_flash(q, k, lse, groups, scaling, 1) - _groups_flash(q, k, lse, groups, scaling, 0)
    for positions in pairs.groups:  # a token with many copies: its queries x its keys, in blocks
        total += _group_blocks(q, k, lse, positions.to(dev), scaling, softcap, cells)
    return total



def _batch_evidence(
    q: torch.Tensor,  # (H, n, dh)
    k: torch.Tensor,  # (Hkv, n, dh)
    lse: torch.Tensor,  # (H, n)
    batch: PairBatch,
    scaling: float,
    softcap: float | None,
    cells: int,
) -> torch.Tensor:
    """(H,) float64: each head's weight on key j + 1 minus its weight on copy j over the batch's pairs, one
    matmul per step of its rows against the targets and the copies side by side."""
    dev = q.device
    n_heads, n, dh = q.shape
    hkv = k.shape[0]
    g = n_heads // hkv
    total = torch.zeros(hkv, g, dtype=torch.float64)
    lse_g = lse.reshape(hkv, g, n)
    rows, width = batch.queries.shape[-1], batch.keys.shape[-1]
    step = max(1, cells // max(1, n_heads * rows * 2 * width))
    for a in range(0, batch.queries.shape[0], step):
        qp = batch.queries[a : a + step].to(dev).reshape(-1)  # (c Q,)
        kp = torch.cat([batch.keys[a : a + step], batch.copies[a : a + step]], dim=1).to(dev)  # (c, 2W)
        c = qp.shape[0] // rows
        # a K/V head's query heads side by side in one matrix per chunk: one bmm, no broadcast copy of the keys
        qs = q.index_select(1, qp).float().view(hkv, g, c, rows, dh).transpose(1, 2).reshape(hkv * c, g * rows, dh)
        ks = k.index_select(1, kp.reshape(-1)).float().view(hkv * c, 2 * width, dh)
        z = _logits(torch.bmm(qs, ks.transpose(-1, -2)), scaling, softcap).view(hkv, c, g, rows, 2 * width)
        norm = lse_g.index_select(2, qp).view(hkv, g, c, rows).transpose(1, 2)  # (Hkv, c, g, Q)
        follows = batch.follows[a : a + step, None].to(dev)  # (c, 1, Q, W)
        w = z.sub_(norm[..., None]).exp_().masked_fill_(~torch.cat([follows, follows], -1), 0.0)
        sums = w.view(hkv, c, g, rows, 2, width).sum((1, 3, 5), dtype=torch.float64)  # (Hkv, g, 2): targets, copies
        total += (sums[..., 0] - sums[..., 1]).cpu()
    return total.view(n_heads)


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
                  softcap: float | None, cells: int) -> torch.Tensor:
    """(H,) float64: one token's induction evidence, its mass on the keys after its earlier copies minus its
    mass on those copies, as dense blocks of its queries x both sets of keys, a chunk of rows at a time."""
    n_heads, _n, dh = q.shape
    hkv = k.shape[0]
    groups = n_heads // hkv
    total = torch.zeros(n_heads, dtype=torch.float64)
    m = len(pos)
    if m < 2:
        return total
    before = pos[:-1]  # each copy j but the last
    # (Hkv, 2 (m - 1), dh): key j + 1 and copy j side by side, so the copies before a row are a prefix
    keys = k[:, torch.stack([before + 1, before], dim=1).reshape(-1)].float()
    rows = max(1, cells // max(1, 2 * n_heads * m))
    for a in range(1, m, rows):  # the first copy has no earlier one
        b = min(m, a + rows)
        qs = q[:, pos[a:b]].float().view(hkv, groups * (b - a), dh)  # (Hkv, g r, dh)
        z = _logits(torch.matmul(qs, keys[:, : 2 * (b - 1)].transpose(-1, -2)), scaling, softcap)  # copies j < i
        z = z.view(n_heads, b - a, b - 1, 2)  # (H, r, b - 1, 2): target j + 1, copy j
        follows = (pos[None, : b - 1] + 1 + INDUCTION_NEAR) < pos[a:b, None]  # (r, b - 1): j + 1 not near i
        w = (z - lse[:, pos[a:b], None, None]).exp_().masked_fill_(~follows[..., None], 0.0)
        sums = w.double().sum((1, 2))  # (H, 2)
        total += (sums[:, 0] - sums[:, 1]).cpu()
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


# entropy_and_peak's tiles: 32 query rows of every head of a K/V group against 512 keys. On SmolLM2 at 1,024
# tokens (30 layers, one torch thread, 2-core AMD EPYC) the pass took 438-537 ms where the fused kernel's P K
# pass and the tiled row maxima it replaced took 994-1,075 ms together; 64 x 256, 32 x 256 and 32 x 1,024 were
# within 10 % of it, 128-row tiles slower (they leave the cache). BENCHMARKS.md's side-by-side has the ratios.
TILE_ROWS = 32
TILE_KEYS = 512
PAUSE_ROWS = 128  # entropy_and_peak calls ``pause`` before each block of this many rows
_HIDDEN = -1e30  # added to a hidden cell's log-weight: exp gives 0 and 0 x -1e30 is 0 (no nan, as -inf gives)


def entropy_and_peak(
    q: torch.Tensor,  # (H, n, dh) float32
    k: torch.Tensor,  # (Hkv, n, dh)
    lse: torch.Tensor,  # (H, n)
    scaling: float,
    pause: Callable[[], None] | None = None,
    rows: int = TILE_ROWS,
    keys: int = TILE_KEYS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H,) float64 each: the row entropies and the rows' largest weights, summed over every row of a
    causal layer with plain dot-product logits (no soft-cap, no bias): exact, in one pass over the cells.

    With the row's normaliser known, each cell's log-weight is one fused product, l_ij = scaling x q_i . k_j
    - lse_i (``baddbmm``), and needs no other cell: the peak is exp(max_j l_ij), the entropy
    H_i = -sum_j exp(l_ij) l_ij. A tile of (K/V head, its query heads x ``rows``, ``keys``) log-weights stays
    in cache for its max, exp and product; only the diagonal tile is masked; tiles right of the diagonal
    are never computed. ``keys`` must be a multiple of ``rows``. ``pause``: called before each
    ``PAUSE_ROWS`` rows."""
    if keys % rows:
        raise ValueError(f"entropy_and_peak: keys ({keys}) must be a multiple of rows ({rows})")
    n_heads, n, dh = q.shape
    hkv = k.shape[0]
    g = n_heads // hkv
    dev = q.device
    qf, kt = q.float(), k.float().transpose(-1, -2).contiguous()  # (H, n, dh), (Hkv, dh, n)
    neg_lse = lse.float().neg().view(hkv, g, n)
    entropy = torch.zeros(hkv, g, n, dtype=torch.float32, device=dev)  # -sum_j p_ij l_ij so far
    best = torch.full((hkv, g, n), _HIDDEN, dtype=torch.float32, device=dev)  # max_j l_ij so far
    future = torch.full((rows, rows), _HIDDEN, dtype=torch.float32, device=dev).triu(1)  # (r, r): key after query
    # flat buffers: a tile of any width is a contiguous view of their first cells (no allocation per tile)
    tile_buf = torch.empty(hkv * g * rows * keys, dtype=torch.float32, device=dev)
    weight_buf = torch.empty_like(tile_buf)
    for q0 in range(0, n, rows):
        if pause is not None and q0 % PAUSE_ROWS < rows:
            pause()
        q1 = min(n, q0 + rows)
        r = q1 - q0
        qs = qf[:, q0:q1].reshape(hkv, g * r, dh)  # (Hkv, g r, dh)
        bias = neg_lse[:, :, q0:q1].reshape(hkv, g * r, 1)
        m, h = best[:, :, q0:q1], entropy[:, :, q0:q1]  # (Hkv, g, r) views
        for c0 in range(0, q1, keys):
            c1 = min(q1, c0 + keys)
            w = c1 - c0
            cells = hkv * g * r * w
            s = tile_buf[:cells].view(hkv, g * r, w)
            torch.baddbmm(bias, qs, kt[:, :, c0:c1], alpha=scaling, out=s)  # (Hkv, g r, w) log-weights
            if c1 > q0:  # the diagonal tile (its last r keys are the rows' own): keys after a query hidden
                s.view(hkv, g, r, w)[..., q0 - c0 :].add_(future[:r, :r])
            torch.maximum(m, s.amax(-1).view(hkv, g, r), out=m)
            p = torch.exp(s, out=weight_buf[:cells].view(hkv, g * r, w))
            h.sub_(p.mul_(s).sum(-1).view(hkv, g, r))
    return entropy.view(n_heads, n).double().sum(-1).cpu(), best.view(n_heads, n).exp().double().sum(-1).cpu()
