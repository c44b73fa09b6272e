"""The causal tools against their invariants, on every family's tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from attnscope.model.capture import hooks
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.services.engine import Engine
from attnscope.model.tools import ablation, attribution, intervene, patching
from tests.support.i18n_check import error_key
from tests.support.tiny import ARCHS

TEXT = "The cat sat on the mat. The cat sat on the mat again."
CLEAN = "When Peter and John went to the store, John gave a drink to"


def _hook_counts(lm: LoadedModel) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules()]


def _run(engine: Engine, arch: str, text: str = TEXT):
    return engine.analyse(text, f"tiny-{arch}").record


@pytest.mark.parametrize("arch", ARCHS)
def test_attribution_terms_sum_to_logit(engine: Engine, tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm, cache = tiny_models[arch], _run(engine, arch)
    info = lm.info
    for position in (0, cache.n // 2, cache.n - 1):
        token = int(cache.input_ids[min(position + 1, cache.n - 1)])
        result = attribution.attribute(lm, cache, position, token)
        with torch.inference_mode():
            h = cache.resid[-1][position]
            expected = float(lm.unembed(lm.final_norm(h))[token])
        assert result.logit == pytest.approx(expected, abs=1e-5)
        assert math.fsum(t.value for t in result.terms) + result.error == pytest.approx(result.logit, abs=1e-9)
        assert abs(result.error) < 1e-4 * max(1.0, abs(result.logit))
        kinds = [t.kind for t in result.terms]
        assert kinds.count("head") == info.n_layers * info.n_heads
        assert kinds.count("mlp") == info.n_layers
        assert kinds.count("embed") == 1
        # every head appears once, by (layer, head)
        heads = {(t.layer, t.head) for t in result.terms if t.kind == "head"}
        assert heads == {(i, j) for i in range(info.n_layers) for j in range(info.n_heads)}
        assert result.final_transform is None


@pytest.mark.parametrize("arch", ARCHS)
def test_attribution_of_a_difference_is_the_difference_of_attributions(
        engine: Engine, tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm, cache = tiny_models[arch], _run(engine, arch)
    p = cache.n - 3
    a, b = attribution.attribute(lm, cache, p, 11), attribution.attribute(lm, cache, p, 42)
    diff = attribution.attribute(lm, cache, p, 11, 42)
    assert diff.logit == pytest.approx(a.logit - b.logit, abs=1e-5)
    for ta, tb, td in zip(a.terms, b.terms, diff.terms, strict=True):
        assert (td.kind, td.layer, td.head) == (ta.kind, ta.layer, ta.head)
        assert td.value == pytest.approx(ta.value - tb.value, abs=1e-6)


def test_freeze_norm_recognises_layer_and_rms_norms() -> None:
    torch.manual_seed(1)
    x = torch.randn(16) * 3 + 1
    ln = torch.nn.LayerNorm(16)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    frozen = attribution.freeze_norm(ln, x)
    assert frozen.center
    torch.testing.assert_close((frozen.linear(x) + frozen.shift).float(), ln(x), atol=1e-5, rtol=0)

    class GemmaLike(torch.nn.Module):  # RMSNorm that scales by 1 + weight
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(16))
            self.eps = 1e-6

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)

    gemma = GemmaLike()
    frozen = attribution.freeze_norm(gemma, x)
    assert not frozen.center
    torch.testing.assert_close((frozen.linear(x) + frozen.shift).float(), gemma(x[None])[0], atol=1e-5, rtol=0)

    class Odd(torch.nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return torch.tanh(h)

    with pytest.raises(attribution.BadInput, match="neither a LayerNorm nor an RMSNorm"):
        attribution.freeze_norm(Odd(), x)


@pytest.mark.parametrize("arch", ARCHS)
def test_ablating_no_head_changes_nothing(engine: Engine, tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm, cache = tiny_models[arch], _run(engine, arch)
    for mode in ("zero", "mean"):
        positions = ablation.ablate(lm, cache, [], mode).positions
        assert [p.kl for p in positions] == [0.0] * cache.n
        for p in positions:
            assert all(c.prob == c.prob_before for c in p.top)
            if p.actual_next is not None:
                assert p.actual_next.prob_after == p.actual_next.prob_before


@pytest.mark.parametrize("arch", ARCHS)
def test_ablation_changes_the_distribution(engine: Engine, tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm, cache = tiny_models[arch], _run(engine, arch)
    every = [(i, j) for i in range(lm.info.n_layers) for j in range(lm.info.n_heads)]
    positions = ablation.ablate(lm, cache, every, "zero").positions
    assert all(p.kl >= 0 for p in positions)
    assert max(p.kl for p in positions) > 1e-6
    # the prompt's first position sees only itself: its heads' output is its own value
    assert all(len(p.top) == 5 and sum(c.prob for c in p.top) <= 1 + 1e-6 for p in positions)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_scan_entry_equals_single_ablation(engine: Engine, tiny_models: dict[str, LoadedModel], arch: str,
                                          mode: ablation.Mode) -> None:
    lm, cache = tiny_models[arch], _run(engine, arch)
    position = cache.n - 4
    token = int(cache.input_ids[position + 1])
    result = ablation.scan(lm, cache, position, token, mode)
    assert result.effects.shape == (lm.info.n_layers, lm.info.n_heads)  # a tensor a researcher computes with
    assert result.mlp.shape == (lm.info.n_layers,)
    assert result.token.id == token and result.token.token  # with its display string
    for layer, head in [(0, 0), (1, lm.info.n_heads - 1), (lm.info.n_layers - 1, 1)]:
        single = ablation.ablate(lm, cache, [(layer, head)], mode).positions[position].actual_next
        assert single is not None
        expected = math.log(single.prob_after) - math.log(single.prob_before)
        assert float(result.effects[layer, head]) == pytest.approx(expected, abs=1e-4)
    base = ablation.ablate(lm, cache, [], mode).positions[position].actual_next
    assert base is not None
    assert result.logprob == pytest.approx(math.log(base.prob_before), abs=1e-5)


def test_head_out_of_range_names_the_range(engine: Engine, tiny_models: dict[str, LoadedModel]) -> None:
    lm, cache = tiny_models["gpt2"], _run(engine, "gpt2")
    with pytest.raises(ablation.BadInput, match=r"layers 0\.\.1 and heads 0\.\.3"):
        ablation.ablate(lm, cache, [(0, 4)], "zero")


def _pair(lm: LoadedModel) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Two prompts that differ at one token, 4 from the end; answer and wrong are those two tokens."""
    clean = ids_tensor(tokenize(lm.tokenizer, CLEAN))
    corrupted = clean.clone()
    d = clean.shape[0] - 4
    corrupted[d] = (int(clean[d]) + 1) % lm.info.vocab_size
    return clean, corrupted, int(clean[d]), int(corrupted[d])


@pytest.mark.parametrize("arch", ARCHS)
def test_patching_invariants(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    clean, corrupted, answer, wrong = _pair(lm)
    differ = (clean != corrupted).nonzero().flatten().tolist()
    assert len(differ) == 1  # the prompts differ at one token
    d = differ[0]
    full = patching.patch(lm, clean, corrupted, answer, wrong, skip_unaffected=False)
    last = clean.shape[0] - 1
    n_layers = lm.info.n_layers
    assert full.first_difference == d and full.position == last
    assert full.resid.shape == (n_layers + 1, clean.shape[0])  # (stages, positions), a tensor
    assert full.heads.shape == (n_layers, lm.info.n_heads)
    # the embeddings at the only differing position make the corrupted input the clean one
    assert float(full.resid[0, d]) == pytest.approx(1.0, abs=1e-4)
    # the final residual at the answer position is all the LM head reads
    assert float(full.resid[n_layers, last]) == pytest.approx(1.0, abs=1e-4)
    # the prompts come back as their tokens and the text they spell
    assert [t.id for t in full.clean.tokens] == clean.tolist() and full.clean.text
    assert full.answer.id == answer and full.wrong.id == wrong
    # before the first difference both runs are the same: nothing to patch, at every stage
    for grid in (full.resid, full.attn_out, full.mlp_out):
        for row in grid:
            assert all(abs(v) < 1e-4 for v in row[:d])
    # embeddings elsewhere are identical in both prompts
    assert all(abs(v) < 1e-4 for p, v in enumerate(full.resid[0]) if p != d)
    skipped = patching.patch(lm, clean, corrupted, answer, wrong)
    for site in ("resid", "attn_out", "mlp_out", "heads"):
        assert torch.allclose(getattr(skipped, site), getattr(full, site), atol=1e-4), site
    assert skipped.forwards <= full.forwards
    assert skipped.clean.metric != skipped.corrupted.metric


@pytest.mark.parametrize("arch", ARCHS)
def test_patching_at_an_earlier_position_ignores_later_tokens(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    clean, corrupted, answer, wrong = _pair(lm)
    d = int((clean != corrupted).nonzero()[0, 0])
    result = patching.patch(lm, clean, corrupted, answer, wrong, position=d + 2)
    assert float(result.resid[lm.info.n_layers, d + 2]) == pytest.approx(1.0, abs=1e-4)
    assert bool((result.resid[:, d + 3:] == 0.0).all())


def test_patching_refuses_what_it_cannot_do(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["gpt2"]
    clean, corrupted, answer, wrong = _pair(lm)
    with pytest.raises(patching.BadInput, match=rf"has {len(clean) + 1} tokens and the corrupted one {len(clean)};"):
        patching.patch(lm, torch.cat([clean, clean[:1]]), corrupted, answer, wrong)
    with pytest.raises(patching.BadInput, match="same metric"):
        patching.patch(lm, clean, clean, answer, wrong)
    pieces = len(lm.tokenizer(" Peter Peter", add_special_tokens=False)["input_ids"])
    with pytest.raises(patching.BadInput, match=f"is {pieces} tokens for this model.*exactly one token"):
        patching.single_token(lm, " Peter Peter", "answer")
    with pytest.raises(patching.BadInput, match="TFLOP") as refused:
        patching.patch(lm, clean, corrupted, answer, wrong, max_flops=1.0)
    assert refused.value.code == "patch_flops" and error_key(refused.value.code) == "err.patch_flops"  # said in Chinese too


@pytest.mark.parametrize("arch", ARCHS)
def test_hooks_are_gone_after_every_intervention(engine: Engine, tiny_models: dict[str, LoadedModel], arch: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lm, cache = tiny_models[arch], _run(engine, arch)
    before = _hook_counts(lm)
    attribution.attribute(lm, cache, 3, 7)
    ablation.ablate(lm, cache, [(0, 1), (1, 2)], "mean")
    ablation.scan(lm, cache, 5, 7, "mean")
    clean, corrupted, answer, wrong = _pair(lm)
    patching.patch(lm, clean, corrupted, answer, wrong)
    assert _hook_counts(lm) == before

    def broken(*_args: object, **_kwargs: object) -> torch.Tensor:
        assert _hook_counts(lm) != before  # the edits are installed when the forward fails
        raise RuntimeError("forward failed")

    for module in (ablation, patching):
        monkeypatch.setattr(module, "logits", broken)
    with pytest.raises(RuntimeError):
        ablation.ablate(lm, cache, [(0, 1)], "zero")
    with pytest.raises(RuntimeError):
        ablation.scan(lm, cache, 5, 7, "zero")
    with pytest.raises(RuntimeError):
        patching.patch(lm, clean, corrupted, answer, wrong)
    assert _hook_counts(lm) == before
    assert not lm.lock.locked()


def test_a_failing_hook_registration_removes_the_earlier_ones(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["llama"]
    before = _hook_counts(lm)
    regs = [hooks.Registration(intervene.out_proj(lm, 0), "pre", lambda *_a: None),
            hooks.Registration(object(), "pre", lambda *_a: None)]  # type: ignore[arg-type]
    with pytest.raises(AttributeError), hooks.temporary_hooks(regs):
        pass
    assert _hook_counts(lm) == before


def test_encoders_are_refused(engine: Engine, encoder: LoadedModel) -> None:
    cache = engine.analyse("a short sentence", encoder.info.name).record
    with pytest.raises(attribution.BadInput, match="encoder"):
        attribution.attribute(encoder, cache, 0, 1)
    with pytest.raises(ablation.BadInput, match="encoder"):
        ablation.ablate(encoder, cache, [], "zero")
