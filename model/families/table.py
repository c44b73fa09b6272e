"""Every supported family in one table: what is truly per family, and nothing else.

Attention itself is captured at one point for most families (``model/capture/interface.py``:
the function transformers' ``AttentionInterface`` calls with post-rotary Q, K, V,
mask, scaling, soft-cap and sliding window). What remains per family is where the
residual stream's parts live, how a block adds them up, and what the model does to
its logits after the LM head. Paths are dotted module paths; ``attn``, ``o_proj``,
``attn_out``, ``mlp_out`` are relative to a block.

The residual identities the tests check, per ``ResidualKind``:

* ``pre_norm``  resid_post = resid_pre + attn_out + mlp_out, the MLP reading norm(resid_pre + attn_out);
* ``parallel``  resid_post = resid_pre + attn_out + mlp_out, attention and MLP both reading resid_pre
  (gptj, falcon, phi, cohere, gpt_neox);
* ``sandwich``  resid_post = resid_pre + attn_out + mlp_out where attn_out and mlp_out are the *normed*
  sublayer outputs (gemma2/3, olmo2: the post-sublayer norm's output is what enters the stream);
* ``post_norm`` resid_post = LN2(LN1(resid_pre + attn_out) + mlp_out) (BERT-style encoders).

Granite scales each sublayer's output by ``residual_multiplier`` before adding it: its
``attn_out`` / ``mlp_out`` are the scaled contributions, so the additive identity holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

PositionEncoding = Literal["learned", "sinusoidal", "rotary", "alibi", "none"]
ResidualKind = Literal["pre_norm", "parallel", "sandwich", "post_norm"]
# how a layer's value vectors sit in the output of the module ``ArchSpec.values`` names:
# "fused_gpt2" = [q | k | v] side by side (GPT-2's c_attn, Phi-3's qkv_proj, ModernBERT's Wqkv: the
# values are the last n_kv_heads * d_head features), "fused_neox" = per head [q k v] (GPT-NeoX's and
# BLOOM's query_key_value), "fused_grouped" = per K/V group [q ... q k v] (Falcon's
# query_key_value; per head [q k v] when every head has its own K/V), "separate" = the values alone
# (v_proj / value), with n_kv_heads heads (grouped-query attention when fewer than n_heads)
ValueLayout = Literal["fused_gpt2", "fused_neox", "fused_grouped", "separate"]
# "interface": attention through AttentionInterface (attn_implementation="attnscope");
# "module": the family's own attention code, eager, read from the attention module's output[1]
Capture = Literal["interface", "module"]
# how an interface family gets its mask: "lazy" = attnscope's LazyMask (rows built on demand); "dense" =
# transformers' boolean mask tensor, for a model that builds on it (ALiBi Falcon adds its position bias
# into the mask): the capture adds the model's additive mask and reads it back as causal + per-key bias
MaskKind = Literal["lazy", "dense"]


class UnsupportedArchitecture(ValueError):
    """The model's layout is not one attnscope knows how to hook."""




@dataclass(frozen=True)
class ArchSpec:
    blocks: str  # the ModuleList of blocks, from the model root
    attn: str  # the attention module (its id keys the capture; "module" families: output[1] is the pattern)
    out_proj: str  # W_O: the attention's output projection; its input features are heads one after another
    attn_out: str  # module whose output is what attention adds to the residual stream
    mlp_out: str  # module whose output is what the MLP adds to the residual stream
    final_norm: str | None  # applied to the last residual before the LM head
    position_encoding: PositionEncoding
    residual: ResidualKind
    values: str  # module whose output holds the value vectors (see ValueLayout)
    value_layout: ValueLayout = "separate"
    out_proj_transposed: bool = False  # W_O stored (in, out) (GPT-2's Conv1D), not nn.Linear's (out, in)
    mlp_params: tuple[str, ...] = ("mlp.",)  # parameter-name prefixes of the MLP, for parameter counts
    causal: bool = True
    capture: Capture = "interface"
    mask: MaskKind = "lazy"
    position_embeddings: str | None = None  # learned position table, if any
    after_final_norm: str | None = None  # a module between the final norm and the LM head (OPT's project_out)
    residual_scale: str | None = None  # config attribute scaling each sublayer's contribution (granite)
    logit_softcap: str | None = None  # config attribute c: logits -> c * tanh(logits / c) (gemma2/3)
    logit_scale: str | None = None  # config attribute s: logits -> logits * s (cohere)
    logit_divide: str | None = None  # config attribute s: logits -> logits / s (granite)
    post_norms: tuple[str, str] | None = None  # post_norm blocks: (norm after attention, norm after MLP)
    mutates_mlp_out: bool = False  # the block adds into the MLP's output tensor in place (falcon): copy it
    positions: Literal["config", "unbounded", "roberta"] = "config"  # how max positions are read

    @property
    def attn_implementation(self) -> str:
        if self.capture == "module":
            return "eager"
        return "attnscope_dense_mask" if self.mask == "dense" else "attnscope"


def _decoder(**kw: object) -> ArchSpec:
    """The Llama layout most modern decoders share."""
    base: dict[str, object] = {"blocks": "model.layers", "attn": "self_attn", "out_proj": "self_attn.o_proj",
                               "values": "self_attn.v_proj",
                               "attn_out": "self_attn", "mlp_out": "mlp", "final_norm": "model.norm",
                               "position_encoding": "rotary", "residual": "pre_norm"}
    return ArchSpec(**{**base, **kw})  # type: ignore[arg-type]


_SANDWICH = {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm", "residual": "sandwich"}
_BERT = ArchSpec(blocks="encoder.layer", attn="attention.self", out_proj="attention.output.dense",
                 values="attention.self.value", mlp_params=("intermediate.", "output.dense.", "output.LayerNorm."),
                 attn_out="attention.output.dense", mlp_out="output.dense", final_norm=None,
                 position_embeddings="embeddings.position_embeddings", position_encoding="learned",
                 residual="post_norm", causal=False, post_norms=("attention.output.LayerNorm", "output.LayerNorm"))

SPECS: dict[str, ArchSpec] = {
    "gpt2": ArchSpec(blocks="transformer.h", attn="attn", out_proj="attn.c_proj", out_proj_transposed=True,
                     values="attn.c_attn", value_layout="fused_gpt2", attn_out="attn", mlp_out="mlp",
                     final_norm="transformer.ln_f", position_embeddings="transformer.wpe",
                     position_encoding="learned", residual="pre_norm"),
    "gpt_neo": ArchSpec(blocks="transformer.h", attn="attn.attention", out_proj="attn.attention.out_proj",
                        values="attn.attention.v_proj",
                        attn_out="attn", mlp_out="mlp", final_norm="transformer.ln_f",
                        position_embeddings="transformer.wpe", position_encoding="learned", residual="pre_norm",
                        capture="module"),
    "gptj": ArchSpec(blocks="transformer.h", attn="attn", out_proj="attn.out_proj", values="attn.v_proj",
                     attn_out="attn", mlp_out="mlp",
                     final_norm="transformer.ln_f", position_encoding="rotary", residual="parallel"),
    "gpt_neox": ArchSpec(blocks="gpt_neox.layers", attn="attention", out_proj="attention.dense",
                         values="attention.query_key_value", value_layout="fused_neox", attn_out="attention",
                         mlp_out="mlp", final_norm="gpt_neox.final_layer_norm", position_encoding="rotary",
                         residual="parallel"),
    # OPT flattens the MLP's input to (batch * n, d): fc2's output is (n, d)
    "opt": ArchSpec(blocks="model.decoder.layers", attn="self_attn", out_proj="self_attn.out_proj",
                    values="self_attn.v_proj", mlp_params=("fc1.", "fc2."),
                    attn_out="self_attn", mlp_out="fc2", final_norm="model.decoder.final_layer_norm",
                    after_final_norm="model.decoder.project_out", position_embeddings="model.decoder.embed_positions",
                    position_encoding="learned", residual="pre_norm"),
    # BLOOM's attention and MLP add the residual themselves: their projections are the contributions
    "bloom": ArchSpec(blocks="transformer.h", attn="self_attention", out_proj="self_attention.dense",
                      values="self_attention.query_key_value", value_layout="fused_neox",
                      attn_out="self_attention.dense", mlp_out="mlp.dense_4h_to_h", final_norm="transformer.ln_f",
                      position_encoding="alibi", residual="pre_norm", capture="module", positions="unbounded"),
    "falcon": ArchSpec(blocks="transformer.h", attn="self_attention", out_proj="self_attention.dense",
                       values="self_attention.query_key_value", value_layout="fused_grouped",
                       attn_out="self_attention", mlp_out="mlp", final_norm="transformer.ln_f",
                       position_encoding="rotary", residual="parallel", mutates_mlp_out=True),
    "llama": _decoder(),
    "mistral": _decoder(),
    "mixtral": _decoder(),
    "qwen2": _decoder(),
    "qwen2_moe": _decoder(),
    "qwen3": _decoder(),
    "qwen3_moe": _decoder(),
    "gemma": _decoder(),
    "gemma2": _decoder(**_SANDWICH, logit_softcap="final_logit_softcapping"),
    "gemma3_text": _decoder(**_SANDWICH, logit_softcap="final_logit_softcapping"),
    "phi": _decoder(out_proj="self_attn.dense", final_norm="model.final_layernorm", residual="parallel"),
    "phi3": _decoder(values="self_attn.qkv_proj", value_layout="fused_gpt2"),
    "olmo": _decoder(),
    "olmo2": _decoder(**_SANDWICH),
    "starcoder2": _decoder(),
    "stablelm": _decoder(),
    "granite": _decoder(residual_scale="residual_multiplier", logit_divide="logits_scaling"),
    "cohere": _decoder(residual="parallel", logit_scale="logit_scale"),
    "smollm3": _decoder(),
    "bert": _BERT,
    "roberta": dataclasses.replace(_BERT, positions="roberta"),
    "distilbert": ArchSpec(blocks="transformer.layer", attn="attention", out_proj="attention.out_lin",
                           values="attention.v_lin", mlp_params=("ffn.",),
                           attn_out="attention.out_lin", mlp_out="ffn.lin2", final_norm=None,
                           position_embeddings="embeddings.position_embeddings", position_encoding="learned",
                           residual="post_norm", causal=False, post_norms=("sa_layer_norm", "output_layer_norm")),
    "modernbert": ArchSpec(blocks="layers", attn="attn", out_proj="attn.Wo", values="attn.Wqkv",
                           value_layout="fused_gpt2", attn_out="attn", mlp_out="mlp",
                           final_norm="final_norm", position_encoding="rotary", residual="pre_norm", causal=False),
}

SUPPORTED = tuple(sorted(SPECS))


def spec_for(config: PretrainedConfig) -> ArchSpec:
    """The family's entry, adjusted for the config options that change a block's layout."""
    try:
        spec = SPECS[config.model_type]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {config.model_type!r} is not supported; supported: {', '.join(SUPPORTED)}"
        ) from None
    kind = config.model_type
    if kind == "gpt_neox" and not getattr(config, "use_parallel_residual", True):
        spec = dataclasses.replace(spec, residual="pre_norm")
    if kind == "stablelm" and getattr(config, "use_parallel_residual", False):
        spec = dataclasses.replace(spec, residual="parallel")
    if kind == "opt" and not getattr(config, "do_layer_norm_before", True):
        spec = dataclasses.replace(spec, residual="post_norm", post_norms=("self_attn_layer_norm", "final_layer_norm"))
    if kind == "falcon":
        parallel = getattr(config, "parallel_attn", True) or getattr(config, "new_decoder_architecture", False)
        alibi = bool(getattr(config, "alibi", False))  # FalconModel adds the ALiBi bias into the mask tensor
        spec = dataclasses.replace(spec, residual="parallel" if parallel else "pre_norm",
                                   position_encoding="alibi" if alibi else "rotary", mask="dense" if alibi else "lazy")
    if kind == "bloom" and getattr(config, "apply_residual_connection_post_layernorm", False):
        raise UnsupportedArchitecture("BLOOM with apply_residual_connection_post_layernorm=True is not supported")
    return spec


def max_positions(config: PretrainedConfig, spec: ArchSpec) -> int | None:
    """The longest input the model's position scheme allows; None when it has no limit (ALiBi)."""
    if spec.positions == "unbounded":
        return None
    n = int(config.max_position_embeddings)
    if spec.positions == "roberta":  # position ids start after the padding index
        n -= int(config.pad_token_id) + 1
    return n


def blocks(model: PreTrainedModel, spec: ArchSpec) -> nn.ModuleList:
    """The model's transformer blocks, whether it is wrapped in a *ForCausalLM or not."""
    found = find(model, spec.blocks)
    if not isinstance(found, nn.ModuleList):
        raise UnsupportedArchitecture(f"cannot find the blocks ({spec.blocks}) in {type(model).__name__}")
    return found


def find(model: nn.Module, path: str) -> nn.Module | None:
    """A module by its path from the *ForCausalLM root, or from the bare base model."""
    prefix = getattr(model, "base_model_prefix", "")
    for candidate in (path, path.split(".", 1)[-1], f"{prefix}.{path}"):
        try:
            return model.get_submodule(candidate)
        except AttributeError:
            continue
    return None


def logit_transform(spec: ArchSpec, config: PretrainedConfig, logits: torch.Tensor) -> torch.Tensor:
    """What the family does to the LM head's output (float32 in, float32 out)."""
    if spec.logit_scale is not None:
        logits = logits * float(getattr(config, spec.logit_scale))
    if spec.logit_divide is not None:
        logits = logits / float(getattr(config, spec.logit_divide))
    cap = getattr(config, spec.logit_softcap, None) if spec.logit_softcap is not None else None
    if cap:
        logits = torch.tanh(logits / float(cap)) * float(cap)
    return logits

