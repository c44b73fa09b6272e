"""Both paths of model/compat.py's gate (issue #35): the private fused CPU kernel where this torch build
has it, and the public fallback where it has not (or ATTNSCOPE_FUSED=0) give the same attention, row
normalisers, head scores and outputs; and ``output_attentions`` is known from public module hooks, on a
family that passes the keyword down (llama) and one that pops it (gpt2), from the keyword or the config."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnscope.model import compat
from attnscope.model.attention import interface
from attnscope.model.capture.names import act_name
from attnscope.model.load.models import borrowed, inspect_model, wrap_model
from attnscope.model.scores.live import scored_run
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

IDS = torch.tensor(([7] * 12 + list(range(20, 60)) + [9, 10, 11] * 10)[:90])


def _family(family_id: str) -> Any:
    return next(f for f in FAMILIES if f.id == family_id)


@pytest.mark.parametrize("causal", [True, False])
def test_the_public_fallback_equals_the_fused_kernel(causal: bool) -> None:
    """Grouped K/V heads, causal or not: output and lse agree to float32 rounding."""
    if not compat.fused_available():
        pytest.skip("this torch build has no fused CPU kernel: only the fallback runs")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 70, 16, generator=gen) * 2  # (B, H, q, dh)
    k = torch.randn(1, 2, 70, 16, generator=gen) * 2  # (B, Hkv, kv, dh)
    v = torch.randn(1, 2, 70, 16, generator=gen)
    out_f, lse_f = compat.fused_attention(q, k, v, 0.25, causal)
    out_b, lse_b = interface.blocked_attention(q, k, v, 0.25, causal)
    assert out_b.shape == out_f.shape == (1, 6, 70, 16) and lse_b.shape == lse_f.shape == (1, 6, 70)
    torch.testing.assert_close(lse_b, lse_f.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_b, out_f, atol=1e-5, rtol=1e-5)
    # small blocks: rows split over many blocks give the same numbers
    small = interface.block_rows
    try:
        interface.block_rows = lambda batch, heads, kv, cells=64: max(1, cells // max(1, batch * heads * kv))  # type: ignore[assignment]
        out_s, lse_s = interface.blocked_attention(q, k, v, 0.25, causal)
    finally:
        interface.block_rows = small
    torch.testing.assert_close(lse_s, lse_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_s, out_b, atol=1e-5, rtol=1e-5)


def test_a_torch_without_the_kernel_runs_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build whose torch.ops.aten lacks the op (renamed in some release) is detected, not crashed on."""
    monkeypatch.setattr(compat, "_FUSED_OP", "_no_such_attention_kernel_for_cpu")
    assert not compat.fused_available()
    q = torch.randn(1, 2, 5, 4)
    out, lse = interface.flash_attention(q, q, q, 0.5, True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True, scale=0.5)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, (q @ q.transpose(-1, -2) * 0.5).masked_fill(
        ~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")).logsumexp(-1), atol=1e-6, rtol=1e-6)


def test_the_operator_can_turn_the_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_FUSED", "0")
    assert not compat.fused_available()


@pytest.mark.parametrize("family_id", ["llama", "gpt2"])
def test_a_captured_forward_is_the_same_on_either_path(family_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patterns, head scores and logits of a whole captured forward, fused vs the public fallback."""
    lm = wrap_model(f"tiny-{family_id}", _family(family_id).build("eager"), tiny_tokenizer(), source="config")
    runs = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("ATTNSCOPE_FUSED", fused)
        with lm.lock:
            runs[fused] = scored_run(lm, IDS)
    (a, _sa, a_heads), (b, _sb, b_heads) = runs["1"], runs["0"]
    for layer in range(lm.info.n_layers):
        torch.testing.assert_close(a[act_name("pattern", layer)], b[act_name("pattern", layer)], atol=1e-5, rtol=0)
    torch.testing.assert_close(a["logits"], b["logits"], atol=1e-4, rtol=1e-4)
    for sa, sb in zip(a_heads, b_heads, strict=True):
        for field in ("entropy", "prev_token", "first_token", "max", "induction"):
            assert getattr(sa, field) == pytest.approx(getattr(sb, field), abs=1e-5), (sa, field)


@pytest.mark.parametrize("family_id", ["llama", "gpt2"])
def test_output_attentions_is_answered_on_every_family(family_id: str) -> None:
    """The weights come back when asked (gpt2 pops the keyword before its attention runs, llama passes
    it down), equal to eager attention's, and not when not asked; inside generate too."""
    fam = _family(family_id)
    ids = IDS[None, :40]
    with torch.inference_mode():
        ref = fam.build("eager")(input_ids=ids, output_attentions=True).attentions
    lm = wrap_model(f"tiny-{family_id}", fam.build("eager"), tiny_tokenizer(), source="config")
    with torch.inference_mode():
        plain = lm.model(input_ids=ids)
        assert not plain.attentions
        got = lm.model(input_ids=ids, output_attentions=True).attentions
        steps = lm.model.generate(input_ids=ids, max_new_tokens=2, do_sample=False, output_attentions=True,
                                  return_dict_in_generate=True).attentions
    assert len(got) == len(ref) == lm.info.n_layers
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)
    assert len(steps) == 2 and all(len(step) == lm.info.n_layers for step in steps)
    torch.testing.assert_close(steps[0][0], ref[0], atol=1e-5, rtol=0)  # the prefill's first layer


def test_a_borrowed_model_keeps_no_hook_of_ours() -> None:
    """The Python door's borrow watches the output flag for the borrow only: the user's model leaves
    with the hooks it came with, and a failing forward inside still pops its flag."""
    model = _family("llama").build("sdpa")

    def ours() -> int:  # hooks of ours on the model (transformers adds its own output recorders lazily)
        return sum(hook in (interface._push_flag, interface._pop_flag) for m in model.modules()
                   for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))

    lm = inspect_model("user", model, tiny_tokenizer(), source="python")
    assert ours() == 0
    with borrowed(lm):
        assert ours() == 4  # a pre-hook and a hook on LlamaForCausalLM and on LlamaModel
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.full((1, 4), 10_000))  # out of the vocabulary: the forward raises
        assert interface._OUTPUT_ATTENTIONS.get() == ()
        assert model(input_ids=IDS[None, :20], output_attentions=True).attentions
    assert ours() == 0
    assert compat.attention_implementation(model) == "sdpa"
