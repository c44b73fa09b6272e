"""Q and K of the families whose attention does not go through transformers' AttentionInterface.

gpt_neo and bloom compute attention in their own module (eager). A forward pre-hook on
that module reads its input and runs the module's *own* projection and head split, so the kept
Q and K are what its attention multiplies; what their maths adds is stated per family:

* gpt_neo — no scaling (1.0), causal; "local" layers see the last ``window_size`` keys
  (``bias ^ tril(bias, -window_size)``: key j > i - window_size);
* bloom   — ALiBi: logits = inv_norm_factor x q.k + slope_h x key position (``alibi`` argument).

Falcon went through its own module too until transformers 5.25, which routes it through the
attention interface (``model.capture``; its ALiBi bias arrives in the additive mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

Mask = Any  # a transformers mask function (batch, head, q, kv) -> bool


@dataclass(frozen=True)
class ModuleQK:
    q: torch.Tensor  # (H, r, dh) float32 of this forward's queries
    k: torch.Tensor  # (Hkv, r, dh) float32 of this forward's new keys
    bias: torch.Tensor | None  # (H, kv) float32 per-key logit bias over every key so far, or None
    scaling: float
    groups: int
    mask_function: Mask


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    hidden: torch.Tensor = args[0] if args else kwargs["hidden_states"]
    return hidden


def gpt_neo(attn: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModuleQK:
    module: Any = attn  # the family's attention module: its own methods and attributes (untyped)
    hidden = _hidden(args, kwargs)  # (1, r, d)
    n_heads, d_head = int(module.num_heads), int(module.head_dim)
    q = module._split_heads(module.get_submodule("q_proj")(hidden), n_heads, d_head)[0]  # (H, r, dh)
    k = module._split_heads(module.get_submodule("k_proj")(hidden), n_heads, d_head)[0]
    mask: Mask = causal_mask_function
    if module.attention_type == "local":
        mask = and_masks(causal_mask_function, sliding_window_overlay(int(module.config.window_size)))
    return ModuleQK(q=q.float(), k=k.float(), bias=None, scaling=1.0, groups=1, mask_function=mask)


def bloom(attn: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModuleQK:
    module: Any = attn  # the family's attention module: its own methods and attributes (untyped)
    hidden = _hidden(args, kwargs)
    q, k, _v = module._reshape(module.get_submodule("query_key_value")(hidden))  # (1, H, r, dh) each
    n_heads = int(module.num_heads)
    alibi: torch.Tensor = kwargs["alibi"] if "alibi" in kwargs else args[2]  # (H, 1, kv)
    bias = alibi.reshape(n_heads, -1).float() * float(module.beta)  # (H, kv)
    return ModuleQK(q=q[0].float(), k=k[0].float(), bias=bias, scaling=float(module.inv_norm_factor), groups=1,
                    mask_function=causal_mask_function)


READERS = {"gpt_neo": gpt_neo, "bloom": bloom}
