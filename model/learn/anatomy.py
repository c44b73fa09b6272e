"""Learn §5, "d_model and heads": the model's parameters counted by part of the network (token and
position embeddings, attention, MLP and norms per layer, the LM head), from its own modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from attnscope.model.load.models import LoadedModel, input_embeddings, output_embeddings, position_embeddings


@dataclass(frozen=True, slots=True)
class LayerParams:
    layer: int
    attention: int
    mlp: int
    norms: int  # whatever else the block holds (its norms, mostly)


@dataclass(frozen=True, slots=True)
class Anatomy:
    """Parameter counts by part; the parts add up to ``total``."""

    model: str
    per_layer: list[LayerParams]
    token_embedding: int
    position_embedding: int
    final_norm_and_other: int
    lm_head: Annotated[int, Field(description="0 when the LM head shares the token embedding's weights")]
    lm_head_tied: bool
    total: int


def anatomy(lm: LoadedModel) -> Anatomy:
    """Parameter counts by part: token/position embeddings, attention and MLP per layer, norms, LM head."""
    model, spec = lm.model, lm.spec
    blocks = lm.blocks
    attn_root = spec.attn.split(".")[0] + "."
    per_layer: list[LayerParams] = []
    in_blocks: set[int] = set()
    for index, block in enumerate(blocks):
        counts = {"attention": 0, "mlp": 0, "norms": 0}
        for name, p in block.named_parameters():
            in_blocks.add(id(p))
            part = "attention" if name.startswith(attn_root) else "mlp" if name.startswith(spec.mlp_params) else "norms"
            counts[part] += p.numel()
        per_layer.append(LayerParams(layer=index, **counts))
    wte = input_embeddings(model)
    head = output_embeddings(model)
    head_weight = head.get_parameter("weight") if head is not None else None
    pos_table = position_embeddings(lm)
    token = position = lm_head = other = 0
    for _name, p in model.named_parameters():
        if id(p) in in_blocks:
            continue
        if p is wte:
            token += p.numel()
        elif pos_table is not None and p is pos_table:
            position += p.numel()
        elif head_weight is not None and p is head_weight:
            lm_head += p.numel()
        else:
            other += p.numel()
    return Anatomy(model=lm.info.name, per_layer=per_layer, token_embedding=token, position_embedding=position,
                   final_norm_and_other=other, lm_head=lm_head,
                   lm_head_tied=head_weight is not None and head_weight.data_ptr() == wte.data_ptr(),
                   total=sum(p.numel() for p in model.parameters()))
