"""Q and K of the families whose attention does not go through transformers' AttentionInterface.

gpt_neo and bloom compute attention in their own module (eager). A forward pre-hook on
that module reads its input and runs the module's *own* projection and head split, so the kept
Q and K are what its attention multiplies. The head split is written here with public tensor ops, in
the layout the family's checkpoints use (the modules' own ``_split_heads`` / ``_reshape`` are private
methods that a transformers release may rename); what their maths adds is stated per family:

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


def split_heads(x: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """(1, r, H x dh) -> (H, r, dh): head h is columns [h x dh, (h + 1) x dh), as gpt_neo lays them out."""
    return x[0].view(x.shape[1], n_heads, d_head).transpose(0, 1)


def split_fused_qkv(x: torch.Tensor, n_heads: int, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, r, H x 3 x dh) -> q, k (H, r, dh) each: bloom's fused projection interleaves q, k, v per head."""
    parts = x[0].view(x.shape[1], n_heads, 3, d_head)  # (r, H, 3, dh)
    return parts[:, :, 0].transpose(0, 1), parts[:, :, 1].transpose(0, 1)


def gpt_neo(attn: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModuleQK:
    module: Any = attn  # the family's attention module: its own methods and attributes (untyped)
    hidden = _hidden(args, kwargs)  # (1, r, d)
    n_heads, d_head = int(module.num_heads), int(module.head_dim)
    q = split_heads(module.get_submodule("q_proj")(hidden), n_heads, d_head)  # (H, r, dh)
    k = split_heads(module.get_submodule("k_proj")(hidden), n_heads, d_head)
    mask: Mask = causal_mask_function
    if module.attention_type == "local":
        mask = and_masks(causal_mask_function, sliding_window_overlay(int(module.config.window_size)))
    return ModuleQK(q=q.float(), k=k.float(), bias=None, scaling=1.0, groups=1, mask_function=mask)


def bloom(attn: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModuleQK:
    module: Any = attn  # the family's attention module: its own methods and attributes (untyped)
    hidden = _hidden(args, kwargs)
    n_heads = int(module.num_heads)
    q, k = split_fused_qkv(module.get_submodule("query_key_value")(hidden), n_heads, int(module.head_dim))
    alibi: torch.Tensor = kwargs["alibi"] if "alibi" in kwargs else args[2]  # (H, 1, kv)
    bias = alibi.reshape(n_heads, -1).float() * float(module.beta)  # (H, kv)
    return ModuleQK(q=q.float(), k=k.float(), bias=bias, scaling=float(module.inv_norm_factor), groups=1,
                    mask_function=causal_mask_function)


READERS = {"gpt_neo": gpt_neo, "bloom": bloom}
