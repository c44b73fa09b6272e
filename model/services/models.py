"""The models service: what the server says of each model it offers (its shape, token limit and induction
probe) and of the run directory behind its store, for the HTTP door's /api/models and /api/health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from attnscope.model.load.models import ModelInfo
from attnscope.model.runs.persist import RunFiles
from attnscope.model.scores import probes
from attnscope.model.services.engine import Engine


@dataclass(frozen=True, slots=True)
class ModelView:
    """One model as a client meets it: its facts, whether it is the default, its token limit and its heads'
    induction scores on the repeated-random-token probe (layers x heads, measured once per model)."""

    info: ModelInfo
    default: bool
    max_tokens: int
    induction_scores: list[list[float]]


@dataclass(frozen=True, slots=True)
class Offered:
    """A model the server offers but has not loaded (an installed named model): loaded on first use."""

    name: str
    about: Annotated[str, Field(description="what the model is and where it comes from")]


@dataclass(frozen=True, slots=True)
class RunDirUsage:
    path: str
    nbytes: int


def view(engine: Engine, *, name: str) -> ModelView:
    """A loaded model, or an offered one loaded now (UnknownModel for any other name)."""
    lm = engine.model(name)
    return ModelView(info=lm.info, default=name == engine.default, max_tokens=engine.token_limit(lm),
                     induction_scores=probes.induction(lm))


def loaded(engine: Engine) -> list[ModelView]:
    return [view(engine, name=name) for name in engine.models]


def offered(engine: Engine) -> list[Offered]:
    return [Offered(name=name, about=about) for name, (about, _loader) in engine.loadable.items()]


def run_dir(engine: Engine) -> RunDirUsage | None:
    """The run directory behind the store and the bytes its files take, or None (memory only)."""
    backing = engine.store.backing
    if not isinstance(backing, RunFiles):
        return None
    return RunDirUsage(path=str(backing.folder.path), nbytes=backing.folder.nbytes)
