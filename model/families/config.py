"""A model config's sizes, read the same way for every family: each family names the same quantity
differently (GPT-2's ``n_inner``, OPT's ``ffn_dim``, Falcon's ``num_kv_heads`` and multi-query flag),
and the aliases live here, not in the loader."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

# the config attributes that hold each size, first found wins
D_HEAD = ("head_dim",)
D_MLP = ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim")
N_KV_HEADS = ("num_key_value_heads", "num_kv_heads")


@dataclass(frozen=True)
class Dimensions:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int


def first_attr(cfg: object, *names: str) -> int | None:
    """The first of ``names`` the config sets to a non-zero value, as an int."""
    for name in names:
        value = getattr(cfg, name, None)
        if value:
            return int(value)
    return None


def dimensions(cfg: PretrainedConfig) -> Dimensions:
    n_heads = int(cfg.num_attention_heads)
    d_model = int(cfg.hidden_size)
    n_kv = first_attr(cfg, *N_KV_HEADS) or n_heads
    if getattr(cfg, "multi_query", False) and not getattr(cfg, "new_decoder_architecture", False):
        n_kv = 1  # Falcon's multi-query attention
    return Dimensions(n_layers=int(cfg.num_hidden_layers), n_heads=n_heads, n_kv_heads=n_kv, d_model=d_model,
                      d_head=first_attr(cfg, *D_HEAD) or d_model // n_heads,
                      d_mlp=first_attr(cfg, *D_MLP) or 4 * d_model, vocab_size=int(cfg.vocab_size))
