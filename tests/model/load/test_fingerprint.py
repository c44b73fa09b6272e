"""Model and tokenizer fingerprints (``model/load/fingerprint.py``): the same weights give the same
fingerprint wherever they were loaded from; any edit made in memory changes it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from attnscope.model.load.fingerprint import model_fingerprint, tokenizer_fingerprint
from tests.support.families import FAMILIES
from tests.support.tiny import BUNDLED
from tests.support.tinytok import tiny_tokenizer


def _llama() -> PreTrainedModel:
    return next(f for f in FAMILIES if f.id == "llama").build("eager")


def test_the_same_weights_give_the_same_fingerprint(tmp_path: Path) -> None:
    a = AutoModelForCausalLM.from_pretrained(BUNDLED)
    a.save_pretrained(tmp_path / "copy")
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "copy")  # another folder: its path is not the model
    fp = model_fingerprint(a)
    assert len(fp) == 64 and fp == model_fingerprint(a) == model_fingerprint(b)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # integer sums: the same in any order of reduction
    try:
        assert model_fingerprint(a) == fp
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_edit_in_memory_changes_it(dtype: torch.dtype) -> None:
    model = _llama().to(dtype)
    before = model_fingerprint(model)
    weight = model.model.layers[1].self_attn.q_proj.weight
    with torch.no_grad():
        kept = weight.clone()
        weight.mul_(3)  # one matrix scaled
        scaled = model_fingerprint(model)
        weight.copy_(kept)
        assert model_fingerprint(model) == before  # restored: the same again
        weight[3, 5] = torch.nextafter(weight[3, 5].float(), torch.tensor(10.0)).to(dtype)  # one element, one ulp
        if weight[3, 5] == kept[3, 5]:  # bf16 cannot hold that step: change it by one of its own ulps
            weight[3, 5] = (kept[3, 5].float() * 1.01).to(dtype)
        one = model_fingerprint(model)
        weight.copy_(kept)
        weight[0, 0], weight[0, 1] = kept[0, 1].clone(), kept[0, 0].clone()  # two elements swapped
        swapped = model_fingerprint(model)
    assert len({before, scaled, one, swapped}) == 4
    # a fresh build is the same model; its bf16 copy is not
    assert (before == model_fingerprint(_llama())) == (dtype == torch.float32)


def test_a_config_change_changes_it() -> None:
    a, b = _llama(), _llama()
    b.config.rms_norm_eps = 1e-3
    assert model_fingerprint(a) != model_fingerprint(b)
    b.config.rms_norm_eps = a.config.rms_norm_eps
    b.config._attn_implementation = "sdpa"  # how attention is dispatched is not the model
    assert model_fingerprint(a) == model_fingerprint(b)


def test_a_forward_and_derived_buffers_leave_it_alone() -> None:
    """Rotary frequencies are derived from the config (dynamic rope rewrites them during a forward)."""
    model = _llama()
    before = model_fingerprint(model)
    with torch.inference_mode():
        model(input_ids=torch.arange(6, 30)[None])
    with torch.no_grad():
        model.model.rotary_emb.inv_freq.mul_(0.5)
    assert model_fingerprint(model) == before


def test_a_model_on_the_meta_device_is_refused() -> None:
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="meta"):
        model_fingerprint(model)


def test_tokenizer_fingerprints() -> None:
    a, b = AutoTokenizer.from_pretrained(BUNDLED), AutoTokenizer.from_pretrained(BUNDLED)
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(tiny_tokenizer())
    b.add_special_tokens({"additional_special_tokens": ["<|new|>"]})
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(b)
