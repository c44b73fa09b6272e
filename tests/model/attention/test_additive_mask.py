"""A model's own additive mask through the capture point: ALiBi Falcon (transformers >= 5.25) adds its
position bias into the mask tensor. The capture adds that mask to the logits as the eager code does,
and keeps it as the causal mask plus a per-key bias; a mask that is not that is refused, never kept wrong."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnscope.model.attention import interface
from attnscope.model.attention.interface import attnscope_attention
from attnscope.model.capture.forward import Captures, run_with_cache
from attnscope.model.errors import AttentionUnavailable
from attnscope.model.load.models import wrap_model
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

N = 12


def _additive(bias: torch.Tensor, n: int) -> torch.Tensor:
    """(1, H, n, n): bias (H, n, n) where causal, finfo.min elsewhere (FalconModel's construction)."""
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return bias.masked_fill(~causal, torch.finfo(torch.float32).min)[None]


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float) -> torch.Tensor:
    """(1, n, H, dv): the families' eager attention with an additive mask."""
    w = (torch.matmul(q, k.transpose(-1, -2)) * scaling + mask).softmax(-1)
    return torch.matmul(w, v).transpose(1, 2)


def _capture(mask: torch.Tensor, scaling: float = 0.5) -> tuple[Captures, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, N, 4, generator=gen) for _ in range(3))
    module, store = nn.Module(), Captures(lambda _name: False)
    interface.activate([module], store)
    try:
        out, _ = attnscope_attention(module, q, k, v, mask, scaling=scaling)
    finally:
        interface.deactivate([module])
    return store, out, _eager(q, k, v, mask, scaling)


def test_a_per_key_bias_is_added_and_kept() -> None:
    bias = torch.linspace(-2.0, 0.0, N).repeat(2, 1) * torch.tensor([[1.0], [0.5]])  # (H, n): per head and key
    store, out, want = _capture(_additive(bias[:, None, :].expand(2, N, N), N))
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    record = store.records[0]
    assert record.bias is not None and torch.equal(record.bias, bias)
    assert record.mask.fused_causal() is True  # kept as the causal mask over the whole run


def test_a_mask_that_is_not_a_per_key_bias_is_refused() -> None:
    """Values that differ from row to row (a relative-position bias) cannot be kept as a per-key bias."""
    per_cell = torch.randn(2, N, N, generator=torch.Generator().manual_seed(4))
    with pytest.raises(AttentionUnavailable, match="its own attention mask"):
        _capture(_additive(per_cell, N))


def test_alibi_falcon_is_read_through_the_capture_point_with_its_bias() -> None:
    fam = next(f for f in FAMILIES if f.id == "falcon")
    assert fam.options["alibi"] and fam.options["multi_query"]
    lm = wrap_model("tiny-falcon", fam.build("eager"), tiny_tokenizer(), source="config:falcon")
    assert lm.model.config._attn_implementation == "attnscope_dense_mask"
    assert lm.info.n_kv_heads == 1 and lm.info.position_encoding == "alibi"
    ids = torch.arange(10, 10 + N)
    with lm.lock:
        acts = run_with_cache(lm, ids)
    heads, d_head = lm.info.n_heads, lm.info.d_head
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, N, dtype=torch.long), heads, torch.float32).reshape(heads, N)
    for layer in acts.layers:
        assert layer.k.shape[0] == 1  # the one K/V head of multi-query attention, not repeated
        assert layer.bias is not None
        torch.testing.assert_close(layer.bias, alibi / math.sqrt(d_head), atol=0, rtol=0)
