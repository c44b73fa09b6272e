"""The Python door to run files (#30): run.save(path), attnscope.load(path) without a model, scope.load(path)
with its tools — refused, with the reason, once the model has changed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnscope
from attnscope.model.errors import EngineError, RunDetached
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat; the cat sat on the mat."


def llama() -> torch.nn.Module:
    return next(f for f in FAMILIES if f.model_type == "llama").build("sdpa")


def test_a_saved_run_reads_back_without_a_model_and_onto_one(tmp_path: Path) -> None:
    scope = attnscope.Scope(llama(), tiny_tokenizer(), name="mine")
    run = scope.run(TEXT)
    scores = run.heads()
    path = run.save(tmp_path / "run.attnscope")
    assert path.read_bytes()[8:400].find(b"attnscope-run/1") >= 0

    alone = attnscope.load(path)  # no model at all
    assert alone.text == TEXT and alone.model == "mine" and [t.id for t in alone.tokens] == [t.id for t in run.tokens]
    assert alone.heads() == scores and alone.scores_pending == ()
    torch.testing.assert_close(alone.attention(1, 2), run.attention(layer=1, head=2), rtol=0, atol=0)
    with pytest.raises(EngineError) as out_of_range:
        alone.attention(9, 0)
    assert out_of_range.value.code == "layer_out_of_range"

    other = attnscope.Scope(scope.model.model, tiny_tokenizer(), name="another-name")  # the same weights
    again = other.load(path)
    torch.testing.assert_close(again.attention(layer=0, head=1), run.attention(layer=0, head=1), rtol=0, atol=0)
    last = len(run.tokens) - 1
    before = run.ablate(heads=[(1, 1)]).positions[last].kl
    assert again.ablate(heads=[(1, 1)]).positions[last].kl == pytest.approx(before, rel=1e-4, abs=1e-6)


def test_a_run_loaded_after_the_model_changed_shows_its_attention_and_refuses_the_tools(tmp_path: Path) -> None:
    model = llama()
    scope = attnscope.Scope(model, tiny_tokenizer(), name="mine")
    run = scope.run(TEXT)
    attention = run.attention(layer=1, head=0)
    path = run.save(tmp_path / "run.attnscope")
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)  # edited in memory after the run was saved
    loaded = scope.load(path)
    torch.testing.assert_close(loaded.attention(layer=1, head=0), attention, rtol=0, atol=0)
    with pytest.raises(RunDetached) as refused:
        loaded.ablate(heads=[(1, 1)])
    assert refused.value.code == "run_model_changed" and refused.value.params == {"model": "mine"}
    assert scope.run(TEXT).ablate(heads=[(1, 1)]).positions  # a new run on the edited model: tools as ever
