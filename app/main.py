"""Build the FastAPI app. The models load in the lifespan, never at import."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from attnscope.app import errors, routes
from attnscope.app.errors import ErrorOut
from attnscope.app.gate import Gate
from attnscope.app.middleware import AllowedHosts, BodyLimit, Cors, SecurityHeaders, UrlLimit, Utf8Json
from attnscope.app.settings import Settings
from attnscope.model.load import sources
from attnscope.model.load.models import load_model
from attnscope.model.runs.budget import mib
from attnscope.model.runs.compute import Compute, serving_threads
from attnscope.model.runs.disk import RunDir
from attnscope.model.runs.persist import RunFiles
from attnscope.model.runs.record import RunStore
from attnscope.model.runs.tile_store import Tiles
from attnscope.model.services.engine import Engine
from attnscope.model.services.survey import SurveyJobs

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parents[1] / "static"

DESCRIPTION = """Look inside a decoder-only transformer. `POST /api/runs` runs the model once over
a prompt and keeps every activation server-side under a run id; the other endpoints hand
out slices of that run (attention per head or layer, the residual stream, the logit lens).
Activations are named after TransformerLens (`blocks.{i}.attn.hook_pattern`, ...).

**Try it out:** every request body is prefilled with an example the bundled model answers. Endpoints
under `/api/runs/{run_id}/...` need a run: run `POST /api/runs` first and paste its `run_id`.
Errors are JSON `{"code", "message", "params", "detail"}`: `code` a stable snake_case name to branch on
and to translate by (the `ErrorOut` schema lists them all), `message` one line for a person in English,
`params` the values it names (a limit, a count, a model), `detail` as before codes (the message, or
the list of validation errors)."""

RUN_ID_DOC = ("a run's id, from the `run_id` of POST /api/runs (create a run first; runs are kept in memory, "
              "least recently used out: 404 says whether it expired)")


def error_responses(settings: Settings) -> dict[int | str, dict[str, Any]]:
    """The errors any request may get, documented once for every operation."""
    return {
        400: {"model": ErrorOut, "description": "A Host header this server does not answer to (localhost, "
              "127.0.0.1, [::1], the bound address and ATTNSCOPE_ALLOWED_HOSTS), or a body that cannot be read: "
              "not UTF-8, or JSON nested too deeply"},
        413: {"model": ErrorOut, "description": f"A request body over {settings.max_body_bytes:,} bytes "
              "(ATTNSCOPE_MAX_BODY_BYTES), with or without Content-Length; for an analyse (or a recorded "
              "generation), a run that could not be kept under ATTNSCOPE_RUN_STORE_BYTES or a forward that needs more "
              "than ATTNSCOPE_FORWARD_BYTES, refused before its forward"},
        415: {"model": ErrorOut, "description": "A JSON body declared in a charset other than UTF-8"},
        503: {"model": ErrorOut, "description": "The model is not loaded yet, or too many requests wait for it "
              f"(more than {settings.queue_length}, ATTNSCOPE_QUEUE_LENGTH): retry after Retry-After seconds"},
    }


def _cap(node: dict[str, Any], maximum: int) -> None:
    """Set an integer schema's maximum (in ``anyOf`` too: an optional integer)."""
    for branch in node.get("anyOf", [node]):
        if branch.get("type") == "integer":
            branch["maximum"] = maximum


def _bound(node: dict[str, Any], lo: int, hi: int) -> None:
    """Set an integer schema's minimum and maximum (in ``anyOf`` and ``prefixItems`` too)."""
    for branch in node.get("anyOf", [node]):
        if branch.get("type") == "integer":
            branch["minimum"], branch["maximum"] = lo, hi


def index_bounds(engine: Engine | None, settings: Settings) -> dict[str, tuple[int, int]]:
    """The range of each index parameter the server enforces, for the models it has loaded (the largest
    of them where several differ): layers, heads, positions of a run (at most ATTNSCOPE_MAX_TOKENS and
    the models' own limit), vocabulary ids. An index outside answers 422 (``*_out_of_range``)."""
    if engine is None or not engine.models:
        return {}
    infos = [lm.info for lm in engine.models.values()]
    tokens = max(min(settings.max_tokens, i.max_positions or settings.max_tokens) for i in infos)
    layers, heads = max(i.n_layers for i in infos), max(i.n_heads for i in infos)
    vocab = max(i.vocab_size for i in infos)
    return {"layer": (0, layers - 1), "head": (0, heads - 1), "watch_layer": (0, layers - 1),
            "watch_head": (0, heads - 1), "position": (0, tokens - 1), "q0": (0, tokens - 1), "k0": (0, tokens - 1),
            "q1": (0, tokens), "k1": (0, tokens), "id": (0, vocab - 1), "token": (0, vocab - 1),
            "token_b": (0, vocab - 1)}


def state_limits(schema: dict[str, Any], settings: Settings, engine: Engine | None = None) -> None:
    """Write this server's configured limits into its OpenAPI document, where the static schemas can only
    name the setting: top_k at most ATTNSCOPE_MAX_TOP_K, max_new_tokens at most ATTNSCOPE_MAX_NEW_TOKENS,
    every index (layer, head, position, token id, tile bounds) within what the loaded models have
    (``index_bounds``); and say on every ``run_id`` where a run id comes from."""
    components = schema.get("components", {}).get("schemas", {})
    bounds = index_bounds(engine, settings)
    for component in components.values():
        for name, prop in component.get("properties", {}).items():
            if name in bounds:
                _bound(prop, *bounds[name])
    if "AblateRequest" in components and "layer" in bounds:  # heads: [[layer, head], ...]
        pair = components["AblateRequest"]["properties"]["heads"]["items"]["prefixItems"]
        _bound(pair[0], *bounds["layer"])
        _bound(pair[1], *bounds["head"])
    if "RunRequest" in components:
        _cap(components["RunRequest"]["properties"]["top_k"], settings.max_top_k)
    if "GenerateRequest" in components:
        _cap(components["GenerateRequest"]["properties"]["max_new_tokens"], settings.max_new_tokens)
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] in bounds and parameter["in"] == "query":
                    _bound(parameter["schema"], *bounds[parameter["name"]])
                if parameter["name"] == "run_id" and parameter["in"] == "path":
                    parameter.setdefault("description", RUN_ID_DOC)
                if path == "/api/runs/{run_id}/next" and parameter["name"] == "top_k":
                    _cap(parameter["schema"], settings.max_top_k)


def build_engine(settings: Settings) -> Engine:
    # the run directory first: one that cannot be used stops the start before any model loads (RunDirError)
    folder = RunDir.open(settings.run_dir, settings.run_dir_bytes) if settings.run_dir else None
    placement = settings.placement()
    loaded = {}
    for i, (name, source) in enumerate(settings.models.items(), start=1):
        start = time.perf_counter()
        log.info("loading model %d/%d: %s from %s", i, len(settings.models), name, source)
        loaded[name] = load_model(name, source, placement)
        info = loaded[name].info
        log.info("loaded %s in %.1f s: %s, %s on %s", name, time.perf_counter() - start, info.architecture,
                 info.dtype, info.device)
    store = RunStore(settings.run_store_bytes)
    engine = Engine(loaded, settings.default_model, store, settings.max_tokens, forward_bytes=settings.forward_bytes)
    if folder is not None:
        store.backing = RunFiles(folder, engine.origin)
        log.info("runs are kept in %s (at most %s)", folder.path, mib(settings.run_dir_bytes))
    if settings.offer_installed:
        configured = set(settings.models.values())
        for name in sources.installed_known():
            if name not in settings.models and name not in configured:
                engine.offer(name, sources.KNOWN[name].about, partial(load_model, name, name, placement))
    engine.warm_up()  # the Learn views' once-per-model sweeps, in the background
    return engine


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        # the model work on one thread of the process's torch threads, every other thread on one
        # (model.runs.compute says why); the models load there too, so no other thread keeps a team
        compute = app.state.gate.compute = Compute()
        with serving_threads():
            try:
                built = app.state.engine = engine or compute.call(partial(build_engine, settings))
                built.scores.pause = app.state.tiles.prefetch.wait_quiet  # late head scores yield to tile requests
                yield
                app.state.tiles.close()
                app.state.surveys.close()
                if engine is None:  # an engine handed in may serve another app after this one
                    built.close()
                app.state.engine = None
            finally:
                app.state.gate.compute = None
                compute.close()

    app = FastAPI(title="attnscope", version="0.1.0", description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None, responses=error_responses(settings))
    generated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generated()  # kept in app.openapi_schema: the limits are written once
        state_limits(schema, settings, app.state.engine)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.engine = engine  # a prebuilt engine serves at once; otherwise the lifespan loads it
    app.state.gate = Gate(settings.queue_length)
    app.state.tiles = Tiles(settings.tile_cache_bytes)
    app.state.surveys = SurveyJobs()
    errors.install(app)
    app.include_router(routes.router)  # the one tree: /api/... and the pages
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    if settings.cors_origins:
        app.add_middleware(Cors, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["content-type"])
    app.add_middleware(Utf8Json)
    app.add_middleware(UrlLimit)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       paths={"/api/runs/import": (settings.max_run_file_bytes, "ATTNSCOPE_MAX_RUN_FILE_BYTES"),
                              "/api/surveys": (settings.max_corpus_bytes, "ATTNSCOPE_MAX_CORPUS_BYTES"),
                              "/api/surveys/open": (settings.max_run_file_bytes, "ATTNSCOPE_MAX_RUN_FILE_BYTES")})
    app.add_middleware(AllowedHosts, bound=settings.host, allowed=settings.allowed_hosts)  # before anything else
    app.add_middleware(SecurityHeaders)  # outermost: every answer has the headers, refusals too
    return app


def worker_app() -> FastAPI:
    """One worker of ``attnscope serve --workers N`` (uvicorn's factory): its settings from the environment,
    its models loaded in its lifespan, its runs shared with the other workers through the run directory."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return create_app(Settings())
