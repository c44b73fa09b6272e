"""The memory-efficient CUDA kernel's wrapping and its check, run here on the CPU with stand-in kernels
(this machine has no GPU; ``tests/model/test_gpu.py`` runs the real one where there is one): grouped
K/V heads expanded, the padded log-sum-exp cut to the rows, and a kernel that strays, raises or answers
in other shapes refused with a reason, so that the block path serves instead."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from attnscope.model import compat


def kernel(shift: float = 0.0, pad_to: int = 32) -> Any:
    """A stand-in with the CUDA op's signature and answer: (output, lse padded to ``pad_to`` rows, seed,
    offset); it takes as many K/V heads as query heads, as the real one does. ``shift`` spoils its lse."""

    def op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: Any, compute_log_sumexp: bool,
           dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None) -> tuple[torch.Tensor, ...]:
        assert key.shape[1] == query.shape[1] == value.shape[1], "the kernel takes no grouped heads"
        assert attn_bias is None and compute_log_sumexp and dropout_p == 0.0 and scale is not None
        out, lse = compat._reference(query, key, value, scale, is_causal)
        rows = query.shape[2]
        padded = torch.full((*lse.shape[:-1], -(-rows // pad_to) * pad_to), 1e9)  # the padding rows: junk
        padded[..., :rows] = lse + shift
        return out.to(query.dtype), padded, torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)

    return op


@pytest.mark.parametrize("causal", [True, False])
def test_grouped_heads_are_expanded_and_the_padded_lse_cut(causal: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 45, 8, generator=gen)  # (B, H, n, dh): 3 query heads per K/V head
    k, v = torch.randn(1, 2, 45, 8, generator=gen), torch.randn(1, 2, 45, 8, generator=gen)
    out, lse = compat._efficient(kernel(), q, k, v, 0.3, causal)
    z = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(3, 1)) * 0.3
    if causal:
        z = z.masked_fill(torch.ones(45, 45, dtype=torch.bool).triu(1), float("-inf"))
    assert lse.shape == (1, 6, 45) and lse.dtype == torch.float32
    torch.testing.assert_close(lse, z.logsumexp(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out, z.softmax(-1) @ v.repeat_interleave(3, 1), atol=1e-5, rtol=0)


def test_a_kernel_that_computes_the_reference_passes_the_check() -> None:
    assert compat.check_fused(kernel(), torch.device("cpu"), torch.float32) is None
    assert compat.check_fused(kernel(), torch.device("cpu"), torch.bfloat16) is None  # within bfloat16's tolerance


def raising(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("no kernel image is available for execution on the device")


def unpadded_rows(*args: Any, **kwargs: Any) -> Any:
    out, lse, seed, offset = kernel()(*args, **kwargs)
    return out[..., :-1, :], lse, seed, offset


@pytest.mark.parametrize(("op", "why"), [
    (kernel(shift=0.01), "strays from the reference by 0 in the output and 0.01 in the lse (tolerance 0.0001)"),
    (kernel(shift=float("nan")), "and nan in the lse"),
    (raising, "raised RuntimeError: no kernel image"),
    (unpadded_rows, "shapes"),
])
def test_a_kernel_that_strays_raises_or_misshapes_is_refused_with_the_reason(op: Any, why: str) -> None:
    found = compat.check_fused(op, torch.device("cpu"), torch.float32)
    assert found is not None and why in found, found


def test_cuda_is_served_only_where_the_check_passed(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    compat.forget_checks()
    monkeypatch.setattr(compat, "check_fused", lambda op, device, dtype: "it strays from the reference by 1")
    monkeypatch.setattr(compat, "_cuda_op", lambda: kernel())
    try:
        with caplog.at_level(logging.INFO, logger="attnscope.model.compat"):
            assert not compat.fused_on(torch.device("cuda", 0), torch.bfloat16)
            assert not compat.fused_on(torch.device("cuda", 0), torch.bfloat16)  # checked once
        said = [r.getMessage() for r in caplog.records]
        assert said == ["the fused CUDA attention does not serve cuda:0 in torch.bfloat16 (it strays from the "
                        "reference by 1): the block path does"]
        compat.forget_checks()
        monkeypatch.setattr(compat, "check_fused", lambda op, device, dtype: None)
        assert compat.fused_on(torch.device("cuda"), torch.float32)  # no index: device 0
        monkeypatch.setenv("ATTNSCOPE_FUSED", "0")
        assert not compat.fused_on(torch.device("cuda", 0), torch.float32)  # turned off, whatever the check
        monkeypatch.delenv("ATTNSCOPE_FUSED")
        compat.forget_checks()
        monkeypatch.setattr(compat, "_cuda_op", lambda: None)  # a build without the kernel
        assert not compat.fused_on(torch.device("cuda", 0), torch.float32)
    finally:
        compat.forget_checks()


def test_the_cpu_answer_is_the_cpu_kernels_and_other_devices_take_the_block_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert compat.fused_on(torch.device("cpu"), dtype) == (compat.fused_available()
                                                               and dtype in compat.fused_dtypes())
    assert not compat.fused_on(torch.device("meta"), torch.float32)
    monkeypatch.setenv("ATTNSCOPE_FUSED", "0")
    assert not compat.fused_on(torch.device("cpu"), torch.float32)


def test_a_check_that_ran_out_of_memory_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["the kernel raised OutOfMemoryError: CUDA out of memory", None])
    monkeypatch.setattr(compat, "check_fused", lambda op, device, dtype: next(answers))
    monkeypatch.setattr(compat, "_cuda_op", lambda: kernel())
    compat.forget_checks()
    try:
        assert not compat.cuda_fused_ok(0, torch.float16)  # not remembered
        assert compat.cuda_fused_ok(0, torch.float16)  # checked again, and this time it passed
        assert compat.cuda_fused_ok(0, torch.float16)  # remembered: the iterator has no third answer
    finally:
        compat.forget_checks()


def test_a_call_the_kernel_refuses_takes_the_block_path_and_is_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from attnscope.model.attention import interface

    def refuse(*_args: Any) -> Any:
        raise RuntimeError("invalid configuration argument")

    monkeypatch.setattr(compat, "fused_on", lambda device, dtype: True)
    monkeypatch.setattr(compat, "fused_attention", refuse)
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    with caplog.at_level(logging.WARNING, logger="attnscope.model.compat"):
        out, lse = interface.flash_attention(q, k, v, 0.5, True)
        interface.flash_attention(q, k, v, 0.5, True)
    want_out, want_lse = compat._reference(q, k, v, 0.5, True)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=0)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["the fused attention refused cpu torch.float32 with head size 8 (invalid configuration argument): "
                    "the block path serves it"]
