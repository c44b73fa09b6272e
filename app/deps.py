"""Typed dependencies: the engine, settings and gate live on ``app.state``."""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import Depends, Request

from attnscope.app.gate import Gate
from attnscope.app.settings import Settings
from attnscope.model.errors import ModelLoadError
from attnscope.model.runs.tile_store import Tiles
from attnscope.model.services.engine import Engine
from attnscope.model.services.survey import SurveyJobs

T = TypeVar("T")


def get_engine(request: Request) -> Engine:
    engine = getattr(request.app.state, "engine", None)
    if not isinstance(engine, Engine):
        raise ModelLoadError("the model is not loaded yet; try again in a moment", code="loading")
    return engine


def _state(request: Request, name: str, kind: type[T]) -> T:
    """``app.state.<name>``, checked to be a ``kind`` (create_app puts each there)."""
    value = getattr(request.app.state, name, None)
    if not isinstance(value, kind):
        raise TypeError(f"app.state.{name} is not a {kind.__name__}: build the app with attnscope.app.main.create_app")
    return value


def get_settings(request: Request) -> Settings:
    return _state(request, "settings", Settings)


def get_gate(request: Request) -> Gate:
    return _state(request, "gate", Gate)


def get_tiles(request: Request) -> Tiles:
    return _state(request, "tiles", Tiles)


def get_surveys(request: Request) -> SurveyJobs:
    return _state(request, "surveys", SurveyJobs)


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
GateDep = Annotated[Gate, Depends(get_gate)]
TilesDep = Annotated[Tiles, Depends(get_tiles)]
SurveysDep = Annotated[SurveyJobs, Depends(get_surveys)]
