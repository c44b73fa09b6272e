"""Learn §1, "Attention aggregates context": what each source token *adds* to a head's output.

A weight says where a head looks; weight x ‖v_j W_O^h‖ says how much source j actually adds. The
value vectors come from one forward over the run's tokens (read where the family keeps them,
``model.families.weights.value_heads``), W_O from the family's output projection. Callers hold the
model's lock (``model.services.learn`` takes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field
from torch import nn

from attnscope.model.capture.hooks import Registration, temporary_hooks
from attnscope.model.families.weights import head_out_weights, value_heads
from attnscope.model.load.models import LoadedModel
from attnscope.model.runs.record import RunRecord

PROJECT_CELLS = 1 << 22  # heads x tokens x d_model of one block of projected values (16 MiB float32)


@dataclass(frozen=True, slots=True)
class Contributions:
    """One head at one query: each visible source's weight, value norm and what it adds."""

    layer: int
    head: int
    position: int
    weights: Annotated[list[float], Field(description="attention from the query to each visible source token")]
    value_norms: Annotated[list[float], Field(description="‖v_j W_O^h‖: how much source j would add at weight 1")]
    contributions: Annotated[list[float], Field(description="weight x value norm: how much each source actually adds")]


@dataclass(frozen=True, slots=True)
class HeadGap:
    """How far one head's weights are from each source's share of what it adds, at one query."""

    layer: int
    head: int
    gap: Annotated[float, Field(description=(
        "total-variation distance between the weights and each source's share of what the head adds"))]
    top_weight: Annotated[int, Field(description="the source with the largest weight")]
    top_share: Annotated[int, Field(description="the source that adds the most")]


def layer_values(lm: LoadedModel, ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """One forward over ``ids`` (n,): each listed layer's value vectors, (H, n, d_head)."""
    info, spec = lm.info, lm.spec
    seen: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Any:
        def hook(_module: nn.Module, _args: object, out: torch.Tensor) -> None:
            seen[layer] = value_heads(spec, out[0].detach(), n_heads=info.n_heads, n_kv_heads=info.n_kv_heads,
                                      d_head=info.d_head).transpose(0, 1)

        return hook

    regs = [Registration(lm.blocks[layer].get_submodule(spec.values), "post", keep(layer)) for layer in layers]
    with temporary_hooks(regs), torch.inference_mode():
        lm.model(input_ids=ids[None].to(lm.input_device), use_cache=False)
    return seen


def out_weights(lm: LoadedModel, layer: int) -> torch.Tensor:
    """(H, d_head, d_model): each head's slice of the layer's W_O."""
    proj = lm.blocks[layer].get_submodule(lm.spec.out_proj)
    return head_out_weights(lm.spec, proj, lm.info.n_heads, layer).w_o


def value_vectors(lm: LoadedModel, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (H, n, d_head), W_O per head (H, d_head, d_model)) of one layer, from a forward."""
    return layer_values(lm, ids, [layer])[layer], out_weights(lm, layer)


def value_norms(values: torch.Tensor, w_o: torch.Tensor, upto: int) -> torch.Tensor:
    """(H, upto): ‖v_j^h W_O^h‖ for every head h and source j < upto, projected a block of sources
    at a time (never the whole (H, n, d_model))."""
    heads, d = w_o.shape[0], w_o.shape[2]
    step = max(1, PROJECT_CELLS // (heads * d))
    out = []
    with torch.inference_mode():
        for j0 in range(0, upto, step):
            block = values[:, j0 : min(upto, j0 + step)].float()  # (H, r, d_head)
            out.append(torch.einsum("hnk,hkd->hnd", block, w_o.float()).norm(dim=-1).cpu())  # (H, r)
    return torch.cat(out, dim=1) if out else torch.zeros(heads, 0)


def contributions(lm: LoadedModel, record: RunRecord, layer: int, head: int, position: int) -> Contributions:
    """What each source the query at ``position`` sees adds to ``head``'s output (ranges checked)."""
    visible = position + 1 if record.causal else record.n
    v = layer_values(lm, record.input_ids, [layer])[layer][head : head + 1]  # (1, n, d_head)
    norms = value_norms(v, out_weights(lm, layer)[head : head + 1], visible)[0]  # (visible,)
    weights = record.head_rows(layer, head, position, position + 1, 0, visible)[0][0].cpu()  # (visible,)
    return Contributions(layer=layer, head=head, position=position, weights=weights.tolist(),
                         value_norms=norms.tolist(), contributions=(weights * norms).tolist())


def contribution_gaps(lm: LoadedModel, record: RunRecord, position: int) -> list[HeadGap]:
    """Per head at one query: the total-variation distance between the attention weights and each
    source's share of what the head adds (weight x ‖v W_O‖, normalised). 0 means the weights
    already tell the whole story; larger means weight and contribution disagree. One forward reads
    every layer's values; each head's row is rebuilt from the run's kept attention."""
    visible = position + 1 if record.causal else record.n
    values = layer_values(lm, record.input_ids, list(range(record.n_layers)))
    out: list[HeadGap] = []
    for layer, kept in enumerate(record.attention):
        norms = value_norms(values.pop(layer), out_weights(lm, layer), visible)  # (H, visible)
        weights = kept.weights(position, position + 1)[0][:, 0, :visible].float().cpu()  # (H, visible)
        added = weights * norms
        share = added / added.sum(-1, keepdim=True).clamp_min(1e-12)
        gap = 0.5 * (weights - share).abs().sum(-1)  # (H,)
        out.extend(HeadGap(layer=layer, head=head, gap=float(gap[head]), top_weight=int(weights[head].argmax()),
                           top_share=int(share[head].argmax()))
                   for head in range(weights.shape[0]))
    return out
