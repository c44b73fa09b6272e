"""The next-token analysis at every position: blocks and slices of logits give what the whole (n, V) gives."""

from __future__ import annotations

import pytest
import torch

from attnscope.model.scores import analysis


def reference(logits: torch.Tensor, ids: torch.Tensor, k: int) -> list[tuple[list[int], list[float], float, int]]:
    """Each position's top-k ids and probabilities, the next token's probability and rank, from the whole softmax."""
    p = logits.double().softmax(-1)
    out = []
    for i in range(logits.shape[0] - 1):
        top = p[i].topk(k)
        target = logits[i, ids[i + 1]]
        out.append((top.indices.tolist(), top.values.tolist(), float(p[i, ids[i + 1]]),
                    int((logits[i] > target).sum()) + 1))
    return out


@pytest.mark.parametrize(("block_bytes", "slice_bytes"), [(1 << 30, 8 << 20), (4 * 300 * 7, 4 * 300 * 3), (1, 1)])
def test_blocks_and_slices_give_the_whole_softmax(monkeypatch: pytest.MonkeyPatch, block_bytes: int,
                                                  slice_bytes: int) -> None:
    """Ranks inside the top-k (read from it) and outside (counted), ties at the k-th logit, the last slice short."""
    monkeypatch.setattr(analysis, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(analysis, "SLICE_BYTES", slice_bytes)
    g = torch.Generator().manual_seed(0)
    n, vocab, k = 23, 300, 5
    logits = torch.randn(n, vocab, generator=g) * 3  # (n, V)
    ids = torch.randint(0, vocab, (n,), generator=g)
    top = logits.topk(k + 3, dim=-1).indices
    for i in range(0, n - 1, 3):  # every third next token among the row's top-k, at varying places
        ids[i + 1] = top[i, i % (k + 3)]
    logits[4, :] = logits[4].round()  # many ties, at the k-th logit too
    logits[7, ids[8]] = logits[7].max()  # the next token tied with the top choice
    asked: list[tuple[int, int]] = []

    def block(a: int, b: int) -> torch.Tensor:
        asked.append((a, b))
        return logits[a:b]

    got = analysis.predictions_by_block(block, n, ids, k, vocab)
    assert [a for a, _ in asked] == sorted({a for a, _ in asked}) and asked[-1][1] == n  # every row once, in order
    assert max(b - a for a, b in asked) == min(n, analysis.block_rows(vocab, block_bytes))
    inside = 0
    for p, (t_ids, t_p, q, rank) in zip(got, reference(logits, ids, k), strict=False):
        assert p.next_rank == rank
        inside += rank <= k
        assert p.next_prob == pytest.approx(q, rel=1e-5)
        assert p.top_probs == pytest.approx(t_p, rel=1e-5)
        if p.position != 4:  # ties may order differently
            assert p.top_ids == t_ids
    assert 0 < inside < n - 1  # both ways of finding the rank were taken
    assert got[-1].next_id is None and got[-1].next_rank is None and len(got) == n


def test_a_vocabulary_no_wider_than_k() -> None:
    """k >= V: every logit is in the top-k, the rank read from it."""
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, 0.0], [1.0, 0.0, 0.0]])
    ids = torch.tensor([0, 2, 1])
    got = analysis.predictions(logits, ids, 5)
    assert [p.next_rank for p in got[:2]] == [2, 1]  # 1 + the logits strictly above: a tie shares the rank
    assert len(got[0].top_ids) == 3
