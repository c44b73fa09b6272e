"""Build the FastAPI app. The models load in the lifespan, never at import."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from app import errors
from app.gate import Gate
from app.middleware import BodyLimit, SecurityHeaders
from app.routes import generate, interventions, learn, models, pages, runs
from app.settings import Settings
from model.cache import RunStore
from model.engine import Engine
from model.loading import load_model
from model.tilecache import Tiles

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parents[1] / "static"

DESCRIPTION = """Look inside a decoder-only transformer. `POST /api/runs` runs the model once over
a prompt and keeps every activation server-side under a run id; the other endpoints hand
out slices of that run (attention per head or layer, the residual stream, the logit lens).
Activations are named after TransformerLens (`blocks.{i}.attn.hook_pattern`, ...)."""


def build_engine(settings: Settings) -> Engine:
    placement = settings.placement()
    loaded = {}
    for i, (name, source) in enumerate(settings.models.items(), start=1):
        start = time.perf_counter()
        log.info("loading model %d/%d: %s from %s", i, len(settings.models), name, source)
        loaded[name] = load_model(name, source, placement)
        info = loaded[name].info
        log.info("loaded %s in %.1f s: %s, %s on %s", name, time.perf_counter() - start, info.architecture,
                 info.dtype, info.device)
    return Engine(loaded, settings.default_model, RunStore(settings.cache_bytes), settings.max_tokens,
                  forward_bytes=settings.forward_bytes)


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        built = app.state.engine = engine or build_engine(settings)
        built.scores.pause = app.state.tiles.prefetch.wait_quiet  # late head scores yield to tile requests
        yield
        app.state.tiles.close()
        if engine is None:  # an engine handed in may serve another app after this one
            built.close()
        app.state.engine = None

    app = FastAPI(title="attnscope", version="0.1.0", description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.engine = engine  # a prebuilt engine serves at once; otherwise the lifespan loads it
    app.state.gate = Gate(settings.queue_length)
    app.state.tiles = Tiles(settings.tile_cache_bytes)
    errors.install(app)
    app.include_router(models.router)
    app.include_router(runs.router)
    app.include_router(generate.router)
    app.include_router(learn.router)
    app.include_router(interventions.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["content-type"])
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(SecurityHeaders)
    return app
