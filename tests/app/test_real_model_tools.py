"""#37 item 7 on the real model: Patch's default pair separates SmolLM2 and the bundled model, Learn's
embedding view samples a vocabulary too large to sweep, Save as HTML keeps every head of a short run."""

from __future__ import annotations

import pytest

from attnscope.app.standalone import plan
from attnscope.model.learn import embedding
from attnscope.model.load import sources
from attnscope.model.load.models import load_model
from attnscope.model.services import tools
from tests.support.tiny import make_engine


@pytest.fixture(scope="module")
def smol_engine():  # type: ignore[no-untyped-def]
    if sources.known_file("smollm2-135m") is None:
        pytest.skip("SmolLM2-135M is not installed (~/.cache/attnscope/gguf)")
    return make_engine({"smol": load_model("smol", "smollm2-135m"),
                        "tiny": load_model("tiny", "bundled:attnscope-tiny")}, "smol")


@pytest.mark.parametrize("model", ["smol", "tiny"])
def test_patch_example_separates_the_model(smol_engine, model: str) -> None:  # type: ignore[no-untyped-def]
    ex = tools.patch_example(smol_engine, model=model)
    assert ex.separated and ex.clean_metric > 0 and ex.clean_metric - ex.corrupted_metric >= 0.5
    assert (ex.tflop > 0.2) == (model == "smol")  # the page starts it by itself only on the small model


def test_embedding_samples_a_large_vocabulary(smol_engine) -> None:  # type: ignore[no-untyped-def]
    lm = smol_engine.model("smol")
    assert not embedding.swept(lm)
    e = embedding.neighbours(lm, 1000, 8)
    assert e.untrained_examined == embedding.SAMPLE_ROWS and len(e.neighbours) == 8


def test_short_run_of_270_heads_keeps_every_head() -> None:
    run = {"run_id": "r", "tokens": [{}] * 46, "n_layers": 30, "n_heads": 9, "causal": True}
    assert plan(run, None).every_head
    assert not plan({**run, "tokens": [{}] * 200}, None).every_head
