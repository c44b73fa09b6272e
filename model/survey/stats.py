"""Every head's scores over a corpus: per sequence exactly as one analysis computes them, then their mean
and spread over the sequences, and each head's strongest examples.

A sequence is a document, or a window of ``max_tokens`` tokens of a longer one. Per sequence: the
analysis's exact scores (``model.scores.live.scored_run``: entropy, previous-token, first-token, peak,
induction on the sequence's own repeats) plus self-attention (the weight of each token on itself, one dot
product a row); then a Welford update of each (layer, head, score)'s mean and spread, so the corpus is
never held: what a survey keeps is O(layers x heads) numbers and k examples per head.

An example is a row where the head's largest weight on a key after the first token is among the k largest
of the corpus: the query, the key it gave that weight to, and the tokens around both. The induction score
on the corpus counts only the sequences with enough repeated tokens (``count`` says how many); the
synthetic probe (a random token sequence repeated twice, Olsson et al. 2022: ``model.scores.probes``) is
stated beside it, apart.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.attention.kept import LayerAttention
from attnscope.model.capture.forward import Captures
from attnscope.model.errors import BadInput
from attnscope.model.scores.analysis import HeadScore

# the survey's fields, in the order its tensors keep them
FIELDS = ("entropy", "prev_token", "first_token", "max", "induction", "self_attention")
CONTEXT_BEFORE = 8
CONTEXT_AFTER = 3
EXAMPLE_MIN_ROW = 4  # an example's query sees at least this many keys besides the first token


@dataclass(frozen=True, slots=True)
class Stat:
    """One score of one head over the corpus: the mean over the sequences that define it and their spread."""

    mean: Annotated[float | None, Field(description="mean over the sequences (null when none defines it)")]
    std: Annotated[float | None, Field(description="standard deviation over those sequences (null below two)")]
    count: Annotated[int, Field(description="how many sequences define it (induction: those with enough repeats)")]


@dataclass(frozen=True, slots=True)
class Example:
    """A row where this head's largest weight is among the corpus's strongest."""

    document: Annotated[int, Field(description="the document's index in the corpus (0-based, empty ones skipped)")]
    offset: Annotated[int, Field(description="the window's first token within the document (0 unless it was split)")]
    query: Annotated[int, Field(description="the query's position in the window")]
    key: Annotated[int, Field(description="where the head put its largest weight")]
    weight: Annotated[float, Field(description="that weight")]
    start: Annotated[int, Field(description="the window position of tokens[0]")]
    tokens: Annotated[list[str], Field(description=(
        "display strings of the tokens around the query (and the key when near), untrusted text"))]
    key_start: Annotated[int, Field(description="the window position of key_tokens[0]")]
    key_tokens: Annotated[list[str], Field(description="display strings of the tokens around the key")]


@dataclass(frozen=True, slots=True)
class HeadSurvey:
    layer: int
    head: int
    entropy: Stat
    prev_token: Stat
    first_token: Stat
    max: Stat
    induction: Stat
    self_attention: Stat
    induction_probe: Annotated[float | None, Field(description=(
        "the induction score on a synthetic probe (random tokens repeated twice), not on the corpus"))]
    examples: list[Example]


@dataclass(frozen=True)
class Survey:
    """What a corpus says about every head. ``means(field)`` and ``stds(field)``: (layers, heads) tensors."""

    model: str
    source: Annotated[str | None, Field(description="the corpus file's name, when read from one")]
    documents: int
    sequences: int
    tokens: int
    max_tokens: int
    top_k: int
    complete: Annotated[bool, Field(description="false while a survey is still running (or was stopped)")]
    n_layers: int
    n_heads: int
    heads: list[HeadSurvey]

    def means(self, name: str) -> torch.Tensor:
        """(layers, heads) float64: the corpus mean of one field (NaN where no sequence defines it)."""
        return self._grid(name, "mean")

    def stds(self, name: str) -> torch.Tensor:
        return self._grid(name, "std")

    def _grid(self, name: str, part: str) -> torch.Tensor:
        if name not in FIELDS:
            raise BadInput(f"{name!r} is not one of {', '.join(FIELDS)}", params={"field": name})
        out = torch.full((self.n_layers, self.n_heads), math.nan, dtype=torch.float64)
        for h in self.heads:
            value = getattr(getattr(h, name), part)
            if value is not None:
                out[h.layer, h.head] = value
        return out


@dataclass
class Accumulator:
    """The running state of a survey: Welford's count, mean and M2 per (field, layer, head), the top examples."""

    n_layers: int
    n_heads: int
    top_k: int
    count: torch.Tensor = field(init=False)  # (F, L, H) float64
    mean: torch.Tensor = field(init=False)
    m2: torch.Tensor = field(init=False)
    # per head a min-heap of (weight, tie-break, example)
    best: list[list[tuple[float, int, Example]]] = field(init=False)
    documents: int = 0
    sequences: int = 0
    tokens: int = 0
    _serial: int = 0

    def __post_init__(self) -> None:
        shape = (len(FIELDS), self.n_layers, self.n_heads)
        self.count = torch.zeros(shape, dtype=torch.float64)
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.m2 = torch.zeros(shape, dtype=torch.float64)
        self.best = [[] for _ in range(self.n_layers * self.n_heads)]

    def add(self, values: torch.Tensor) -> None:
        """One sequence's scores (F, L, H) float64, NaN where it defines none."""
        seen = ~torch.isnan(values)
        x = torch.nan_to_num(values)
        self.count += seen
        delta = torch.where(seen, x - self.mean, 0.0)
        self.mean += torch.where(seen, delta / self.count.clamp_min(1), 0.0)
        self.m2 += torch.where(seen, delta * (x - self.mean), 0.0)
        self.sequences += 1

    def reserve_ties(self, count: int) -> None:
        """Tie-breaks below -``count`` for what is offered from now on (a resumed survey's restored examples
        hold 0..-(count - 1)): two heap items never tie, so an Example is never compared."""
        self._serial = max(self._serial, count)

    def offer(self, layer: int, head: int, example: Example) -> None:
        heap = self.best[layer * self.n_heads + head]
        self._serial += 1
        item = (example.weight, -self._serial, example)
        if len(heap) < self.top_k:
            heapq.heappush(heap, item)
        elif item[0] > heap[0][0]:
            heapq.heapreplace(heap, item)

    def floor(self, layer: int, head: int) -> float:
        """The weight an example must beat to enter this head's top k."""
        heap = self.best[layer * self.n_heads + head]
        return heap[0][0] if len(heap) >= self.top_k else -1.0

    def result(self, *, model: str, source: str | None, max_tokens: int, complete: bool,
               probe: list[list[float]] | None) -> Survey:
        heads = []
        for layer in range(self.n_layers):
            for head in range(self.n_heads):
                stats = {}
                for f, name in enumerate(FIELDS):
                    c = int(self.count[f, layer, head])
                    mean = float(self.mean[f, layer, head]) if c else None
                    std = math.sqrt(float(self.m2[f, layer, head]) / (c - 1)) if c > 1 else None
                    stats[name] = Stat(mean, std, c)
                examples = [e for _w, _s, e in sorted(self.best[layer * self.n_heads + head], reverse=True)]
                heads.append(HeadSurvey(layer=layer, head=head, induction_probe=None if probe is None
                                        else float(probe[layer][head]), examples=examples, **stats))
        return Survey(model=model, source=source, documents=self.documents, sequences=self.sequences,
                      tokens=self.tokens, max_tokens=max_tokens, top_k=self.top_k, complete=complete,
                      n_layers=self.n_layers, n_heads=self.n_heads, heads=heads)


def self_weights(kept: LayerAttention) -> torch.Tensor:
    """(H, n) float32: each token's weight on itself, one dot product a row (the diagonal is always visible)."""
    k = kept.k.float().repeat_interleave(kept.groups, dim=0)  # (H, n, dh)
    z = (kept.q.float() * k).sum(-1) * kept.scaling  # (H, n)
    if kept.bias is not None:
        z = z + kept.bias
    if kept.softcap is not None:
        z = torch.tanh(z / kept.softcap) * kept.softcap
    return (z - kept.lse).exp()


def strongest_keys(kept: LayerAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """((H, n) weights, (H, n) keys): each row's largest weight on a key after the first token, and that key.

    The first token is left out (the sink: where most heads put their spare attention, which the
    first-token score measures), and so are the rows before ``EXAMPLE_MIN_ROW`` (weight -1), whose few keys
    make any weight large. One pass over the rows' exact weights, a block at a time."""
    weights, keys = [], []
    for _q0, _q1, w, _visible in kept.blocks():
        w[..., 0] = 0.0
        best, where = w.max(-1)  # (H, r)
        weights.append(best)
        keys.append(where)
    top, at = torch.cat(weights, dim=1), torch.cat(keys, dim=1)
    top[:, :EXAMPLE_MIN_ROW] = -1.0
    return top, at


def sequence_values(heads: list[HeadScore], layers: list[LayerAttention], n_layers: int, n_heads: int
                    ) -> torch.Tensor:
    """(F, L, H) float64: one sequence's scores, NaN where a score is undefined (too few repeats)."""
    out = torch.full((len(FIELDS), n_layers, n_heads), math.nan, dtype=torch.float64)
    for s in heads:
        for f, name in enumerate(FIELDS[:-1]):
            value = getattr(s, name)
            if value is not None:
                out[f, s.layer, s.head] = value
    for layer, kept in enumerate(layers):
        out[-1, layer] = self_weights(kept).double().mean(-1).cpu()
    return out


def _context(tokens: list[str], at: int, before: int, after: int) -> tuple[int, list[str]]:
    start = max(0, at - before)
    return start, tokens[start: at + after + 1]


def offer_examples(acc: Accumulator, acts: Captures, texts: list[str], document: int, offset: int) -> None:
    """Each head's rows that beat its current top k: their strongest key and the tokens around both."""
    n = len(texts)
    if n <= EXAMPLE_MIN_ROW:
        return
    for layer, kept in enumerate(acts.layers):
        top, at = strongest_keys(kept)
        k = min(acc.top_k, n - EXAMPLE_MIN_ROW)
        values, rows = top.cpu().topk(k, dim=-1)  # (H, k)
        keys = at.cpu().gather(1, rows)
        for head in range(kept.n_heads):
            floor = acc.floor(layer, head)
            for value, query, key in zip(values[head].tolist(), rows[head].tolist(), keys[head].tolist(), strict=True):
                if value <= floor:
                    break
                start, around = _context(texts, query, CONTEXT_BEFORE, CONTEXT_AFTER)
                key_start, key_around = _context(texts, key, 3, 2)
                acc.offer(layer, head, Example(document=document, offset=offset, query=query, key=key, weight=value,
                                               start=start, tokens=around, key_start=key_start, key_tokens=key_around))
                floor = acc.floor(layer, head)
