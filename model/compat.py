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
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)

_FUSED_OP = "_scaled_dot_product_flash_attention_for_cpu"


def attention_implementation(model: Any) -> str | None:
    """The attention implementation a transformers model runs now ("sdpa", "eager", "attnscope", ...),
    or None where the config does not say (see the module's note)."""
    config = getattr(model, "config", None)
    value = getattr(config, "_attn_implementation", None)
    return value if isinstance(value, str) else None


def _fused_op() -> Any:
    """The private fused CPU kernel, or None where this torch build has none."""
    try:
        return getattr(torch.ops.aten, _FUSED_OP)
    except (AttributeError, RuntimeError):  # torch.ops raises either for an unknown op
        return None


def fused_available() -> bool:
    """Whether the fused CPU kernel with log-sum-exp may run: it exists, and ATTNSCOPE_FUSED is not "0"
    (read each call, so a test or an operator can turn it off without a restart)."""
    return os.environ.get("ATTNSCOPE_FUSED", "1") != "0" and _fused_op() is not None


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
    """torch's fused CPU attention: (output (B, H, q, dh) in the inputs' dtype, lse (B, H, q) float32), never
    the weights; the products accumulate in float32 whatever the inputs' dtype (``fused_dtypes``).

    Head h reads K/V head h // (H / Hkv), as ``repeat_interleave`` groups them. Only call it where
    :func:`fused_available` said True."""
    op = _fused_op()
    if op is None:  # pragma: no cover - the caller checked fused_available()
        raise RuntimeError(f"this torch build has no {_FUSED_OP}")
    out, lse = op(query, key, value, 0.0, is_causal, scale=scaling)
    return out, lse
