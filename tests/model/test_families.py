"""Every supported family, on a tiny random config built here: the captured patterns are
the model's own (``output_attentions=True`` of its eager attention), the family's residual
identity holds, the last layer's logit lens is the model's logits with every final
transform, and the engine's predictions, next-token view and generation agree with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from attnscope.model.attention.interface import active_count
from attnscope.model.capture.forward import Captures, run_with_cache
from attnscope.model.capture.generation import GenerationSession, SamplingParams
from attnscope.model.capture.names import act_name, kind_of
from attnscope.model.families.table import SUPPORTED, spec_for
from attnscope.model.load.models import LoadedModel, wrap_model
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.scores import live
from attnscope.model.services import runs
from attnscope.model.services.engine import Engine
from tests.support.families import DECODERS, ENCODERS, FAMILIES, Family
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

N = 16  # longer than every sliding window in tests/support/families.py
ATOL = 1e-5
TEXT = "the cat sat on the mat; the cat sat."


@dataclass
class Built:
    family: Family
    lm: LoadedModel
    ids: torch.Tensor  # (N,)
    ref: Any  # the eager model's output: attentions, logits / hidden states
    acts: Captures


_BUILT: dict[str, Built] = {}


def built(family: Family) -> Built:
    """Each family built once per session: eager reference first, then switched to attnscope's capture."""
    if family.id not in _BUILT:
        model = family.build("eager")
        ids = torch.randint(6, 256, (N,), generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            ref = model(input_ids=ids[None], output_attentions=True, output_hidden_states=True)
        lm = wrap_model(f"tiny-{family.id}", model, tiny_tokenizer(), source=f"config:{family.id}")
        with lm.lock:
            acts = run_with_cache(lm, ids)
        _BUILT[family.id] = Built(family, lm, ids, ref, acts)
    return _BUILT[family.id]


def test_the_table_covers_every_tested_family() -> None:
    assert sorted({f.model_type for f in FAMILIES}) == sorted(SUPPORTED)
    assert len({f.id for f in FAMILIES}) == len(FAMILIES)  # variants of a family have their own ids


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.id)
def test_patterns_equal_output_attentions(family: Family) -> None:
    b = built(family)
    assert len(b.ref.attentions) == b.lm.info.n_layers
    for i, expected in enumerate(b.ref.attentions):
        got = b.acts[act_name("pattern", i)]
        assert got.dtype == torch.float32 and got.shape == (b.lm.info.n_heads, N, N)
        torch.testing.assert_close(got, expected[0].float(), atol=ATOL, rtol=0)
    assert active_count() == 0  # the capture point was released


def _windowed(family: Family) -> bool:
    return any(k in family.options for k in ("sliding_window", "window_size", "local_attention"))


@pytest.mark.parametrize("family", [f for f in FAMILIES if _windowed(f)], ids=lambda f: f.id)
def test_sliding_windows_are_in_the_patterns(family: Family) -> None:
    """At least one layer hides keys that a full (causal) layer would see."""
    b = built(family)
    full = torch.ones(N, N, dtype=torch.bool)
    if family.causal:
        full = full.tril()
    hidden = [bool((b.acts[act_name("pattern", i)][:, full] == 0).any()) for i in range(b.lm.info.n_layers)]
    assert any(hidden)


def test_soft_capped_attention_differs_from_uncapped() -> None:
    """Gemma-2's attention soft-cap is in force (so the parity above covers it)."""
    gemma2 = next(f for f in FAMILIES if f.id == "gemma2")
    capped = built(gemma2).acts[act_name("pattern", 0)]
    model = gemma2.build("eager", attn_logit_softcapping=None)
    with torch.inference_mode():
        uncapped = model(input_ids=built(gemma2).ids[None], output_attentions=True).attentions[0][0]
    assert (capped - uncapped).abs().max() > 1e-3


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-5, msg=what)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.id)
def test_residual_identity(family: Family) -> None:
    b = built(family)
    spec, acts = b.lm.spec, b.acts
    _close(acts[act_name("resid_pre", 0)], b.ref.hidden_states[0][0], "embedding output")
    for i, block in enumerate(b.lm.blocks):
        pre, post = acts[act_name("resid_pre", i)], acts[act_name("resid_post", i)]
        attn, mlp = acts[act_name("attn_out", i)], acts[act_name("mlp_out", i)]
        if spec.residual == "post_norm":
            assert spec.post_norms is not None
            ln1, ln2 = (block.get_submodule(p) for p in spec.post_norms)
            with torch.inference_mode():
                _close(ln2(ln1(pre + attn) + mlp), post, f"layer {i}: LN2(LN1(pre + attn) + mlp)")
        else:
            _close(pre + attn + mlp, post, f"layer {i}: pre + attn + mlp ({spec.residual})")
        if i + 1 < b.lm.info.n_layers:
            assert torch.equal(post, acts[act_name("resid_pre", i + 1)])


PARALLEL_MLP_INPUT = {"gptj": "ln_1", "phi": "input_layernorm", "cohere": "input_layernorm",
                      "gpt_neox": "post_attention_layernorm", "falcon": "input_layernorm"}


@pytest.mark.parametrize("family", [f for f in DECODERS if f.id in PARALLEL_MLP_INPUT], ids=lambda f: f.id)
def test_parallel_blocks_feed_the_mlp_from_resid_pre(family: Family) -> None:
    b = built(family)
    assert b.lm.spec.residual == "parallel"
    block = b.lm.blocks[0]
    with torch.inference_mode():
        mlp = block.get_submodule(b.lm.spec.mlp_out)(block.get_submodule(PARALLEL_MLP_INPUT[family.id])(
            b.acts[act_name("resid_pre", 0)][None]))[0]
    _close(mlp, b.acts[act_name("mlp_out", 0)], "mlp(norm(resid_pre))")


@pytest.mark.parametrize("family", [f for f in DECODERS if f.id in ("gemma2", "gemma3_text", "olmo2")],
                         ids=lambda f: f.id)
def test_sandwich_contributions_are_the_normed_outputs(family: Family) -> None:
    b = built(family)
    assert b.lm.spec.residual == "sandwich"
    block = b.lm.blocks[0]
    raw: dict[str, torch.Tensor] = {}
    handle = block.get_submodule(b.lm.spec.attn).register_forward_hook(
        lambda _m, _a, out: raw.__setitem__("attn", out[0][0].detach()))
    try:
        with torch.inference_mode():
            b.lm.model(input_ids=b.ids[None])
    finally:
        handle.remove()
    with torch.inference_mode():
        normed = block.post_attention_layernorm(raw["attn"])
    _close(normed, b.acts[act_name("attn_out", 0)], "post_attention_layernorm(attn)")
    assert (raw["attn"] - normed).abs().max() > 1e-3  # the norm matters: the raw output would be wrong


@pytest.mark.parametrize("family", DECODERS, ids=lambda f: f.id)
def test_logit_lens_at_the_last_layer_is_the_models_logits(family: Family) -> None:
    b = built(family)
    last = b.acts[act_name("resid_post", b.lm.info.n_layers - 1)]
    head = b.lm.lm_head()
    assert head is not None
    _close(head.logits(last), b.ref.logits[0].float(), "lm_head().logits(resid_post[-1]) vs the model's logits")
    _close(b.acts["logits"], b.ref.logits[0].float(), "captured logits")


@pytest.mark.parametrize("family", [f for f in DECODERS if f.id in ("gemma2", "gemma3_text", "cohere", "granite")],
                         ids=lambda f: f.id)
def test_final_logit_transforms_are_applied(family: Family) -> None:
    """Without the family's transform (soft-cap, logit_scale, logits_scaling) the lens would be wrong."""
    b = built(family)
    last = b.acts[act_name("resid_post", b.lm.info.n_layers - 1)]
    unembed, norm = b.lm.unembed, b.lm.final_norm
    assert unembed is not None and norm is not None
    with torch.inference_mode():
        bare = unembed(norm(last)).float()
    assert (bare - b.ref.logits[0]).abs().max() > 1e-2


def _engine(b: Built) -> Engine:
    return make_engine({b.lm.info.name: b.lm}, b.lm.info.name)


@pytest.mark.parametrize("family", DECODERS, ids=lambda f: f.id)
def test_predictions_next_and_generation_agree_with_the_logits(family: Family) -> None:
    b = built(family)
    engine = _engine(b)
    result = engine.analyse(TEXT, top_k=3)
    ids = ids_tensor(tokenize(b.lm.tokenizer, TEXT))
    with torch.inference_mode():
        logits = b.lm.model(input_ids=ids[None]).logits[0].float()  # (n, V): the model's own
    probs = logits.softmax(-1)
    for pred in result.record.summary.predictions:
        top = probs[pred.position].topk(3)
        assert [c.id for c in pred.top] == top.indices.tolist()
        assert [c.prob for c in pred.top] == pytest.approx(top.values.tolist(), abs=1e-5)
    last = len(ids) - 1
    nxt = runs.next_distribution(engine, result.record, last, temperature=1.0, top_k=3)
    assert [c.prob for c in nxt.top] == pytest.approx(probs[last].topk(3).values.tolist(), abs=1e-5)
    lens = runs.logit_lens(engine, result.record, top_k=1).layers[-1].positions
    assert [p.top[0].id for p in lens] == probs.argmax(-1).tolist()
    session = GenerationSession(b.lm, ids, SamplingParams(max_new_tokens=3, temperature=0, top_k=0, top_p=1, seed=0))
    step = session.step()
    assert step.id == int(logits[-1].argmax())
    while not session.done:
        session.step()
    with torch.inference_mode():
        again = b.lm.model(input_ids=session.ids[None]).logits[0, len(ids):-1].argmax(-1)
    assert session.ids[len(ids) + 1 :].tolist() == again.tolist()  # each greedy step is the model's argmax


@pytest.mark.parametrize("family", DECODERS, ids=lambda f: f.id)
def test_recorded_generation_equals_a_fresh_forward(family: Family) -> None:
    """KV-cache steps (sliding-window caches included) stack into the patterns of one forward."""
    b = built(family)
    prompt = b.ids[:8]
    session = GenerationSession(b.lm, prompt, SamplingParams(max_new_tokens=6, temperature=1.0, top_k=0, top_p=1.0,
                                                             seed=3), record=True)
    while not session.done:
        session.step()
    recorded, recorded_heads = live.scored_recording(session)
    with b.lm.lock:
        fresh, _scores, fresh_heads = live.scored_run(b.lm, session.ids)
    for name, expected in fresh.items():
        if kind_of(name) in ("resid_pre", "attn_out", "mlp_out", "resid_post"):
            torch.testing.assert_close(recorded[name], expected, atol=1e-4, rtol=1e-4, msg=name)
    for i, (got, want) in enumerate(zip(recorded.layers, fresh.layers, strict=True)):  # what a run keeps: O(n d)
        torch.testing.assert_close(got.q, want.q, atol=1e-4, rtol=1e-4, msg=f"layer {i} Q")
        torch.testing.assert_close(got.k, want.k, atol=1e-4, rtol=1e-4, msg=f"layer {i} K")
        torch.testing.assert_close(got.lse, want.lse, atol=1e-4, rtol=1e-4, msg=f"layer {i} row normalisers")
        torch.testing.assert_close(got.dense(), want.dense(), atol=1e-4, rtol=1e-4, msg=f"layer {i} pattern")
    for got_s, want_s in zip(recorded_heads, fresh_heads, strict=True):
        assert got_s.entropy == pytest.approx(want_s.entropy, abs=1e-4) and got_s.max == pytest.approx(want_s.max, abs=1e-4)


@pytest.mark.parametrize("family", ENCODERS, ids=lambda f: f.id)
def test_encoders_see_the_whole_sequence(family: Family) -> None:
    b = built(family)
    assert not b.lm.info.causal and not b.lm.info.has_lm_head
    assert (b.acts[act_name("pattern", 0)][:, 0, -1] > 0).all()


def test_an_unsupported_family_is_refused_naming_the_supported_ones() -> None:
    from transformers import AutoConfig

    from attnscope.model.families.table import UnsupportedArchitecture

    with pytest.raises(UnsupportedArchitecture) as err:
        spec_for(AutoConfig.for_model("mamba"))
    message = str(err.value)
    assert "'mamba' is not supported" in message and "\n" not in message
    assert all(name in message for name in SUPPORTED)
