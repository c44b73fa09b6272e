"""Where each supported architecture keeps its parts.

Hugging Face models name their modules differently (``transformer.h[i].attn`` in
GPT-2, ``gpt_neox.layers[i].attention`` in Pythia, ``model.layers[i].self_attn`` in
Llama/Qwen2, ``encoder.layer[i].attention.self`` in BERT). An ``ArchSpec`` records
those paths once, so that hooks and analysis are written against one vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

PositionEncoding = Literal["learned", "sinusoidal", "rotary", "alibi", "none"]
# how a block combines its sublayers; states the identity tests can check
ResidualKind = Literal["pre_norm", "parallel", "post_norm"]


class UnsupportedArchitecture(ValueError):
    """The model's layout is not one attnscope knows how to hook."""


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


SPECS: dict[str, ArchSpec] = {
    "gpt2": ArchSpec("transformer.h", "attn", "attn", "mlp", "transformer.ln_f",
                     "transformer.wpe", "learned", "pre_norm", True),
    "gpt_neox": ArchSpec("gpt_neox.layers", "attention", "attention", "mlp",
                         "gpt_neox.final_layer_norm", None, "rotary", "parallel", True),
    "llama": ArchSpec("model.layers", "self_attn", "self_attn", "mlp", "model.norm",
                      None, "rotary", "pre_norm", True),
    "qwen2": ArchSpec("model.layers", "self_attn", "self_attn", "mlp", "model.norm",
                      None, "rotary", "pre_norm", True),
    "mistral": ArchSpec("model.layers", "self_attn", "self_attn", "mlp", "model.norm",
                        None, "rotary", "pre_norm", True),
    "bert": ArchSpec("encoder.layer", "attention.self", "attention.output.dense",
                     "output.dense", None, "embeddings.position_embeddings", "learned",
                     "post_norm", False),
}


def spec_for(config: PretrainedConfig) -> ArchSpec:
    try:
        spec = SPECS[config.model_type]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {config.model_type!r} is not supported; supported: {', '.join(sorted(SPECS))}"
        ) from None
    if config.model_type == "gpt_neox" and not getattr(config, "use_parallel_residual", True):
        spec = ArchSpec(**{**spec.__dict__, "residual": "pre_norm"})
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
