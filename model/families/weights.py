"""How a family stores what the per-head lessons and tools read: its value vectors (``ValueLayout``),
its output projection W_O (``nn.Linear``'s (out, in) or GPT-2's ``Conv1D`` (in, out)) cut into one
slice per head, and its rotary settings under the names the configs use for them.

Callers ask here instead of branching on a family's name or layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from attnscope.model.errors import BadInput
from attnscope.model.families.table import ArchSpec


@dataclass(frozen=True)
class HeadWeights:
    w_o: torch.Tensor  # (H, d_head, d_model): each head's slice of the output projection
    b_o: torch.Tensor | None  # (d_model,) the projection's bias, shared by the heads

    @property
    def d_head(self) -> int:
        return int(self.w_o.shape[1])


def out_matrix(spec: ArchSpec, proj: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d_in, d_out) weight and the bias (or None) of the output projection, whichever way the family
    stores it: the heads' ``z`` side by side times this matrix is what the projection computes."""
    weight = proj.get_parameter("weight")
    try:
        bias: torch.Tensor | None = proj.get_parameter("bias")
    except AttributeError:
        bias = None
    return (weight if spec.out_proj_transposed else weight.T), bias


def head_out_weights(spec: ArchSpec, proj: nn.Module, n_heads: int, layer: int) -> HeadWeights:
    """W_O cut into each head's (d_head, d_model) slice. ``layer`` names the layer in the refusal of a
    projection whose inputs are not a whole number of heads."""
    w, b = out_matrix(spec, proj)  # (H * d_head, d_model)
    if w.shape[0] % n_heads:
        raise BadInput(f"layer {layer}'s output projection takes {w.shape[0]} inputs, not a multiple of "
                       f"{n_heads} heads", code="projection_shape",
                       params={"layer": layer, "inputs": int(w.shape[0]), "heads": n_heads})
    return HeadWeights(w_o=w.reshape(n_heads, w.shape[0] // n_heads, w.shape[1]), b_o=b)


def value_heads(spec: ArchSpec, out: torch.Tensor, *, n_heads: int, n_kv_heads: int, d_head: int) -> torch.Tensor:
    """(n, features) output of the module ``spec.values`` names -> (n, H, d_head) value vectors, one
    per query head (a K/V head serving n_heads / n_kv_heads query heads is repeated for each)."""
    n, groups = out.shape[0], n_heads // n_kv_heads
    if spec.value_layout == "fused_gpt2":  # [q | k | v]: the values are the last n_kv_heads * d_head features
        v = out[:, out.shape[-1] - n_kv_heads * d_head :].reshape(n, n_kv_heads, d_head)
    elif spec.value_layout == "fused_neox":  # per head [q k v]
        return out.view(n, n_heads, 3 * d_head)[..., 2 * d_head :]
    elif spec.value_layout == "fused_grouped":  # per K/V group: [q ... q k v]
        v = out.view(n, n_kv_heads, -1, d_head)[:, :, -1]
    else:  # the values alone, n_kv_heads of them
        v = out.view(n, n_kv_heads, d_head)
    return v.repeat_interleave(groups, dim=1)


@dataclass(frozen=True)
class Rotary:
    theta: float  # the base of the frequencies
    dims: int  # how many of a head's dimensions rotate (an even number)


def rotary(config: PretrainedConfig, d_head: int) -> Rotary:
    """A rotary model's base and rotated dimensions, read from its config: transformers' v5
    ``rope_parameters`` or the older ``rope_theta``; a partial rotation as ``partial_rotary_factor``
    (Phi, StableLM) or ``rotary_pct`` (GPT-NeoX)."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    pct = float(params.get("partial_rotary_factor", getattr(config, "rotary_pct", 1.0)))
    return Rotary(theta=theta, dims=int(d_head * pct) // 2 * 2)
