"""Record every step of a KV-cache generation and assemble it into one ordinary run.

Each forward of a generation sees only the tokens the cache has not seen: the prefill sees
the prompt, each later step one token. Every forward's capture keeps its queries and the
keys it added (``model.capture.forward.LayerRecord``): O(n x d) per step, like a run. Concatenated,
they are exactly the Q and K one fresh forward over the whole text would keep, and any
row of any head is rebuilt from them with the layer's mask over the whole sequence; the
tests check the assembled run against a fresh forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from attnscope.model.attention import kept
from attnscope.model.capture.forward import Captures, LayerListener, layers_of, publish
from attnscope.model.capture.names import act_name, kind_of
from attnscope.model.load.models import LoadedModel


@dataclass
class Recorder:
    chunks: list[Captures] = field(default_factory=list)

    def add(self, acts: Captures) -> None:
        if self.chunks:  # only the latest forward's ALiBi bias is read (it covers every key so far)
            last = self.chunks[-1]
            last.records = {i: dataclasses.replace(rec, bias=None) if rec.bias is not None else rec
                            for i, rec in last.records.items()}
        self.chunks.append(acts)

    @property
    def n(self) -> int:
        return sum(c[act_name("resid_pre", 0)].shape[0] for c in self.chunks)

    def new_rows(self, layer: int, head: int) -> list[list[float]]:
        """The rows of one head computed by the latest forward (visible keys only)."""
        recs = [c.records[layer] for c in self.chunks]
        last = recs[-1]
        r = last.q.shape[1]
        k = torch.cat([rec.k for rec in recs], dim=1)  # (Hkv, t, dh): every key so far
        t = k.shape[1]
        bias = None if last.bias is None else last.bias[head : head + 1, :t]
        z = kept.logits(last.q[head : head + 1], k, [head], last.groups, 0, t, last.scaling, last.softcap,
                             bias)[0]  # (r, t)
        allowed = recs[0].mask.whole(t).rows(t - r, t)[0]  # (r, t)
        weights = z.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
        return [weights[i, : t - r + i + 1].tolist() for i in range(r)]

    def assemble(self, lm: LoadedModel, listener: LayerListener | None = None) -> Captures:
        """The activations over all N recorded positions, under run_with_cache's names, with each
        layer's kept attention (``layers``); the ``listener`` gets the sweep of every layer's rows
        (``model.scores.live.scored_recording``: the head scores)."""
        first = self.chunks[0]
        out = Captures(first.wanted)
        for name in first:
            if kind_of(name) not in ("pattern", "rot_q", "rot_k"):
                out[name] = torch.cat([c[name] for c in self.chunks], dim=0)  # (N, d)
        out.layers = layers_of(lm, self.chunks, listener.sweep if listener is not None else None)
        publish(out, lm.info.n_layers)
        return out
