"""A run the Python door hands out is a value: it owns what its forward kept, so holding many never makes
an old one expire, and its activations are read by name as TransformerLens' cache gives them."""

from __future__ import annotations

import pytest
import torch

import attnscope
from attnscope.model.errors import BadInput, TooLarge
from attnscope.model.runs import activations
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat and the cat sat"


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, object]:
    family = next(f for f in FAMILIES if f.id == "llama")
    return family.build("eager"), tiny_tokenizer()


def test_activations_by_name_equal_the_models_own(llama: tuple[torch.nn.Module, object]) -> None:
    model, tok = llama
    scope = attnscope.Scope(model, tok)
    run = scope.run(TEXT)
    ids = run.record.input_ids[None]
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    n_layers = model.config.num_hidden_layers
    for layer in range(n_layers):
        torch.testing.assert_close(run["resid_pre", layer], out.hidden_states[layer][0].float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(run["pattern", layer], out.attentions[layer][0].float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(run[f"blocks.{layer}.attn.hook_pattern"], run["pattern", layer])
        resid = run["resid_pre", layer] + run["attn_out", layer] + run["mlp_out", layer]
        torch.testing.assert_close(resid, run["resid_post", layer], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(run["resid_post", -1], run["resid_post", n_layers - 1])
    q, k = run["rot_q", 0], run["rot_k", 0]
    assert q.shape == (model.config.num_attention_heads, ids.shape[1], q.shape[-1])
    assert k.shape[0] == model.config.num_key_value_heads
    names = run.names()
    assert "blocks.0.hook_resid_post" in names and f"blocks.{n_layers - 1}.attn.hook_rot_k" in names
    assert len(names) == 7 * n_layers
    run["resid_post", 0].zero_()  # a copy: the record is not changed through it
    assert run["resid_post", 0].abs().sum() > 0
    scope.close()


def test_bad_names_say_what_is_wanted(llama: tuple[torch.nn.Module, object]) -> None:
    scope = attnscope.Scope(*llama)
    run = scope.run(TEXT)
    with pytest.raises(KeyError, match="not an activation name"):
        run["blocks.0.hook_nothing"]
    with pytest.raises(KeyError, match="not an activation kind"):
        run["attention", 0]
    with pytest.raises(KeyError, match="give a name"):
        run[3]  # type: ignore[index]
    with pytest.raises(BadInput, match="layer 9 is out of range"):
        run["resid_post", 9]
    scope.close()


def test_a_pattern_too_large_to_build_whole_is_refused(llama: tuple[torch.nn.Module, object],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    scope = attnscope.Scope(*llama)
    run = scope.run(TEXT)
    monkeypatch.setattr(activations, "MAX_PATTERN_BYTES", 1000)
    with pytest.raises(TooLarge, match=r"whole pattern would take .* run.attention\(layer, head\)"):
        run["pattern", 0]
    assert run["resid_post", 0].shape[0] == run.record.n  # the kept tensors are not limited
    scope.close()


def test_a_held_run_never_expires(llama: tuple[torch.nn.Module, object]) -> None:
    """A Scope that keeps room for about two runs; ten runs held: every one still answers, with its own
    numbers, and the store stays within its cap while none is in use."""
    model, tok = llama
    probe = attnscope.Scope(model, tok)
    size = probe.run(TEXT).record.nbytes
    probe.close()
    scope = attnscope.Scope(model, tok, keep_bytes=size * 5 // 2)
    animals = ["cat", "dog", "cow", "pig", "hen", "rat", "bat", "fox", "owl", "ant"]
    runs = [scope.run(TEXT.replace("cat", animal)) for animal in animals]
    assert len(scope.engine.store) < 10  # the store let most go
    for i, run in enumerate(runs):
        assert animals[i] in run.text
        heads = run.heads()
        assert len(heads) == model.config.num_hidden_layers * model.config.num_attention_heads
        att = run.attention(0, 0)
        assert att.shape == (run.record.n, run.record.n)
        torch.testing.assert_close(att.sum(-1), torch.ones(run.record.n), atol=1e-5, rtol=0)
        assert run.lens(top_k=1).n == run.record.n
        assert scope.engine.store.nbytes <= max(scope.engine.store.max_bytes, run.record.nbytes)
    other = scope.compare(runs[0], runs[1])  # both brought back for the comparison
    assert other is not None
    scope.close()
