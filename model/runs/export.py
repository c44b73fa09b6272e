"""A run file read with torch and safetensors alone: the tensors by name and any head rebuilt exactly.

A run's one file format is the run file (``model/runs/runfile.py``, ``attnscope-run/1``; the API's
``GET /api/runs/{id}/export?format=attnscope``, or ``format=safetensors`` for the same file under a
``.safetensors`` name). It holds, per layer i, under TransformerLens-style names:

* ``blocks.{i}.attn.hook_rot_q``   (H, n, dh) float32 post-rotary queries
* ``blocks.{i}.attn.hook_rot_k``   (Hkv, n, dh) float32 post-rotary keys (head h reads h // groups)
* ``blocks.{i}.attn.lse``          (H, n) float32 each row's log-sum-exp (the softmax normaliser)
* ``blocks.{i}.attn.alibi``        (H, n) float32 per-key logit bias, ALiBi families only
* ``blocks.{i}.attn.visible``      (2, n) int32: row q sees keys [visible[0, q], visible[1, q])
  (every supported mask — causal, sliding window, bidirectional, local — is one range a row)
* ``blocks.0.hook_resid_pre`` and ``blocks.{i}.hook_attn_out`` / ``hook_mlp_out`` / ``hook_resid_post``
  (n, d) (block i's resid_pre is block i-1's resid_post)
* ``input_ids`` (n,) int64, and the predictions

with a JSON header (text, tokens, head scores, timings, the model's and tokenizer's fingerprints). The file
is read by its one reader, ``model.runs.runfile.read_path`` (every part checked); ``KeptRun`` is that
reader's run seen as tensors by name: ``KeptRun.load(path).pattern(layer, head)`` rebuilds a head's
weights exactly as the server does, softcap(q.k x scaling + bias), masked, exp(logit - lse).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnscope.model.runs.runfile import StoredRun, layer_tensors, read_path, visible_ranges

__all__ = ["KeptRun", "visible_ranges"]

MAX_FILE_BYTES = 1 << 40  # a file on the reader's own disk: no body limit, only what safetensors can index


@dataclass(frozen=True)
class KeptRun:
    """A run file, read back: its run (``stored.record``: every ``RunRecord`` method) and its tensors by name."""

    stored: StoredRun

    @staticmethod
    def load(path: str | Path) -> KeptRun:
        """Read a run file (``BadRunFile``, saying what is wrong, for anything else)."""
        return KeptRun(read_path(Path(path), max_bytes=MAX_FILE_BYTES))

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The kept tensors under their file names (the predictions aside)."""
        return layer_tensors(self.stored.record)

    @property
    def run(self) -> dict[str, Any]:
        """The run's summary: model, text, causal, tokens and head scores."""
        record = self.stored.record
        return {"model": record.model, "text": record.text, "causal": record.causal,
                "tokens": [t.text for t in record.summary.tokens],
                "heads": [vars(h) for h in record.summary.heads]}

    @property
    def attention(self) -> list[dict[str, Any]]:
        """Each layer's scaling, soft-cap and query heads per key head."""
        return [{"scaling": layer.scaling, "softcap": layer.softcap, "groups": layer.groups}
                for layer in self.stored.record.attention]

    @property
    def n(self) -> int:
        return self.stored.record.n

    def pattern(self, layer: int, head: int, q0: int = 0, q1: int | None = None) -> torch.Tensor:
        """(q1 - q0, n) float32: one head's exact weights for these query rows (zeros where masked)."""
        q1 = self.n if q1 is None else q1
        weights, visible = self.stored.record.head_rows(layer, head, q0, q1)  # (r, n) each
        return weights.float().masked_fill(~visible, 0.0).nan_to_num(0.0)
