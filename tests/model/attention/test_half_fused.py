"""bfloat16 and float16 on the CPU take the fused kernel (output and log-sum-exp in one call) where this
torch build's kernel has that dtype: the capture logs which path once per model, and the weights rebuilt
from the kept Q, K and normalisers are no further from a float32 model's than transformers' own eager
attention in that dtype is (measured here, per family: the tolerance is the dtype's, not ours)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from attnscope.model import compat
from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.names import act_name
from attnscope.model.load.models import wrap_model
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

IDS = torch.tensor(([7] * 6 + list(range(20, 50)) + [9, 10, 11] * 8)[:60])
HALF = [torch.bfloat16, torch.float16]


def _family(family_id: str) -> Any:
    return next(f for f in FAMILIES if f.id == family_id)


def _eager_attentions(model: Any) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [a[0].float() for a in model(input_ids=IDS[None], output_attentions=True).attentions]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family_id", ["llama", "gpt2"])
def test_half_precision_runs_fused_and_stays_within_its_own_tolerance(
        family_id: str, dtype: torch.dtype, caplog: pytest.LogCaptureFixture) -> None:
    if dtype not in compat.fused_dtypes():
        pytest.skip(f"this torch build's fused CPU kernel takes no {dtype}: the block path serves it")
    fam = _family(family_id)
    reference = _eager_attentions(fam.build("eager"))  # float32, transformers' own eager attention
    half = fam.build("eager").to(dtype)
    eager_half = _eager_attentions(copy.deepcopy(half))  # the same weights in dtype, eager
    lm = wrap_model(f"tiny-{family_id}-{dtype}", half, tiny_tokenizer(), source="config")
    with caplog.at_level(logging.INFO, logger="attnscope.model.capture.forward"), lm.lock:
        acts = run_with_cache(lm, IDS)
        run_with_cache(lm, IDS)  # a second forward says nothing more
    said = [r.getMessage() for r in caplog.records if "attention through" in r.getMessage()]
    assert said == [f"tiny-{family_id}-{dtype}: attention through the fused kernel on {lm.info.n_layers} of "
                    f"{lm.info.n_layers} layers (cpu, {str(dtype).removeprefix('torch.')})"], said
    for layer in range(lm.info.n_layers):
        ours = acts.layers[layer]
        assert ours.lse.dtype == torch.float32 and ours.q.dtype == torch.float32  # kept in float32
        pattern = acts.layers[layer].pattern() if hasattr(ours, "pattern") else None
        rebuilt = torch.stack([ours.rows(h, 0, ours.n, 0, ours.n)[0] for h in range(ours.n_heads)])  # (H, n, n)
        assert pattern is None or torch.equal(pattern, rebuilt)
        own = (eager_half[layer] - reference[layer]).abs().max().item()  # the dtype's own error, eager
        got = (rebuilt - reference[layer]).abs().max().item()
        assert got <= 1.5 * own + 1e-4, (layer, got, own)
        torch.testing.assert_close(rebuilt.sum(-1), torch.ones(ours.n_heads, ours.n), atol=2e-3, rtol=0)
    assert act_name("resid_post", lm.info.n_layers - 1) in acts


def test_float32_says_its_path_once(caplog: pytest.LogCaptureFixture) -> None:
    lm = wrap_model("tiny-llama-said", _family("llama").build("eager"), tiny_tokenizer(), source="config")
    with caplog.at_level(logging.INFO, logger="attnscope.model.capture.forward"), lm.lock:
        for _ in range(3):
            run_with_cache(lm, IDS)
    said = [r.getMessage() for r in caplog.records if "attention through" in r.getMessage()]
    expected = "fused kernel" if compat.fused_available() else "block path"
    assert len(said) == 1 and expected in said[0] and "(cpu, float32)" in said[0], said
