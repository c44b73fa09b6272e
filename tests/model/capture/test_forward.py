"""The captured activations are the model's own numbers (parity tests)."""

from __future__ import annotations

import math

import pytest
import torch

from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.names import LOGITS, act_name, block_names
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.runs.record import pack_pattern
from attnscope.model.scores import analysis
from tests.support.tiny import ARCHS

TEXT = "The cat sat on the mat. The cat sat on the mat again, and the dog barked."


def _hook_counts(lm: LoadedModel) -> list[int]:
    """Hooks on every module (transformers keeps a few of its own permanently)."""
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules()]


def _ids(lm: LoadedModel, text: str = TEXT) -> torch.Tensor:
    return ids_tensor(tokenize(lm.tokenizer, text))


@pytest.mark.parametrize("arch", ARCHS)
def test_patterns_equal_output_attentions(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    ids = _ids(lm)
    acts = run_with_cache(lm, ids)
    with torch.inference_mode():
        ref = lm.model(input_ids=ids[None], output_attentions=True).attentions
    assert len(ref) == lm.info.n_layers
    for i, expected in enumerate(ref):
        got = acts[act_name("pattern", i)]
        assert got.shape == (lm.info.n_heads, len(ids), len(ids))
        torch.testing.assert_close(got, expected[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_hook_fires_and_hooks_are_removed(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    before = _hook_counts(lm)
    acts = run_with_cache(lm, _ids(lm))
    assert set(block_names(lm.info.n_layers)) | {LOGITS} == set(acts)
    assert _hook_counts(lm) == before


def test_names_filter_keeps_only_what_was_asked(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["gpt2"]
    acts = run_with_cache(lm, _ids(lm), [act_name("resid_post", 1)])
    assert list(acts) == [act_name("resid_post", 1)]


def test_hooks_removed_when_forward_fails(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["gpt2"]
    before = _hook_counts(lm)
    too_long = torch.zeros(lm.info.max_positions + 10, dtype=torch.long)
    with pytest.raises((IndexError, RuntimeError)):
        run_with_cache(lm, too_long)
    assert _hook_counts(lm) == before


def test_gpt2_pattern_recomputed_by_hand(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["gpt2"]
    ids = _ids(lm)
    n, h, dh = len(ids), lm.info.n_heads, lm.info.d_head
    acts = run_with_cache(lm, ids)
    for i, block in enumerate(lm.blocks):
        x = block.ln_1(acts[act_name("resid_pre", i)])  # (n, d)
        q, k, _v = block.attn.c_attn(x).split(lm.info.d_model, dim=-1)
        q = q.view(n, h, dh).transpose(0, 1)  # (h, n, dh)
        k = k.view(n, h, dh).transpose(0, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # (h, n, n)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(acts[act_name("pattern", i)], scores.softmax(-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_sum_to_one_and_future_is_exactly_zero(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    ids = _ids(lm)
    acts = run_with_cache(lm, ids)
    future = ~torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    for i in range(lm.info.n_layers):
        p = acts[act_name("pattern", i)]
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2]), atol=1e-5, rtol=0)
        assert torch.all(p[:, future] == 0)
        packed = pack_pattern(p, causal=True)
        assert packed.shape == (lm.info.n_heads, len(ids) * (len(ids) + 1) // 2)


def test_gpt2_embedding_is_wte_plus_wpe(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["gpt2"]
    ids = _ids(lm)
    acts = run_with_cache(lm, ids)
    tr = lm.model.transformer
    expected = tr.wte.weight[ids] + tr.wpe.weight[torch.arange(len(ids))]
    torch.testing.assert_close(acts[act_name("resid_pre", 0)], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_resid_post_is_pre_plus_attn_plus_mlp(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    """Pre-norm blocks: x + attn(ln1 x) + mlp(ln2(x + attn)). Parallel blocks (GPT-NeoX):
    x + attn(ln1 x) + mlp(ln2 x). Both give resid_post = resid_pre + attn_out + mlp_out."""
    lm = tiny_models[arch]
    acts = run_with_cache(lm, _ids(lm))
    for i in range(lm.info.n_layers):
        total = acts[act_name("resid_pre", i)] + acts[act_name("attn_out", i)] + acts[act_name("mlp_out", i)]
        torch.testing.assert_close(total, acts[act_name("resid_post", i)], atol=1e-5, rtol=1e-5)
        if i + 1 < lm.info.n_layers:
            torch.testing.assert_close(acts[act_name("resid_post", i)], acts[act_name("resid_pre", i + 1)])


def test_neox_parallel_residual_reads_the_same_input(tiny_models: dict[str, LoadedModel]) -> None:
    """In a parallel block the MLP reads ln2(resid_pre), not the attention's output."""
    lm = tiny_models["gpt_neox"]
    assert lm.spec.residual == "parallel"
    acts = run_with_cache(lm, _ids(lm))
    block = lm.blocks[0]
    with torch.inference_mode():
        mlp = block.mlp(block.post_attention_layernorm(acts[act_name("resid_pre", 0)]))
    torch.testing.assert_close(mlp, acts[act_name("mlp_out", 0)], atol=1e-6, rtol=0)


def test_encoder_post_norm_identity(encoder: LoadedModel) -> None:
    """BERT is post-norm: resid_post = LN2(h + mlp_out) with h = LN1(resid_pre + attn_out)."""
    ids = _ids(encoder, "dog bites man")
    acts = run_with_cache(encoder, ids)
    assert encoder.spec.residual == "post_norm" and not encoder.info.causal
    for i, layer in enumerate(encoder.blocks):
        with torch.inference_mode():
            h = layer.attention.output.LayerNorm(acts[act_name("resid_pre", i)] + acts[act_name("attn_out", i)])
            post = layer.output.LayerNorm(h + acts[act_name("mlp_out", i)])
        torch.testing.assert_close(post, acts[act_name("resid_post", i)], atol=1e-5, rtol=1e-5)
    p = acts[act_name("pattern", 0)]
    assert (p[:, 0, -1] > 0).all()  # an encoder's first token sees the last one


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_lens_last_layer_equals_logits(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    ids = _ids(lm)
    acts = run_with_cache(lm, ids)
    last = acts[act_name("resid_post", lm.info.n_layers - 1)][None]  # (1, n, d)
    head = lm.lm_head()
    assert head is not None
    probs, top = analysis.logit_lens(last, head, k=5)
    ref = acts["logits"].softmax(-1).topk(5)
    torch.testing.assert_close(probs[0], ref.values, atol=1e-5, rtol=0)
    # the lens and the model compute the logits in differently shaped matmuls, so two tokens whose
    # probabilities tie within float error may swap places: each id the lens ranks must have the
    # probability the model gives it (ties aside, that is the same top-k)
    full = acts["logits"].softmax(-1)  # (n, V)
    torch.testing.assert_close(full.gather(-1, top[0]), ref.values, atol=1e-5, rtol=0)


def test_head_scores_on_a_known_pattern() -> None:
    n = 10
    prev = torch.zeros(n, n)
    prev[0, 0] = 1
    for i in range(1, n):
        prev[i, i - 1] = 1
    sink = torch.zeros(n, n)
    sink[:, 0] = 1
    ids = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7, 8, 9])  # queries 5..9 repeat: copy j = i - 5, target j + 1 = i - 4
    induct = torch.zeros(n, n)
    induct[:5, 0] = 1
    induct[torch.arange(5, n), torch.arange(1, 6)] = 1
    duplicate = torch.zeros(n, n)  # reads the earlier copy itself, not the token after it
    duplicate[:5, 0] = 1
    duplicate[torch.arange(5, n), torch.arange(0, 5)] = 1
    uniform = torch.ones(n, n).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)
    scores = analysis.head_scores(0, torch.stack([prev, sink, induct, duplicate, uniform]), ids)
    assert scores[0].prev_token == pytest.approx(1.0) and scores[0].first_token == pytest.approx(1 / (n - 1))
    assert scores[1].first_token == pytest.approx(1.0) and scores[1].entropy == pytest.approx(0.0, abs=1e-6)
    assert scores[2].induction == pytest.approx(1.0)  # target 1, its copy 0
    assert scores[3].induction == pytest.approx(-1.0)  # a duplicate-token head is not an induction head
    assert scores[0].induction == pytest.approx(0.0) and scores[1].induction == pytest.approx(-0.2)  # sink on copy 0
    assert scores[4].induction == pytest.approx(0.0, abs=1e-6)  # even attention: as much on j as on j + 1
    sparsity = analysis.head_sparsity(0, torch.stack([prev, sink]))
    assert sparsity[0].top1 == pytest.approx(1.0) and sparsity[0].keys_90 == pytest.approx(1.0)


def test_induction_needs_evidence_outside_the_neighbourhood() -> None:
    """One repeated word is no evidence of copying: the score is None (no badge) below
    INDUCTION_MIN_QUERIES repeating queries, and a repeat whose next token is in the query's own
    neighbourhood (the last INDUCTION_NEAR tokens) does not count, so a local head scores nothing."""
    # "I think that the dog and the cat are friends": the token after the first "the" is 2 back
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 4, 7, 8, 9])
    n = len(ids)
    two_back = torch.zeros(n, n)
    two_back[torch.arange(n), (torch.arange(n) - 2).clamp_min(0)] = 1
    (score,) = analysis.head_scores(0, two_back[None], ids)
    assert score.induction is None and analysis.induction_queries(ids) == 0
    # three far repeats: still too few
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 1, 2, 3])
    assert analysis.induction_queries(ids) == 3 < analysis.INDUCTION_MIN_QUERIES
    assert analysis.head_scores(0, two_back[None], ids)[0].induction is None
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4])
    assert analysis.induction_queries(ids) == analysis.INDUCTION_MIN_QUERIES


def test_sparsity_counts_diffuse_rows_exactly() -> None:
    n = 200
    uniform = torch.full((1, n, n), 1.0 / n)
    (s,) = analysis.head_sparsity(0, uniform)
    assert s.keys_90 == pytest.approx(180, abs=1) and s.top5 == pytest.approx(5 / n)


def test_long_prompt_scores_are_exact_over_every_row() -> None:
    n = 600
    p = torch.rand(2, n, n).tril()
    p = p / p.sum(-1, keepdim=True)
    ids = torch.randint(0, 20, (n,))
    (a, _b) = analysis.head_scores(0, p, ids)
    rows = torch.arange(1, n)
    assert a.prev_token == pytest.approx(p[0, rows, rows - 1].mean().item(), rel=1e-5)
    assert a.entropy == pytest.approx(-torch.special.xlogy(p[0], p[0]).sum(-1).mean().item(), rel=1e-5)
    assert a.max == pytest.approx(p[0].amax(-1).mean().item(), rel=1e-5)
    acc = analysis.ScoreAccumulator(2, ids)  # fed in uneven row blocks: the same numbers
    for q0 in range(0, n, 77):
        acc.add(q0, p[:, q0 : q0 + 77])
    blocked = acc.finish(0)[0]
    for field in ("entropy", "prev_token", "first_token", "max", "induction"):
        assert getattr(blocked, field) == pytest.approx(getattr(a, field), rel=1e-6, abs=1e-8), field
    (s,) = analysis.head_sparsity(0, p[:1])
    sorted_rows = p[0].sort(-1, descending=True).values.cumsum(-1)
    assert s.keys_90 == pytest.approx(((sorted_rows < 0.9 - 1e-6).sum(-1) + 1).float().mean().item(), rel=1e-6)


def test_predictions_rank_and_prob() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    preds = analysis.predictions(logits, torch.tensor([0, 2]), k=2)
    assert preds[0].top_ids == [1, 2]
    assert preds[0].next_id == 2 and preds[0].next_rank == 2
    assert preds[0].next_prob == pytest.approx(logits[0].softmax(-1)[2].item())
    assert preds[1].next_id is None
