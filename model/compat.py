"""The only place attnscope touches a torch or transformers name that is not plainly public.

Everything else in ``model/`` and ``app/`` reaches the libraries through public names
(``tests/test_public_api.py`` fails on any other underscore name). Each entry here says why no public
name serves, is read defensively, and has a public fallback that the tests run too:

* ``attention_implementation`` reads ``config._attn_implementation``: transformers (5.25) has a public
  setter, ``PreTrainedModel.set_attn_implementation``, but no public getter; its attention-interface
  guide reads this attribute. Fallback: ``None`` (nothing known), which the callers treat as "switch
  to ours, restore nothing".
* ``fused_attention`` calls ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``: the kernel
  ``torch.nn.functional.scaled_dot_product_attention`` runs on the CPU, called directly because it also
  returns each row's log-sum-exp, which no public torch function returns without materialising the
  weights (``flex_attention``'s ``return_lse`` needs ``torch.compile`` to be fused; eager it builds every
  score). Gated by :func:`fused_available` (the op exists in this torch build, and
  ``ATTNSCOPE_FUSED=0`` is not set); where it is not, the capture runs its block path, which uses
  public operators only and computes the same weights (``tests/model/attention/test_interface.py``).
* ``fused_attention`` on CUDA calls ``torch.ops.aten._scaled_dot_product_efficient_attention`` with
  ``compute_log_sumexp``: the memory-efficient kernel SDPA runs on CUDA in float32, bfloat16 and float16,
  the one that returns each row's log-sum-exp for every dtype (the flash kernel's takes half precision
  only). Same reason, same gate, and one more: before its first use on a device and dtype it is checked
  against the same attention from public operators on a small input (``cuda_fused_ok``); where that check
  fails or raises, the block path serves that device and dtype, and the log says why.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any

import torch

log = logging.getLogger(__name__)

_FUSED_OP = "_scaled_dot_product_flash_attention_for_cpu"
_CUDA_OP = "_scaled_dot_product_efficient_attention"


def attention_implementation(model: Any) -> str | None:
    """The attention implementation a transformers model runs now ("sdpa", "eager", "attnscope", ...),
    or None where the config does not say (see the module's note)."""
    config = getattr(model, "config", None)
    value = getattr(config, "_attn_implementation", None)
    return value if isinstance(value, str) else None


def _aten(name: str) -> Any:
    """A private aten op by name, or None where this torch build has none."""
    try:
        return getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):  # torch.ops raises either for an unknown op
        return None


def _fused_op() -> Any:
    """The private fused CPU kernel, or None where this torch build has none."""
    return _aten(_FUSED_OP)


def _cuda_op() -> Any:
    """The private memory-efficient CUDA kernel, or None where this torch build has none."""
    return _aten(_CUDA_OP)


def _switched_off() -> bool:
    """ATTNSCOPE_FUSED=0: every fused path off (read each call, so a test or an operator can turn it off
    without a restart)."""
    return os.environ.get("ATTNSCOPE_FUSED", "1") == "0"


def fused_available() -> bool:
    """Whether the fused CPU kernel with log-sum-exp may run: it exists, and it is not switched off."""
    return not _switched_off() and _fused_op() is not None


def fused_on(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``fused_attention`` serves tensors of this device and dtype: the CPU kernel where this build's
    takes the dtype (``fused_dtypes``), the CUDA kernel where its check on this device passed
    (``cuda_fused_ok``); never with ATTNSCOPE_FUSED=0."""
    if device.type == "cpu":
        return fused_available() and dtype in fused_dtypes()
    if device.type == "cuda":
        return not _switched_off() and cuda_fused_ok(device.index if device.index is not None else 0, dtype)
    return False


def _efficient(op: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
               is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The memory-efficient kernel's (output (B, H, q, dv), lse (B, H, q) float32). It takes as many K/V heads
    as query heads: grouped ones are expanded as ``repeat_interleave`` groups them (O(n H dh) more, never
    n x n); its lse comes padded to a multiple of 32 rows."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out, lse, _seed, _offset = op(query, key, value, None, True, 0.0, is_causal, scale=scaling)
    return out, lse[..., : query.shape[2]].float()


def _reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
               is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The same attention from public operators in float32, whole (small inputs only)."""
    groups = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)
    v = value.float().repeat_interleave(groups, dim=1)
    z = torch.matmul(query.float(), k.transpose(-1, -2)) * scaling  # (B, H, q, kv)
    if is_causal:
        z = z.masked_fill(torch.ones(z.shape[-2:], dtype=torch.bool, device=z.device).triu(1), float("-inf"))
    lse = z.logsumexp(-1)
    return torch.matmul((z - lse[..., None]).exp(), v), lse


# how far the kernel may stray from the float32 reference: float32 as the CPU kernel's tests ask; half
# precision as its inputs' rounding allows (its products still accumulate in float32)
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def check_fused(op: Any, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``op`` (``_efficient``'s kernel) must not serve this device and dtype, or None where it computes the
    reference's output and lse on a small grouped input, causal and not (a row count not a multiple of 32)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 37, 16, generator=gen).to(device, dtype)  # (B, H, n, dh): 2 query heads per K/V head
    k = torch.randn(1, 2, 37, 16, generator=gen).to(device, dtype)
    v = torch.randn(1, 2, 37, 16, generator=gen).to(device, dtype)
    tol = CHECK_TOLERANCE.get(dtype, 1e-4)
    for causal in (True, False):
        try:
            out, lse = _efficient(op, q, k, v, 0.25, causal)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as err:
            return f"the kernel raised {type(err).__name__}: {err}"
        want_out, want_lse = _reference(q, k, v, 0.25, causal)
        if tuple(out.shape) != tuple(want_out.shape) or tuple(lse.shape) != tuple(want_lse.shape):
            return f"its shapes {tuple(out.shape)}, {tuple(lse.shape)} are not the reference's"
        err_out = float((out.float() - want_out).abs().max())
        err_lse = float((lse - want_lse).abs().max())
        if not (err_out <= tol and err_lse <= tol):  # also false for nan
            return (f"it strays from the reference by {err_out:.2g} in the output and {err_lse:.2g} in the lse "
                    f"(tolerance {tol:g})")
    return None


_CHECKED: dict[tuple[int, torch.dtype], bool] = {}  # (CUDA device, dtype) -> whether the kernel serves it
_REFUSED: set[tuple[str, torch.dtype, int]] = set()  # (device, dtype, head size) a call was refused for, logged
_CHECKED_LOCK = threading.Lock()  # guards both


def cuda_fused_ok(index: int, dtype: torch.dtype) -> bool:
    """Whether the memory-efficient CUDA kernel serves CUDA device ``index`` in ``dtype``: it exists and
    ``check_fused`` passed there. Checked once per device and dtype (the log says which way), except that a
    check that ran out of memory is tried again on the next call."""
    with _CHECKED_LOCK:
        known = _CHECKED.get((index, dtype))
    if known is not None:
        return known
    op = _cuda_op()
    why = "this torch build has no such kernel" if op is None else check_fused(op, torch.device("cuda", index), dtype)
    if why is not None and "out of memory" in why:
        log.warning("the fused CUDA attention could not be checked on cuda:%d in %s (%s): the block path serves "
                    "until a check succeeds", index, dtype, why)
        return False
    with _CHECKED_LOCK:
        if (index, dtype) in _CHECKED:  # another thread checked meanwhile
            return _CHECKED[(index, dtype)]
        _CHECKED[(index, dtype)] = why is None
    if why is not None:
        log.warning("the fused CUDA attention does not serve cuda:%d in %s (%s): the block path does", index,
                    dtype, why)
    else:
        log.info("the fused CUDA attention serves cuda:%d in %s", index, dtype)
    return why is None


def forget_checks() -> None:
    """Check every CUDA device and dtype again on their next use (tests)."""
    with _CHECKED_LOCK:
        _CHECKED.clear()


def refused(query: torch.Tensor, err: RuntimeError) -> None:
    """A call the checked kernel still refused (CUDA's: a head size or layout the check's input did not have):
    logged once per device, dtype and head size; the caller takes the block path."""
    key = (str(query.device), query.dtype, int(query.shape[-1]))
    with _CHECKED_LOCK:
        if key in _REFUSED:
            return
        _REFUSED.add(key)
    log.warning("the fused attention refused %s %s with head size %d (%s): the block path serves it",
                key[0], key[1], key[2], err)


@functools.cache
def fused_dtypes() -> frozenset[torch.dtype]:
    """The dtypes the fused CPU kernel takes in this torch build: float32, and bfloat16 / float16 where one
    tiny call of it succeeds (its log-sum-exp comes back in float32 either way). Probed once."""
    op = _fused_op()
    if op is None:
        return frozenset()
    found = {torch.float32}
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.zeros(1, 1, 2, 8, dtype=dtype)  # (B, H, n, dh)
        try:
            _out, lse = op(x, x, x, 0.0, True, scale=1.0)
        except (RuntimeError, NotImplementedError):  # this build's kernel has no such dtype
            continue
        if lse.dtype == torch.float32:
            found.add(dtype)
    return frozenset(found)


def fused_attention(
    query: torch.Tensor,  # (B, H, q, dh)
    key: torch.Tensor,  # (B, Hkv, kv, dh)
    value: torch.Tensor,  # (B, Hkv, kv, dh): the kernel needs the query's head size
    scaling: float,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's fused attention: (output (B, H, q, dh) in the inputs' dtype, lse (B, H, q) float32), never
    the weights; the products accumulate in float32 whatever the inputs' dtype (``fused_dtypes``).

    Head h reads K/V head h // (H / Hkv), as ``repeat_interleave`` groups them. Only call it where
    :func:`fused_on` said True for the query's device and dtype (the CPU kernel, or CUDA's)."""
    if query.device.type == "cuda":
        return _efficient(_cuda_op(), query, key, value, scaling, is_causal)
    op = _fused_op()
    if op is None:  # pragma: no cover - the caller checked fused_available()
        raise RuntimeError(f"this torch build has no {_FUSED_OP}")
    out, lse = op(query, key, value, 0.0, is_causal, scale=scaling)
    return out, lse
