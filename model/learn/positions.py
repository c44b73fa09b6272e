"""Learn §6, "Position information": the learned position table of a model that has one (its
first rows and their cosines), or the frequencies and angles a rotary model turns its heads by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.families.table import PositionEncoding
from attnscope.model.families.weights import rotary
from attnscope.model.load.models import LoadedModel, position_embeddings


@dataclass(frozen=True, slots=True)
class PositionTable:
    model: str
    kind: PositionEncoding
    count: int
    d_model: int | None = None
    matrix: Annotated[list[list[float]] | None, Field(description=(
        "learned: the first `count` rows of the position table"))] = None
    similarity: Annotated[list[list[float]] | None, Field(description="learned: cosine between position rows")] = None
    theta: float | None = None  # rotary: the base
    rotary_dims: int | None = None
    inv_freq: Annotated[list[float] | None, Field(description=(
        "rotary: the rotation frequency of each pair of dimensions"))] = None
    angles: Annotated[list[list[float]] | None, Field(description="rotary: cos(position x frequency)")] = None


def position_table(lm: LoadedModel, count: int) -> PositionTable:
    """The first ``count`` positions (the caller keeps it within the model's positions)."""
    kind, name = lm.spec.position_encoding, lm.info.name
    learned = position_embeddings(lm)
    if kind == "learned" and learned is not None:
        table = learned.detach().float()[:count].cpu()  # (P, d)
        unit = torch.nn.functional.normalize(table, dim=-1)
        return PositionTable(model=name, kind="learned", count=table.shape[0], d_model=table.shape[1],
                             matrix=table.tolist(), similarity=(unit @ unit.T).tolist())
    if kind == "rotary":
        rope = rotary(lm.model.config, lm.info.d_head)
        inv_freq = 1.0 / rope.theta ** (torch.arange(0, rope.dims, 2).float() / rope.dims)  # (dims/2,)
        angles = torch.arange(count).float()[:, None] * inv_freq[None]  # (P, dims/2)
        return PositionTable(model=name, kind="rotary", count=count, theta=rope.theta, rotary_dims=rope.dims,
                             inv_freq=inv_freq.tolist(), angles=angles.cos().tolist())
    return PositionTable(model=name, kind=kind, count=0)
