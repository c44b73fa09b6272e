"""Where each supported architecture keeps its parts.

Hugging Face models name their modules differently (``transformer.h[i].attn`` in
GPT-2, ``gpt_neox.layers[i].attention`` in Pythia, ``model.layers[i].self_attn`` in
Llama/Qwen2, ``encoder.layer[i].attention.self`` in BERT). An ``ArchSpec`` records
those paths once, so that hooks and analysis are written against one vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

PositionEncoding = Literal["learned", "sinusoidal", "rotary", "alibi", "none"]
# how a block combines its sublayers; states the identity tests can check
ResidualKind = Literal["pre_norm", "parallel", "post_norm"]


class UnsupportedArchitecture(ValueError):
    """The model's layout is not one attnscope knows how to hook."""


# how a layer's value vectors sit in the output of the module ``ArchSpec.values`` names:
# "fused_gpt2" = [q | k | v] side by side (GPT-2's c_attn), "fused_neox" = per head [q k v]
# (GPT-NeoX's query_key_value), "separate" = the values alone (v_proj / value), with
# n_kv_heads heads (grouped-query attention when fewer than n_heads)
ValueLayout = Literal["fused_gpt2", "fused_neox", "separate"]


@dataclass(frozen=True)
class ArchSpec:
    blocks: str  # dotted path to the ModuleList of blocks
    pattern: str  # module (relative to a block) whose output[1] is the softmaxed pattern
    attn_out: str  # module whose output (or output[0]) is the attention sublayer's contribution
    mlp_out: str  # module whose output is the MLP sublayer's contribution
    final_norm: str | None  # applied before the LM head; None for encoders without one
    position_embeddings: str | None  # learned position table, if any
    position_encoding: PositionEncoding
    residual: ResidualKind
    causal: bool
    values: str  # module (relative to a block) whose output holds the value vectors
    value_layout: ValueLayout
    out_proj: str  # the attention's output projection W_O (relative to a block)
    out_proj_transposed: bool  # its weight is stored (in, out) (GPT-2's Conv1D), not nn.Linear's (out, in)
    # parameter-name prefixes (relative to a block) of the MLP, for parameter counts
    mlp_params: tuple[str, ...]


SPECS: dict[str, ArchSpec] = {
    "gpt2": ArchSpec(
        blocks="transformer.h", pattern="attn", attn_out="attn", mlp_out="mlp", final_norm="transformer.ln_f",
        position_embeddings="transformer.wpe", position_encoding="learned", residual="pre_norm", causal=True,
        values="attn.c_attn", value_layout="fused_gpt2", out_proj="attn.c_proj", out_proj_transposed=True,
        mlp_params=("mlp.",)),
    "gpt_neox": ArchSpec(
        blocks="gpt_neox.layers", pattern="attention", attn_out="attention", mlp_out="mlp",
        final_norm="gpt_neox.final_layer_norm", position_embeddings=None, position_encoding="rotary",
        residual="parallel", causal=True, values="attention.query_key_value", value_layout="fused_neox",
        out_proj="attention.dense", out_proj_transposed=False, mlp_params=("mlp.",)),
    **{
        family: ArchSpec(
            blocks="model.layers", pattern="self_attn", attn_out="self_attn", mlp_out="mlp", final_norm="model.norm",
            position_embeddings=None, position_encoding="rotary", residual="pre_norm", causal=True,
            values="self_attn.v_proj", value_layout="separate", out_proj="self_attn.o_proj",
            out_proj_transposed=False, mlp_params=("mlp.",))
        for family in ("llama", "qwen2", "mistral")
    },
    "bert": ArchSpec(
        blocks="encoder.layer", pattern="attention.self", attn_out="attention.output.dense", mlp_out="output.dense",
        final_norm=None, position_embeddings="embeddings.position_embeddings", position_encoding="learned",
        residual="post_norm", causal=False, values="attention.self.value", value_layout="separate",
        out_proj="attention.output.dense", out_proj_transposed=False,
        mlp_params=("intermediate.", "output.dense.", "output.LayerNorm.")),
}


def spec_for(config: PretrainedConfig) -> ArchSpec:
    try:
        spec = SPECS[config.model_type]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {config.model_type!r} is not supported; supported: {', '.join(sorted(SPECS))}"
        ) from None
    if config.model_type == "gpt_neox" and not getattr(config, "use_parallel_residual", True):
        spec = replace(spec, residual="pre_norm")
    return spec


def blocks(model: PreTrainedModel, spec: ArchSpec) -> nn.ModuleList:
    """The model's transformer blocks, whether it is wrapped in a *ForCausalLM or not."""
    found = find(model, spec.blocks)
    if not isinstance(found, nn.ModuleList):
        raise UnsupportedArchitecture(f"cannot find the blocks ({spec.blocks}) in {type(model).__name__}")
    return found


def find(model: PreTrainedModel, path: str) -> nn.Module | None:
    """A module by its path from the *ForCausalLM root, or from the bare base model."""
    prefix = getattr(model, "base_model_prefix", "")
    for candidate in (path, path.split(".", 1)[-1], f"{prefix}.{path}"):
        try:
            return model.get_submodule(candidate)
        except AttributeError:
            continue
    return None
