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

import base64

import numpy as np
import torch
from fastapi import Response


def sqrt_u8(packed: torch.Tensor) -> bytes:
    """(..., cells) float weights in [0, 1] -> bytes, one per cell."""
    q = torch.round(packed.clamp(0, 1).sqrt() * 255).to(torch.uint8)
    return q.cpu().numpy().tobytes()  # a GPU run's weights come back to the host here


def u8_tile(values: torch.Tensor) -> bytes:
    """(..., cells) pooled weights with NaN for hidden bins -> one byte a bin.

    A byte q < 255 stands for the weight (q / 254)²; 255 (MASKED_U8) is a bin with no
    visible cell.
    """
    hidden = values.isnan()
    q = torch.round(values.nan_to_num(0.0).clamp(0, 1).sqrt() * 254).to(torch.uint8)
    return q.masked_fill(hidden, MASKED_U8).cpu().numpy().tobytes()  # a GPU run's tile too



MASKED_U8 = 255  # the byte of a tile's bin with no visible cell


def f32_le(packed: torch.Tensor) -> bytes:
    """(..., cells) weights -> little-endian float32 bytes, exact."""
    return packed.to(torch.float32).cpu().numpy().astype("<f4").tobytes()


def f32_base64(packed: torch.Tensor) -> str:
    """(cells,) one head's visible cells -> base64 of little-endian float32: exact and ~5.3
    characters a cell, where JSON numbers with float32's 9 significant digits take ~12."""
    return base64.b64encode(f32_le(packed)).decode("ascii")


def rows_from_f32_base64(data: str, n: int, causal: bool) -> list[list[float]]:
    """The inverse of f32_base64, split into rows (causal: row i holds i+1 keys)."""
    values = np.frombuffer(base64.b64decode(data), dtype="<f4").astype(np.float64)
    widths = [i + 1 for i in range(n)] if causal else [n] * n
    if len(values) != sum(widths):
        raise ValueError(f"expected {sum(widths)} float32 cells for n = {n}, found {len(values)}")
    starts = np.cumsum([0, *widths[:-1]])
    return [values[s : s + w].tolist() for s, w in zip(starts, widths, strict=True)]


def decode_sqrt_u8(data: bytes) -> np.ndarray:
    return (np.frombuffer(data, dtype=np.uint8).astype(np.float32) / 255.0) ** 2


def rows(pattern: torch.Tensor, causal: bool, decimals: int = 6) -> list[list[float]]:
    """(n, n) one head -> rows of visible weights (causal: row i keeps i+1), rounded for JSON."""
    values = np.round(pattern.detach().cpu().numpy().astype(np.float64), decimals)  # a GPU run's pattern too
    if not causal:
        full: list[list[float]] = values.tolist()
        return full
    return [values[i, : i + 1].tolist() for i in range(values.shape[0])]


def attention_bytes(body: bytes, *, n: int, heads: int, causal: bool, layer: int, head: int | None, encoding: str,
                    cacheable: bool = True, extra: dict[str, str] | None = None,
                    timing: str | None = None) -> Response:
    """The one encoder of the binary protocol: the body with the headers that say its shape
    (``X-Attn-N``, ``-Heads``, ``-Causal``, ``-Layer``, ``-Head``, ``-Encoding``, then ``extra``: a key
    such as ``Q0`` becomes ``X-Attn-Q0``), and ``Server-Timing`` when ``timing`` is given."""
    headers = {"X-Attn-N": str(n), "X-Attn-Heads": str(heads), "X-Attn-Causal": "1" if causal else "0",
               "X-Attn-Layer": str(layer), "X-Attn-Head": "all" if head is None else str(head),
               "X-Attn-Encoding": encoding}
    headers.update({f"X-Attn-{key}": value for key, value in (extra or {}).items()})
    if timing is not None:
        headers["Server-Timing"] = timing
    if cacheable:
        headers["Cache-Control"] = "private, max-age=3600"
    return Response(body, media_type="application/octet-stream", headers=headers)
