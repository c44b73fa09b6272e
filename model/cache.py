"""The per-run activation cache and the byte-capped LRU that keeps runs server-side."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from model.errors import RunNotFound


def tril_mask(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)


@dataclass
class ActivationCache:
    """Everything one forward produced that the API may hand out later.

    Shapes (n tokens, L layers, H heads, d = d_model):

    * ``patterns``  list of L tensors (H, n, n) float32, exactly as the model's eager
      attention produced them (kept without a copy: capture costs no extra pass); the
      masked future of a causal model holds exact zeros and is dropped when sliced;
    * ``resid``     L+1 tensors (n, d) float32: entry 0 is the embedding output
      (``blocks.0.hook_resid_pre``), entry i+1 is ``blocks.{i}.hook_resid_post``;
    * ``attn_out``  L tensors (n, d), ``blocks.{i}.hook_attn_out``;
    * ``mlp_out``   L tensors (n, d), ``blocks.{i}.hook_mlp_out``;

    All are the captured tensors themselves, not copies.
    * ``input_ids`` (n,) int64.

    ``summary`` holds the JSON-ready run response (tokens, predictions, head scores).
    """

    model: str
    causal: bool
    input_ids: torch.Tensor
    patterns: list[torch.Tensor]
    resid: list[torch.Tensor]
    attn_out: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    summary: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    # the summary's Python objects (tokens, predictions, head scores), estimated once when stored
    summary_bytes: int = 0

    @property
    def n(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_layers(self) -> int:
        return len(self.patterns)

    @property
    def n_heads(self) -> int:
        return int(self.patterns[0].shape[0])

    @property
    def nbytes(self) -> int:
        tensors = [self.input_ids, *self.resid, *self.attn_out, *self.mlp_out, *self.patterns]
        return sum(t.numel() * t.element_size() for t in tensors) + self.summary_bytes

    def packed(self, layer: int, head: int | None = None) -> torch.Tensor:
        """(H or 1, cells): the visible cells of one layer (or one head), row-major."""
        pattern = self.patterns[layer] if head is None else self.patterns[layer][head : head + 1]
        return pack_pattern(pattern, self.causal)

    def pattern(self, layer: int) -> torch.Tensor:
        """(H, n, n) dense pattern with exact zeros in the masked future."""
        return self.patterns[layer]

    def __getitem__(self, name: str) -> torch.Tensor:
        """TransformerLens-style access: ``cache["blocks.0.attn.hook_pattern"]``."""
        parts = name.split(".")
        if parts[0] != "blocks" or len(parts) < 3:
            raise KeyError(name)
        i, kind = int(parts[1]), ".".join(parts[2:])
        if kind == "attn.hook_pattern":
            return self.pattern(i)
        table = {"hook_resid_pre": lambda: self.resid[i], "hook_resid_post": lambda: self.resid[i + 1],
                 "hook_attn_out": lambda: self.attn_out[i], "hook_mlp_out": lambda: self.mlp_out[i]}
        if kind not in table:
            raise KeyError(name)
        return table[kind]()


def pack_pattern(pattern: torch.Tensor, causal: bool) -> torch.Tensor:
    """(H, n, n) -> (H, cells): drop the masked future of a causal pattern."""
    if causal:
        return pattern[:, tril_mask(pattern.shape[-1], pattern.device)].contiguous()
    return pattern.reshape(pattern.shape[0], -1).contiguous()


class RunStore:
    """Runs by id, least recently used first out, with the total size capped in bytes.

    Thread-safe: handlers run in a thread pool. Evicted ids are remembered (boundedly)
    so that a client is told its run *expired* rather than that it never existed.
    """

    def __init__(self, max_bytes: int, remember_evicted: int = 10_000) -> None:
        self.max_bytes = max_bytes
        self._runs: OrderedDict[str, ActivationCache] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_evicted
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def add(self, cache: ActivationCache) -> str:
        run_id = secrets.token_urlsafe(12)
        size = cache.nbytes
        with self._lock:
            self._runs[run_id] = cache
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._runs) > 1:
                old_id, old = self._runs.popitem(last=False)
                self._bytes -= old.nbytes
                self._forget(old_id)
        return run_id

    def _forget(self, run_id: str) -> None:
        self._evicted[run_id] = None
        while len(self._evicted) > self._remember:
            self._evicted.popitem(last=False)

    def get(self, run_id: str) -> ActivationCache:
        with self._lock:
            cache = self._runs.get(run_id)
            if cache is None:
                raise RunNotFound(run_id, expired=run_id in self._evicted)
            self._runs.move_to_end(run_id)
            return cache
