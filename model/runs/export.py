"""A run exported as what it keeps: one safetensors file, and the loader that rebuilds any head.

The file (``GET /api/runs/{id}/export?format=safetensors``) holds, per layer i, under
TransformerLens-style names:

* ``blocks.{i}.attn.hook_rot_q``   (H, n, dh) float32 post-rotary queries
* ``blocks.{i}.attn.hook_rot_k``   (Hkv, n, dh) float32 post-rotary keys (head h reads h // groups)
* ``blocks.{i}.attn.lse``          (H, n) float32 each row's log-sum-exp (the softmax normaliser)
* ``blocks.{i}.attn.alibi``        (H, n) float32 per-key logit bias, ALiBi families only
* ``blocks.{i}.attn.visible``      (2, n) int32: row q sees keys [visible[0, q], visible[1, q])
  (every supported mask — causal, sliding window, bidirectional, local — is one range a row)
* ``blocks.0.hook_resid_pre`` and ``blocks.{i}.hook_attn_out`` / ``hook_mlp_out`` / ``hook_resid_post``
  (n, d) (block i's resid_pre is block i-1's resid_post)
* ``input_ids`` (n,) int64

and string metadata: ``format`` ("attnscope-run-tensors/1"), ``run`` (JSON: model, text, tokens,
head scores, model info) and ``attention`` (JSON: per layer scaling, softcap, groups).

A run file (``model/runs/runfile.py``, "attnscope-run/1") holds the same tensors under the same names:
``KeptRun.load`` reads it too (its ``run`` is then the run header). Loading needs only torch and
safetensors (``KeptRun.load(path)``); ``KeptRun.pattern(layer, head)``
rebuilds a head's weights exactly as the server does: softcap(q.k x scaling + bias), masked,
exp(logit - lse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from attnscope.model.attention.kept import logits
from attnscope.model.runs.record import RunRecord
from attnscope.model.runs.runfile import FORMAT as RUN_FORMAT
from attnscope.model.runs.runfile import META_KEY, layer_tensors, visible_ranges

__all__ = ["FORMAT", "KeptRun", "to_safetensors", "visible_ranges"]

FORMAT = "attnscope-run-tensors/1"


def to_safetensors(record: RunRecord, run: dict[str, Any]) -> bytes:
    """The file's bytes; ``run`` is the run's JSON summary (model, text, tokens, heads, model_info)."""
    tensors = layer_tensors(record)  # the run file's tensors, under the same names
    params = [{"scaling": layer.scaling, "softcap": layer.softcap, "groups": layer.groups}
              for layer in record.attention]
    meta = {"format": FORMAT, "run": json.dumps(run, separators=(",", ":")),
            "attention": json.dumps(params, separators=(",", ":"))}
    data: bytes = save(tensors, metadata=meta)
    return data


@dataclass(frozen=True)
class KeptRun:
    """An exported run, read back: tensors by name, the run's summary, each layer's parameters."""

    tensors: dict[str, torch.Tensor]
    run: dict[str, Any]
    attention: list[dict[str, Any]]

    @staticmethod
    def load(path: str | Path) -> KeptRun:
        raw = Path(path).read_bytes()
        header_len = int.from_bytes(raw[:8], "little")
        meta = json.loads(raw[8 : 8 + header_len]).get("__metadata__", {})
        if meta.get("format") == RUN_FORMAT:
            header = json.loads(meta[META_KEY])
            return KeptRun(tensors=load(raw), run=header, attention=header["layers"])
        if meta.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} file (format: {meta.get('format')!r})")
        return KeptRun(tensors=load(raw), run=json.loads(meta["run"]), attention=json.loads(meta["attention"]))

    @property
    def n(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def pattern(self, layer: int, head: int, q0: int = 0, q1: int | None = None) -> torch.Tensor:
        """(q1 - q0, n) float32: one head's exact weights for these query rows (zeros where masked)."""
        q1 = self.n if q1 is None else q1
        p = self.attention[layer]
        t = self.tensors
        bias = t.get(f"blocks.{layer}.attn.alibi")
        z = logits(t[f"blocks.{layer}.attn.hook_rot_q"][[head], q0:q1], t[f"blocks.{layer}.attn.hook_rot_k"], [head],
                   int(p["groups"]), 0, self.n, float(p["scaling"]), p["softcap"],
                   None if bias is None else bias[[head]])[0]  # (r, n)
        lo, hi = t[f"blocks.{layer}.attn.visible"][:, q0:q1]
        keys = torch.arange(self.n)[None, :]
        seen = (keys >= lo[:, None]) & (keys < hi[:, None])
        lse = t[f"blocks.{layer}.attn.lse"][head, q0:q1]
        return (z - lse[:, None]).exp().masked_fill(~seen, 0.0).nan_to_num(0.0)
