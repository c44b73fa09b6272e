"""Typed results the engine hands to its callers (plain data, no HTTP), and the field types they share.

Each result is declared once: the routes return these dataclasses as they are (FastAPI serialises a
dataclass as its ``response_model``), and a field's description lives here, on its one declaration
(``Annotated[T, Field(description=...)]``). Matrices a researcher computes with are tensors
(``Matrix``: a float tensor that JSON writes as nested lists, row by row).
Token strings are display strings (``model.load.tokens.token_map``): untrusted text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field, PlainSerializer, PlainValidator, WithJsonSchema

from attnscope.model.load.tokens import Token
from attnscope.model.scores.analysis import HeadScore


def _as_tensor(value: Any) -> torch.Tensor:
    # float64 from JSON: a float32 tensor's numbers survive it exactly, and a float64 one's too
    return value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float64)


def _as_lists(value: torch.Tensor) -> Any:
    return value.tolist()


# (rows, cols) float tensor in Python; in JSON rows of numbers (NaN written as null)
Matrix = Annotated[torch.Tensor, PlainValidator(_as_tensor),
                   PlainSerializer(_as_lists, return_type=list[list[float]]),
                   WithJsonSchema({"type": "array", "items": {"type": "array", "items": {"type": "number"}}})]
# (n,) float tensor in Python; in JSON a list of numbers
Vector = Annotated[torch.Tensor, PlainValidator(_as_tensor), PlainSerializer(_as_lists, return_type=list[float]),
                   WithJsonSchema({"type": "array", "items": {"type": "number"}})]


@dataclass(frozen=True, slots=True)
class TokenRef:
    """A vocabulary id and its display string (untrusted text)."""

    id: int
    token: Annotated[str, Field(description="display string of the vocabulary entry")]


@dataclass(frozen=True, slots=True)
class TokenProb:
    """One candidate next token and its probability."""

    id: int
    token: str
    prob: float


@dataclass(frozen=True, slots=True)
class ActualNext:
    """The prompt's own next token under a distribution."""

    id: int
    token: str
    prob: float
    rank: Annotated[int, Field(description="1 = the model's most likely token")]


@dataclass(frozen=True, slots=True)
class PositionPrediction:
    position: int
    top: list[TokenProb]
    actual_next: ActualNext | None  # None at the last position


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one analysed prompt reports besides its tensors."""

    model: str
    tokens: list[Token]
    predictions: list[PositionPrediction]  # empty for encoders
    heads: list[HeadScore]  # layer by layer, head by head
    timing_ms: dict[str, float]
    # HeadScore fields still being computed after the analyse answered ("entropy", "max"): None in heads
    scores_pending: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NextDistribution:
    position: int
    temperature: float
    top: Annotated[list[TokenProb], Field(description="softmax(logits / temperature) over the whole vocabulary, top-k")]
    actual_next: Annotated[ActualNext | None, Field(description="the prompt's own next token at this temperature")]
    entropy: Annotated[float, Field(description="entropy of the re-scaled distribution, nats")]


@dataclass(frozen=True, slots=True)
class LensPosition:
    position: int
    top: list[TokenProb]


@dataclass(frozen=True, slots=True)
class LensStage:
    layer: Annotated[int, Field(description="-1 = the embedding output, i = after block i")]
    label: str
    positions: list[LensPosition]


@dataclass(frozen=True, slots=True)
class LogitLens:
    n_layers: int
    n: int
    top_k: int
    layers: list[LensStage]
