"""Typed results the engine hands to its callers (plain data, no HTTP).

``app/`` turns each into its pydantic response schema; nothing here is shaped for JSON.
Token strings are display strings (``model.load.tokens.token_map``): untrusted text.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.model.load.tokens import Token
from attnscope.model.scores.analysis import HeadScore


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
    rank: int  # 1 = the most likely token


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
    top: list[TokenProb]  # softmax(logits / temperature), top-k
    actual_next: ActualNext | None
    entropy: float  # nats, of the re-scaled distribution


@dataclass(frozen=True, slots=True)
class LensPosition:
    position: int
    top: list[TokenProb]


@dataclass(frozen=True, slots=True)
class LensStage:
    layer: int  # -1 = the embedding output, i = after block i
    label: str
    positions: list[LensPosition]


@dataclass(frozen=True, slots=True)
class LogitLens:
    n_layers: int
    n: int
    top_k: int
    layers: list[LensStage]
