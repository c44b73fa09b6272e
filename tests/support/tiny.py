"""Tiny random models built from configs (no downloads), and engines over them: shared by the tests and
bench/ (one importable place)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from attnscope.model.load.models import BUNDLED_DIR, LoadedModel
from attnscope.model.runs.record import RunStore
from attnscope.model.services.engine import Engine

BUNDLED = BUNDLED_DIR / "attnscope-tiny"
VOCAB = len(AutoTokenizer.from_pretrained(BUNDLED))  # the bundled tokenizer's size, shared by every tiny model


def tiny_config(arch: str, **extra: object):
    common = {"vocab_size": VOCAB}
    if arch == "gpt2":
        return GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=256, **common, **extra)
    if arch == "gpt_neox":
        return GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
                             max_position_embeddings=256, rotary_pct=0.5, **common, **extra)
    if arch == "llama":
        return LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, hidden_size=32,
                           intermediate_size=64, max_position_embeddings=256, **common, **extra)
    if arch == "qwen2":
        return Qwen2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                           intermediate_size=64, max_position_embeddings=256, **common, **extra)
    raise ValueError(arch)


MODEL_CLASSES = {"gpt2": GPT2LMHeadModel, "gpt_neox": GPTNeoXForCausalLM, "llama": LlamaForCausalLM,
                 "qwen2": Qwen2ForCausalLM}
ARCHS = list(MODEL_CLASSES)


def save_tiny(arch: str, folder: Path, **extra: object) -> Path:
    """A random model of ``arch`` saved like any HF checkpoint, with the bundled tokenizer."""
    torch.manual_seed(0)
    model = MODEL_CLASSES[arch](tiny_config(arch, **extra))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(BUNDLED).save_pretrained(folder)
    return folder


def make_engine(models: dict[str, LoadedModel], default: str, store_bytes: int = 1 << 28,
                max_tokens: int = 1024) -> Engine:
    return Engine(models, default, RunStore(store_bytes), max_tokens)


