"""Typed dependencies: the engine, settings and gate live on ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from attnscope.app.gate import Gate
from attnscope.app.settings import Settings
from attnscope.model.errors import ModelLoadError
from attnscope.model.runs.tile_store import Tiles
from attnscope.model.services.engine import Engine


def get_engine(request: Request) -> Engine:
    engine = getattr(request.app.state, "engine", None)
    if not isinstance(engine, Engine):
        raise ModelLoadError("the model is not loaded yet; try again in a moment", code="loading")
    return engine


def get_settings(request: Request) -> Settings:
    settings = request.app.state.settings
    if not isinstance(settings, Settings):
        raise TypeError("app.state.settings is not a Settings: build the app with attnscope.app.main.create_app")
    return settings


def get_gate(request: Request) -> Gate:
    gate = request.app.state.gate
    if not isinstance(gate, Gate):
        raise TypeError("app.state.gate is not a Gate: build the app with attnscope.app.main.create_app")
    return gate


def get_tiles(request: Request) -> Tiles:
    tiles = request.app.state.tiles
    if not isinstance(tiles, Tiles):
        raise TypeError("app.state.tiles is not a Tiles: build the app with attnscope.app.main.create_app")
    return tiles


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
GateDep = Annotated[Gate, Depends(get_gate)]
TilesDep = Annotated[Tiles, Depends(get_tiles)]
