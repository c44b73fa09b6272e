"""Typed dependencies: the engine, settings and gate live on ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.gate import Gate
from app.settings import Settings
from model.engine import Engine
from model.errors import ModelLoadError


def get_engine(request: Request) -> Engine:
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        raise ModelLoadError("the model is not loaded yet; try again in a moment")
    return engine


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_gate(request: Request) -> Gate:
    return request.app.state.gate


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
GateDep = Annotated[Gate, Depends(get_gate)]
