"""Head scores without blocks of weights (model.pair_scores) equal the block path's, exactly:
entropy as lse - sum p z, peak from the row's largest logit, induction over enumerated pairs
(the worst case, one repeated token, included), previous/first token from single dot products;
and the fused kernel's output and lse equal the eager maths."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.masking_utils import sliding_window_causal_mask_function

from attnscope.model.attention import interface
from attnscope.model.attention.interface import LazyMask, flash_attention
from attnscope.model.attention.kept import logits
from attnscope.model.load.models import wrap_model
from attnscope.model.scores import analysis, pairs
from attnscope.model.scores.analysis import INDUCTION_NEAR
from attnscope.model.scores.live import scored_run
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

H, HKV, DH = 4, 2, 8


def qk(n: int, seed: int = 0, spread: float = 1.5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(H, n, DH, generator=gen) * spread, torch.randn(HKV, n, DH, generator=gen) * spread)


def dense(q: torch.Tensor, k: torch.Tensor, scaling: float, softcap: float | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager reference: causal weights (H, n, n) and their lse (H, n)."""
    n = q.shape[1]
    z = logits(q, k, list(range(H)), H // HKV, 0, n, scaling, softcap, None)  # (H, n, n)
    z = z.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return z.softmax(-1), z.logsumexp(-1)


def test_fused_kernel_output_and_lse_equal_the_eager_maths() -> None:
    q, k = qk(70)
    v = torch.randn(HKV, 70, DH)
    w, lse = dense(q, k, 0.4)
    out, got_lse = flash_attention(q[None], k[None], v[None], 0.4, True)
    torch.testing.assert_close(got_lse[0], lse, atol=1e-5, rtol=0)
    torch.testing.assert_close(out[0], w @ v.repeat_interleave(H // HKV, 0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 300])  # 300 rows: more than one block of rows and of keys
@pytest.mark.parametrize("tile", [(32, 512), (7, 14), (1, 1), (4, 8)])  # rows x keys: full, narrow, diagonal-only
def test_entropy_and_peak_equal_xlogy_and_amax(n: int, tile: tuple[int, int]) -> None:
    q, k = qk(n)
    w, lse = dense(q, k, 0.5)
    entropy, peak = pairs.entropy_and_peak(q, k, lse, 0.5, rows=tile[0], keys=tile[1])
    torch.testing.assert_close(entropy, -torch.special.xlogy(w, w).sum((-1, -2)).double(), atol=1e-4 * n, rtol=1e-5)
    torch.testing.assert_close(peak, w.amax(-1).sum(-1).double(), atol=1e-5 * n, rtol=1e-5)
    assert (entropy > 0).all() or n == 1


def test_entropy_and_peak_refuse_keys_that_are_not_whole_row_blocks() -> None:
    q, k = qk(10)
    _w, lse = dense(q, k, 0.5)
    with pytest.raises(ValueError, match="multiple of rows"):
        pairs.entropy_and_peak(q, k, lse, 0.5, rows=4, keys=6)


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_prev_and_first_from_dot_products(softcap: float | None) -> None:
    q, k = qk(50, seed=1)
    w, lse = dense(q, k, 0.5, softcap)
    prev, first = pairs.prev_first_sums(q, k, lse, scaling=0.5, softcap=softcap)
    rows = torch.arange(1, 50)
    torch.testing.assert_close(prev, w[:, rows, rows - 1].sum(-1).double(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(first, w[:, rows, 0].sum(-1).double(), atol=1e-5, rtol=1e-6)


def _block_induction(w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    acc = analysis.ScoreAccumulator(H, ids)
    acc.add(0, w)
    return acc.induction


@pytest.mark.parametrize("dense_group", [0, 256])  # a token with many copies: the fused kernel, a dense square
@pytest.mark.parametrize("softcap", [None, 2.0])  # soft-capped: dense blocks always
@pytest.mark.parametrize("case", ["mixed", "three sizes", "one repeated token", "no repeats"])
def test_induction_over_pairs_equals_the_block_einsum(case: str, softcap: float | None, dense_group: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pairs, "DENSE_GROUP", dense_group)
    n = 200
    if case == "mixed":  # tokens with a few copies (batched chunks) and two with many, some copies adjacent
        gen = torch.Generator().manual_seed(2)
        ids = torch.randint(0, 30, (n,), generator=gen)
        ids[::4], ids[1::9], ids[2::9] = 100, 101, 101
    elif case == "three sizes":  # tokens of 20, 40 and 100 copies: three size classes of squares
        ids = torch.arange(n)
        ids[torch.randperm(n, generator=torch.Generator().manual_seed(4))[:160]] = torch.tensor(
            [300] * 20 + [301] * 40 + [302] * 100)
    elif case == "one repeated token":  # n²/2 pairs: computed in bounded chunks
        ids = torch.full((n,), 7)
    else:
        ids = torch.arange(n)
    q, k = qk(n, seed=3)
    w, lse = dense(q, k, 0.5, softcap)
    found = pairs.InductionPairs.of(ids)
    follows = (ids[None, :n - 1] == ids[:, None]) & torch.ones(n, n - 1, dtype=torch.bool).tril(-2 - INDUCTION_NEAR)  # (i, j)
    assert found.count == int(follows.sum())
    got = pairs.induction_sums(q, k, lse, found, scaling=0.5, softcap=softcap, cells=H * 64 * 64)
    torch.testing.assert_close(got, _block_induction(w, ids), atol=1e-5, rtol=1e-6)
    if case == "one repeated token":  # not n²/2 pairs in chunks: one square, or the fused kernel's group
        assert not len(found.chunks.queries)
        assert (len(found.groups), len(found.squares)) == ((1, 0) if dense_group < n else (0, 1))
    elif case == "mixed":  # two tokens of 50 and 44 copies: one size class of squares, or two groups
        assert len(found.groups) == (2 if dense_group < 44 else 0)
        assert len(found.squares) == (0 if dense_group < 44 else 1) and len(found.chunks.queries)
    elif case == "three sizes":
        assert [len(b.queries[0]) for b in found.squares] == ([] if dense_group < 20 else [32, 64, 128])
    else:
        assert not found.groups and not found.squares
    assert sorted(zip(*(t.tolist() for t in found.pairs()), strict=True)) == sorted(
        (int(i), int(j) + 1) for i, j in follows.nonzero().tolist())


def test_induction_pairs_are_the_definition() -> None:
    ids = torch.tensor([5, 6, 7, 5, 6, 7, 5, 5])
    queries, keys = pairs.InductionPairs.of(ids).pairs()
    got = sorted(zip(queries.tolist(), keys.tolist(), strict=True))
    # query i, key j + 1 for every earlier copy j of token i with j + 1 outside i's neighbourhood
    want = sorted((i, j + 1) for i in range(8) for j in range(i) if ids[j] == ids[i] and j + 1 + INDUCTION_NEAR < i)
    assert want == [(6, 1), (7, 1)]  # 6 and 7 read the 6 after the first 5; the second 5 (3) is too near
    assert got == want


def test_which_masks_the_fused_kernel_takes() -> None:
    def mask(**kw: object) -> LazyMask:
        base: dict[str, object] = {"batch_size": 1, "kv_offset": 0, "attention_mask": None, "device": torch.device("cpu")}
        return LazyMask(kwargs={**base, **kw}, q_length=int(str(kw["q_length"])), kv_length=int(str(kw["kv_length"])),
                        q_offset=int(str(kw.pop("q_offset", 0))))

    from transformers.masking_utils import causal_mask_function

    assert mask(q_length=9, kv_length=9, mask_function=causal_mask_function).fused_causal() is True
    assert mask(q_length=1, kv_length=9, q_offset=8, mask_function=causal_mask_function).fused_causal() is False
    assert mask(q_length=3, kv_length=9, q_offset=6, mask_function=causal_mask_function).fused_causal() is None
    assert mask(q_length=9, kv_length=9, mask_function=sliding_window_causal_mask_function(4)).fused_causal() is None
    padded = torch.tensor([[0, 1, 1, 1]])
    assert mask(q_length=4, kv_length=4, mask_function=causal_mask_function,
                attention_mask=padded).fused_causal() is None


@pytest.mark.parametrize("family", ["llama", "gpt2", "mistral", "falcon", "falcon-rotary-gqa"])
def test_scores_of_a_captured_forward_equal_the_dense_patterns(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the fused forward (llama, gpt2, rotary Falcon) and the block path (mistral's window,
    ALiBi Falcon's additive mask) give the head scores of output_attentions, over a prompt with repeats
    longer than a flat-pair group."""
    fam = next(f for f in FAMILIES if f.id == family)
    model = fam.build("eager")
    ids = torch.tensor(([7] * 40 + list(range(20, 60)) + [9, 10, 11] * 12)[:120])
    with torch.inference_mode():
        ref = model(input_ids=ids[None], output_attentions=True).attentions
    lm = wrap_model(f"tiny-{family}", model, tiny_tokenizer(), source=f"config:{family}")
    fused: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        fused.append(1)
        return flash_attention(*args, **kwargs)

    monkeypatch.setattr(interface, "flash_attention", counted)
    with lm.lock:
        acts, _scores, heads = scored_run(lm, ids)
    block_path = family in ("mistral", "falcon")  # a sliding window, an additive mask: the block path
    assert len(fused) == (0 if block_path else lm.info.n_layers)
    assert {"forward", "exact_scores"} <= set(acts.timing_ms)
    want = [s for i, a in enumerate(ref) for s in analysis.head_scores(i, a[0].float(), ids)]
    for got_s, want_s in zip(heads, want, strict=True):
        for field in ("entropy", "prev_token", "first_token", "max", "induction"):
            assert getattr(got_s, field) == pytest.approx(getattr(want_s, field), abs=1e-5), (got_s, field)
