"""Fingerprints that say whether a stored run's model and tokenizer are the ones loaded now.

``model_fingerprint``: sha256 over the model's config (JSON, keys sorted; what only says where it was
loaded from or how its attention is dispatched is left out) and, per parameter and persistent buffer in name order,
its name, shape, dtype and statistics of its bits. The statistics are integer sums over the elements'
bit patterns read as integers (an element's exact bits, not its value: a changed element always changes
its term) — the sum, the sum of squares and the sum weighted by position, each modulo 2^64 (int64
wrapping) — and the bits of a strided sample of 64 elements. Integer sums are exact and do not depend on
the order of the reduction (threads, devices), so the same weights give the same fingerprint in every
process, where a float64 sum may not. Any in-memory edit of a parameter changes it with overwhelming
probability: a scaled matrix, a single element, two elements swapped. O(params) time, a chunk of 2^20
elements at a time (bounded memory), on the parameter's own device.

``tokenizer_fingerprint``: sha256 over the tokenizer's class, vocabulary (token -> id), added tokens and
special tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

CHUNK = 1 << 20  # elements summed at once (8 MiB of int64)
SAMPLE = 64  # elements whose bits are hashed as they are
# config keys that say nothing about the weights' maths
CONFIG_SKIP = frozenset({"_name_or_path", "transformers_version", "_attn_implementation",
                         "_attn_implementation_internal", "attn_implementation", "_commit_hash", "torch_dtype",
                         "dtype", "use_cache"})
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _config_json(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return "null"
    data = {k: v for k, v in config.to_dict().items() if k not in CONFIG_SKIP}
    return json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What the model's checkpoint holds: parameters and persistent buffers, by name, each tensor once (a
    tied weight under its first name). Non-persistent buffers (rotary frequencies, which dynamic rope
    scaling rewrites during a forward) are derived from the config, which is hashed already."""
    seen: set[int] = set()
    for name, t in sorted(model.state_dict(keep_vars=True).items()):
        if id(t) not in seen:
            seen.add(id(t))
            yield name, t


def bit_statistics(t: torch.Tensor) -> tuple[int, int, int, bytes]:
    """(sum, sum of squares, position-weighted sum) of the elements' bit patterns as integers, each modulo
    2^64, and the bits of a strided sample of ``SAMPLE`` elements."""
    if t.device.type == "meta":
        raise ValueError("a parameter on the meta device has no values to fingerprint")
    flat = t.detach().reshape(-1).contiguous()
    if flat.element_size() not in _INT_OF_SIZE:  # complex128 and other wide types: their bytes
        flat = flat.view(torch.uint8)
    bits = flat.view(_INT_OF_SIZE[flat.element_size()])
    total = squares = weighted = torch.zeros((), dtype=torch.int64, device=bits.device)
    offsets = torch.arange(min(CHUNK, bits.numel()), dtype=torch.int64, device=bits.device)
    for a in range(0, bits.numel(), CHUNK):
        chunk = bits[a : a + CHUNK].to(torch.int64)
        part = chunk.sum()
        total = total + part
        squares = squares + (chunk * chunk).sum()
        # sum of chunk[i] x (a + 1 + i): the position weights, from one arange kept for every chunk
        weighted = weighted + part * (a + 1) + (chunk * offsets[: chunk.numel()]).sum()
    step = max(1, bits.numel() // SAMPLE)
    sample = bits[::step][:SAMPLE].cpu().numpy().tobytes()
    return int(total), int(squares), int(weighted), sample


def model_fingerprint(model: nn.Module) -> str:
    """sha256 (hex) of the model's config and every parameter's and persistent buffer's name, shape, dtype and bit
    statistics (``bit_statistics``). ValueError for a model with parameters on the meta device."""
    h = hashlib.sha256()
    h.update(b"attnscope-model/1\0")
    h.update(_config_json(model).encode())
    with torch.no_grad():
        for name, t in _tensors(model):
            total, squares, weighted, sample = bit_statistics(t)
            h.update(f"\0{name}\0{list(t.shape)}\0{t.dtype}\0{total}\0{squares}\0{weighted}\0".encode())
            h.update(sample)
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 (hex) of the tokenizer's class, vocabulary, added tokens and special tokens."""
    added: dict[str, Any] = {str(i): str(t) for i, t in sorted(tokenizer.added_tokens_decoder.items())}
    data = {
        "class": type(tokenizer).__name__,
        "vocab": sorted(tokenizer.get_vocab().items()),
        "added": added,
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "all_special": sorted(str(t) for t in tokenizer.all_special_tokens),
    }
    h = hashlib.sha256(b"attnscope-tokenizer/1\0")
    h.update(json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
    return h.hexdigest()
