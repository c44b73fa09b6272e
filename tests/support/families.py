"""Tiny random configs of every supported family, built in the test (no downloads).

Each is 2 layers, hidden 32-64, a vocabulary of 256 (the character tokenizer in
``tests/support/tinytok.py``), with the family's characteristic options switched on: grouped
K/V heads, sliding windows, soft-capping, ALiBi, parallel blocks, sandwich norms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

VOCAB = 256
POSITIONS = 128


@dataclass(frozen=True)
class Family:
    model_type: str
    options: dict[str, Any]
    causal: bool = True
    variant: str = ""  # a second configuration of the same family (another attention path)

    @property
    def id(self) -> str:
        return f"{self.model_type}-{self.variant}" if self.variant else self.model_type

    def config(self, **extra: Any) -> PretrainedConfig:
        ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # the tiny tokenizer's specials
        return AutoConfig.for_model(self.model_type, **{**ids, **self.options, **extra})

    def build(self, attn_implementation: str = "eager", **extra: Any) -> PreTrainedModel:
        """A random model of this family (seeded), in float32, in eval mode."""
        torch.manual_seed(0)
        cls = AutoModelForCausalLM if self.causal else AutoModel
        model = cls.from_config(self.config(**extra), attn_implementation=attn_implementation)
        # sharper than the default init (std 0.02 makes every head nearly uniform, which any
        # attention would match): matrices drawn wider, so patterns, caps and windows show
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.3)
        return model.eval()


_LLAMA_LIKE = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32,
               "intermediate_size": 64, "max_position_embeddings": POSITIONS, "vocab_size": VOCAB}
_MOE = {"num_local_experts": 4, "num_experts_per_tok": 2}

FAMILIES: list[Family] = [
    Family("gpt2", {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": POSITIONS, "vocab_size": VOCAB}),
    # layer 1 is a local layer with a window shorter than the test prompt
    Family("gpt_neo", {"num_layers": 2, "num_heads": 4, "hidden_size": 32, "max_position_embeddings": POSITIONS,
                       "attention_types": [[["global", "local"], 1]], "window_size": 5, "vocab_size": VOCAB}),
    Family("gptj", {"n_layer": 2, "n_head": 4, "n_embd": 32, "rotary_dim": 4, "n_positions": POSITIONS,
                    "vocab_size": VOCAB}),
    Family("gpt_neox", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "intermediate_size": 64,
                        "max_position_embeddings": POSITIONS, "rotary_pct": 0.5, "vocab_size": VOCAB}),
    Family("opt", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "ffn_dim": 64,
                   "word_embed_proj_dim": 32, "max_position_embeddings": POSITIONS, "vocab_size": VOCAB}),
    Family("bloom", {"n_layer": 2, "n_head": 4, "hidden_size": 32, "vocab_size": VOCAB}),
    Family("falcon", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "alibi": True,
                      "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True,
                      "max_position_embeddings": POSITIONS, "vocab_size": VOCAB}),
    # Falcon-40B/180B's layout: rotary positions, grouped K/V heads, the "new decoder architecture"
    Family("falcon", {"num_hidden_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2, "hidden_size": 32,
                      "alibi": False, "new_decoder_architecture": True, "parallel_attn": True,
                      "max_position_embeddings": POSITIONS, "vocab_size": VOCAB}, variant="rotary-gqa"),
    Family("llama", _LLAMA_LIKE),
    Family("mistral", {**_LLAMA_LIKE, "sliding_window": 5}),
    Family("mixtral", {**_LLAMA_LIKE, **_MOE, "sliding_window": 5}),
    Family("qwen2", {**_LLAMA_LIKE, "use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
    Family("qwen2_moe", {**_LLAMA_LIKE, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                         "shared_expert_intermediate_size": 32}),
    Family("qwen3", {**_LLAMA_LIKE, "head_dim": 16}),
    Family("qwen3_moe", {**_LLAMA_LIKE, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                         "moe_intermediate_size": 32}),
    Family("gemma", {**_LLAMA_LIKE, "num_key_value_heads": 1, "head_dim": 8}),
    Family("gemma2", {**_LLAMA_LIKE, "head_dim": 8, "sliding_window": 5, "attn_logit_softcapping": 2.0,
                      "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 12}),
    Family("gemma3_text", {**_LLAMA_LIKE, "head_dim": 8, "sliding_window": 5, "sliding_window_pattern": 2,
                           "final_logit_softcapping": 3.0, "attn_logit_softcapping": 2.0,
                           "layer_types": ["sliding_attention", "full_attention"]}),
    Family("phi", {**_LLAMA_LIKE, "partial_rotary_factor": 0.5}),
    Family("phi3", {**_LLAMA_LIKE, "sliding_window": 5, "pad_token_id": 0}),
    Family("olmo", {**_LLAMA_LIKE, "clip_qkv": 4.0}),
    Family("olmo2", _LLAMA_LIKE),
    Family("starcoder2", {**_LLAMA_LIKE, "sliding_window": 5}),
    Family("stablelm", {**_LLAMA_LIKE, "partial_rotary_factor": 0.5, "qk_layernorm": True}),
    Family("granite", {**_LLAMA_LIKE, "residual_multiplier": 0.5, "embedding_multiplier": 2.0,
                       "attention_multiplier": 0.3, "logits_scaling": 4.0}),
    Family("cohere", {**_LLAMA_LIKE, "logit_scale": 0.5, "use_qk_norm": False}),
    Family("smollm3", {**_LLAMA_LIKE, "no_rope_layer_interval": 2}),
    Family("bert", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "intermediate_size": 64,
                    "max_position_embeddings": POSITIONS, "vocab_size": VOCAB}, causal=False),
    Family("roberta", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32, "intermediate_size": 64,
                       "max_position_embeddings": POSITIONS + 2, "vocab_size": VOCAB, "pad_token_id": 1},
           causal=False),
    Family("distilbert", {"n_layers": 2, "n_heads": 4, "dim": 32, "hidden_dim": 64,
                          "max_position_embeddings": POSITIONS, "vocab_size": VOCAB}, causal=False),
    Family("modernbert", {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32,
                          "intermediate_size": 64, "max_position_embeddings": POSITIONS, "vocab_size": VOCAB,
                          "local_attention": 6, "global_attn_every_n_layers": 2, "pad_token_id": 0,
                          "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}, causal=False),
]
DECODERS = [f for f in FAMILIES if f.causal]
ENCODERS = [f for f in FAMILIES if not f.causal]


LONG_POSITIONS = 32_768


def long_llama(seed: int = 0) -> PreTrainedModel:
    """The long-context model of issue 15: Llama-shaped (rotary), 2 layers, hidden 128, 4 heads, 2 K/V
    heads, 32,768 positions, random weights drawn as ``Family.build`` draws them, float32, eval mode."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model("llama", num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LONG_POSITIONS,
                                  vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model.eval()
