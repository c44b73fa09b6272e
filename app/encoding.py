"""Attention slices as JSON rows or as compact bytes.

Binary layout (``?format=bin``, ``application/octet-stream``), documented in the API:
one unsigned byte per *visible* cell, no header in the body — the shape travels in
response headers (``X-Attn-N``, ``X-Attn-Heads``, ``X-Attn-Causal``, ``X-Attn-Layer``,
``X-Attn-Head``, ``X-Attn-Encoding: sqrt-u8``). Cells are row-major by query; for a
causal model row i holds keys 0..i (i+1 bytes), for an encoder every row holds n.
With several heads, each head's block follows the previous one. A byte q stands for
the weight (q / 255)²: square-root companding keeps the small weights of long
prompts visible (1/1024 is q = 8) while a weight near 1 is within 0.004.
"""

from __future__ import annotations

import numpy as np
import torch


def sqrt_u8(packed: torch.Tensor) -> bytes:
    """(..., cells) float weights in [0, 1] -> bytes, one per cell."""
    q = torch.round(packed.clamp(0, 1).sqrt() * 255).to(torch.uint8)
    return q.numpy().tobytes()


def decode_sqrt_u8(data: bytes) -> np.ndarray:
    return (np.frombuffer(data, dtype=np.uint8).astype(np.float32) / 255.0) ** 2


def rows(pattern: torch.Tensor, causal: bool, decimals: int = 6) -> list[list[float]]:
    """(n, n) one head -> rows of visible weights (causal: row i keeps i+1), rounded for JSON."""
    values = np.round(pattern.numpy().astype(np.float64), decimals)
    if not causal:
        full: list[list[float]] = values.tolist()
        return full
    return [values[i, : i + 1].tolist() for i in range(values.shape[0])]
