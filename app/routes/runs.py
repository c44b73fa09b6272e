"""Analyse a prompt once, then read the stored run in slices."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Annotated, Literal

import anyio
import numpy as np
from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnscope.app import standalone
from attnscope.app.deps import EngineDep, GateDep, SettingsDep, TilesDep
from attnscope.app.encoding import MASKED_U8, attention_bytes, f32_le, rows, sqrt_u8, u8_tile
from attnscope.app.errors import ERRORS, ErrorOut
from attnscope.app.runjson import (
    EXPORT_FORMAT,
    HEADS_JSON,
    LENS_JSON,
    RUN_JSON,
    RunBody,
    attention_cells,
    attention_json,
    run_body,
)
from attnscope.app.schemas import (
    MAX_TOP_K_SETTING,
    AttentionOut,
    AttentionTileOut,
    LayerAttentionOut,
    RunRequest,
    SparsityOut,
    StoredOut,
    TruncatedOut,
)
from attnscope.app.settings import DEFAULT_TOP_K, Settings
from attnscope.app.upload import spooled
from attnscope.model.errors import BadInput
from attnscope.model.results import LogitLens, NextDistribution
from attnscope.model.runs.record import RunRecord
from attnscope.model.runs.tiles import TileSpec
from attnscope.model.services import files, runs
from attnscope.model.services.runs import Heads, Residual

router = APIRouter(tags=["runs"])

BINARY_DOC = (
    "With `format=bin` the body is `application/octet-stream`: one byte per visible cell, "
    "row-major by query (causal: row i holds keys 0..i; encoder: n keys per row), heads one "
    "after another when no head is given. A byte q means weight (q/255)². The shape is in "
    "the headers X-Attn-N, X-Attn-Heads, X-Attn-Causal, X-Attn-Layer, X-Attn-Head and "
    "X-Attn-Encoding (sqrt-u8). With `format=f32` the same cells are little-endian float32, "
    "the exact weights (4 bytes a cell; X-Attn-Encoding: f32): what a reader of values wants "
    "where the 8-bit view is for drawing."
)
TILE_DOC = (
    "\n\n**Tiles.** Any of `q0`, `q1`, `k0`, `k1`, `pool` (or `size` with a `head`) asks for a tile: "
    "queries [q0, q1) x keys [k0, k1) (defaults: the whole head) as exactly min(S, q1-q0) x min(S, k1-k0) "
    "bins, S = `size` (without `size`, one bin per cell). Bin i of an axis starting at a with R positions "
    "covers [a + floor(i*R/S), a + floor((i+1)*R/S)). A bin of one cell is the exact weight; a larger bin "
    "pools its *visible* cells: `max` (default: a sharp head stays visible) or `mean`. A bin whose cells are "
    "all masked (the causal future, keys outside a sliding window) is `null` in JSON. Without `head`, every "
    "head's tile, one after another. `format=bin`: one byte a bin, row-major, q < 255 is the weight "
    "(q/254)^2 and 255 is a masked bin (X-Attn-Encoding: sqrt-u8-tile, X-Attn-Masked: 255); `format=f32`: "
    "little-endian float32 a bin, NaN for a masked bin (X-Attn-Encoding: f32-tile). Binary headers: "
    "X-Attn-N, X-Attn-Heads, X-Attn-Causal, X-Attn-Layer, X-Attn-Head, X-Attn-Q0, X-Attn-Q1, X-Attn-K0, "
    "X-Attn-K1, X-Attn-Rows, X-Attn-Cols (bins per axis), X-Attn-Pool, X-Attn-Exact (1: every bin is one "
    "cell). A response never holds more than ATTNSCOPE_MAX_CELLS cells (bins x heads; a whole head counts "
    "its visible cells): past it, 422 naming `size` and the tile parameters."
)


def _typed_json(content: bytes, status: int = 200) -> Response:
    return Response(content, status_code=status, media_type="application/json")


@router.post("/runs", status_code=201, response_model=RunBody, responses=ERRORS,
             summary="Analyse a prompt: one forward, everything captured")
def create_run(body: RunRequest, engine: EngineDep, gate: GateDep, settings: SettingsDep, tiles: TilesDep) -> Response:
    top_k = checked_top_k(body.top_k, settings)
    lm = engine.model(body.model)
    if body.messages is not None:
        chat = [{"role": m.role, "content": m.content} for m in body.messages]
        result = gate.run(lm.info.name, lambda: engine.analyse_chat(chat, lm.info.name, top_k))
    else:
        result = gate.run(lm.info.name, lambda: engine.analyse(body.text or "", lm.info.name, top_k,
                                                               truncate=body.truncate))
    runs.prefetch_overviews(tiles, run_id=result.run_id, record=result.record)  # a long run is drawn from tiles
    sent = len(body.text or "")
    cut = (TruncatedOut(tokens=result.record.n, chars=len(result.record.text), total_chars=sent)
           if body.truncate and len(result.record.text) < sent else None)  # what a cut kept
    return _typed_json(RUN_JSON.dump_json(run_body(result.run_id, result.record, cut)), status=201)


# before /runs/{run_id}: another method on /runs/import is this route's 405 (Allow: POST), not a run id's
@router.post("/runs/import", status_code=201, response_model=RunBody,
             responses={**ERRORS, 413: {"model": ErrorOut}},
             openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                 "schema": {"type": "string", "format": "binary"}}}}},
             summary="Store a run file (format=attnscope) as a run here",
             description="The body is a run file as `GET /api/runs/{id}/export?format=attnscope` gives it "
                         "(at most ATTNSCOPE_MAX_RUN_FILE_BYTES, 512 MiB unless configured: 413). "
                         "Every part is checked before it is stored; a "
                         "file that is not a complete run (truncated, another format, inconsistent shapes or "
                         "sizes; a NaN or an infinity in a tensor: `run_file_not_finite`; tokens that do not rebuild "
                         "the text: `run_file_text_mismatch`) answers 422 and nothing is kept. The body is streamed "
                         "to a temporary file and checked there (memory holds a buffer, never the body); a run "
                         "too large to keep answers 413 before its tensors are read, and while other imports "
                         "hold the memory budget, 503 `import_busy` with Retry-After. 201 with the run, under a new "
                         "id. Its attention is served from what it keeps whatever model made it; a tool that "
                         "runs the model answers 409 (`run_model_missing`, `run_model_changed`) unless that "
                         "model is loaded here as it was.")
async def import_run(request: Request, engine: EngineDep, settings: SettingsDep) -> Response:
    # streamed to disk: memory holds a buffer, not the body
    async with spooled(request, files.spool_folder(engine)) as path:
        result = await run_in_threadpool(files.import_run_file, engine, path=path,
                                         max_bytes=settings.max_run_file_bytes)
    return _typed_json(RUN_JSON.dump_json(run_body(result.run_id, result.record)), status=201)


@router.api_route("/runs/import", methods=["GET", "PUT", "PATCH", "DELETE", "OPTIONS"], include_in_schema=False)
def import_other_methods() -> Response:
    """The import path answers its own methods: POST only (else GET /runs/import would read "import" as a run id)."""
    raise StarletteHTTPException(405, "only POST stores a run file here", headers={"Allow": "POST"})


@router.get("/runs/{run_id}", response_model=RunBody, responses=ERRORS, summary="A stored run's summary")
def get_run(run_id: str, engine: EngineDep) -> Response:
    return _typed_json(RUN_JSON.dump_json(run_body(run_id, engine.run(run_id))))


WAIT_POLL_S = 0.05
MAX_STORED_WAIT_S = 10.0  # the longest a stored request holds its connection (a 16k-token run writes in 0.3 s)


@router.get("/runs/{run_id}/stored", response_model=StoredOut, responses=ERRORS,
            summary="Whether the run's file is on disk (survives a crash); waits for it if asked to",
            description="POST /api/runs answers as soon as its forward is done, with `stored: false` while the "
                        "run's file is written in the background (milliseconds to a few hundred). This "
                        "endpoint says whether it is on disk now, whole and fsync'd; `wait` (seconds, at most "
                        "10) holds the request until it is or the time is up, without holding a thread. "
                        "`directory: false`: this server keeps runs in memory only, `stored` stays false.")
async def run_stored(run_id: str, engine: EngineDep,
                     wait: Annotated[float, Query(ge=0, le=MAX_STORED_WAIT_S,
                                                  description="seconds to wait for the file (0: answer at once)")]
                     = 0.0) -> StoredOut:
    record = await run_in_threadpool(engine.run, run_id)
    directory = engine.store.backing is not None
    deadline = time.monotonic() + wait
    while directory and not record.stored and time.monotonic() < deadline:
        await anyio.sleep(WAIT_POLL_S)
    return StoredOut(run_id=run_id, stored=record.stored, directory=directory)


MAX_WAIT_S = 60.0  # the longest a heads request may hold its connection for scores still being computed


@router.get(
    "/runs/{run_id}/heads", response_model=Heads, responses={**ERRORS, 202: {"model": Heads}},
    summary="Every head's scores, complete: waits for the ones still being computed if asked to",
    description="The analyse answers right after its forward; the head scores a fused forward cannot give "
                "on the way (entropy and max: every visible cell once more) are computed exactly right after, "
                "in the background, and the run lists them in `scores_pending` (null in its `heads`) until "
                "then. This endpoint returns the heads: 200 when every score is in, 202 with `scores_pending` "
                "while some are still being computed (200 with `error` if they cannot be). `wait` "
                "(seconds, at most 60) holds the request until they are in or the time is up: `wait=60` in a "
                "loop is a synchronous client's way to get complete scores. 404 for an unknown run, or "
                "one evicted (expired) before its scores were in.")
async def run_heads(run_id: str, engine: EngineDep,
                    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for scores still "
                                                 "being computed (0: answer at once)")] = 0.0) -> Response:
    record = await run_in_threadpool(engine.run, run_id)  # may read the run's file: off the event loop
    deadline = time.monotonic() + wait
    while record.summary.scores_pending and (record.pending is None or not record.pending.done.is_set()):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        await anyio.sleep(min(WAIT_POLL_S, left))
    record = await run_in_threadpool(engine.run, run_id)  # RunNotFound (expired) when it was evicted meanwhile
    out = runs.heads_of(run_id, record)
    still = out.scores_pending and out.error is None  # an error: those scores will not come, waiting is over
    return _typed_json(HEADS_JSON.dump_json(out), status=202 if still else 200)


def checked_top_k(top_k: int | None, settings: Settings) -> int:
    """The top-k a request asked for, within ATTNSCOPE_MAX_TOP_K; when it asked for none, 10 or that limit."""
    if top_k is None:
        return min(DEFAULT_TOP_K, settings.max_top_k)
    if top_k > settings.max_top_k:
        raise BadInput(f"top_k {top_k} is more than this server's limit of {settings.max_top_k} "
                       "(ATTNSCOPE_MAX_TOP_K)", code="top_k_too_large",
                       params={"top_k": top_k, "limit": settings.max_top_k})
    return top_k


def _json(payload: dict[str, object], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload, separators=(",", ":"), ensure_ascii=False), status_code=status,
                    media_type="application/json", headers=headers)


TILE_PARAMS = "size, q0, q1, k0, k1"


def _cell_limit(cells: int, settings: Settings, what: str) -> None:
    if cells > settings.max_cells:
        raise BadInput(f"{what} would send {cells:,} cells, more than this server's limit of "
                       f"{settings.max_cells:,} (ATTNSCOPE_MAX_CELLS): pass size=S to pool it into at most S x S "
                       f"bins, or ask for a narrower tile ({TILE_PARAMS})", code="too_many_cells",
                       params={"what": what, "cells": cells, "limit": settings.max_cells})


def _tile_response(tiles: TilesDep, run_id: str, record: RunRecord, layer: int, head: int | None, spec: TileSpec,
                   fmt: str) -> Response:
    heads = list(range(record.n_heads)) if head is None else [head]
    start = time.perf_counter()
    values = runs.kept_tiles(tiles, run_id=run_id, record=record, layer=layer, heads=heads,
                             spec=spec)  # (heads, Sq, Sk)
    timing = f"tile;dur={1e3 * (time.perf_counter() - start):.1f}"  # computed, kept or waited for
    if fmt == "json":
        host = values.cpu().numpy()  # a GPU run's tiles too
        cells = np.round(host.astype(np.float64), 6).astype(object)
        cells[np.isnan(host)] = None
        return _json({"layer": layer, "head": head, "n_heads": len(heads), "n": record.n, "causal": record.causal,
                      "q0": spec.q0, "q1": spec.q1, "k0": spec.k0, "k1": spec.k1, "pool": spec.pool,
                      "exact": spec.exact, "q_edges": spec.q_edges().tolist(), "k_edges": spec.k_edges().tolist(),
                      "cells": cells.tolist()}, headers={"Server-Timing": timing})
    rows_, cols = spec.shape
    flat = values.reshape(len(heads), -1)
    return attention_bytes(u8_tile(flat) if fmt == "bin" else f32_le(flat), n=record.n, heads=len(heads),
                           causal=record.causal, layer=layer, head=head,
                           encoding="sqrt-u8-tile" if fmt == "bin" else "f32-tile",
                           extra={"Q0": str(spec.q0), "Q1": str(spec.q1), "K0": str(spec.k0), "K1": str(spec.k1),
                                  "Rows": str(rows_), "Cols": str(cols), "Pool": spec.pool,
                                  "Exact": "1" if spec.exact else "0",
                                  "Masked": str(MASKED_U8) if fmt == "bin" else "NaN"}, timing=timing)


@router.get(
    "/runs/{run_id}/attention",
    response_model=AttentionOut | LayerAttentionOut | AttentionTileOut,
    responses={**ERRORS, 200: {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                   "format": "binary"}}},
                               "description": "JSON rows or a JSON tile, or bytes with format=bin / f32"}},
    summary="Attention of one head, or of all heads of one layer: whole, or as a tile",
    description=BINARY_DOC + TILE_DOC,
)
def attention(
    run_id: str,
    engine: EngineDep,
    settings: SettingsDep,
    tiles: TilesDep,
    layer: Annotated[int, Query(ge=-(2**31), le=2**31)],
    head: Annotated[int | None, Query(ge=-(2**31), le=2**31)] = None,
    format: Literal["json", "bin", "f32"] = "json",
    size: Annotated[int | None, Query(ge=2, le=8192, description="tile: at most size x size bins (see above); "
                                      "without head and tile parameters, format=bin: a mean-pooled "
                                      "size x size thumbnail of every head, scaled to its largest bin")] = None,
    q0: Annotated[int | None, Query(ge=-(2**31), le=2**31, description="tile: first query (default 0)")] = None,
    q1: Annotated[int | None, Query(ge=-(2**31), le=2**31, description="tile: query end (default n)")] = None,
    k0: Annotated[int | None, Query(ge=-(2**31), le=2**31, description="tile: first key (default 0)")] = None,
    k1: Annotated[int | None, Query(ge=-(2**31), le=2**31, description="tile: key end (default n)")] = None,
    pool: Annotated[Literal["max", "mean"] | None, Query(description="tile: how a bin pools its visible cells "
                                                         "(default max)")] = None,
) -> Response:
    record = engine.run(run_id)
    engine.check_layer_head(record, layer, head)
    n_heads = record.n_heads if head is None else 1
    tiled = any(v is not None for v in (q0, q1, k0, k1, pool)) or (size is not None and head is not None)
    if tiled:
        spec = runs.tile_spec(record, q0=q0, q1=q1, k0=k0, k1=k1, size=size, pool=pool)
        rows_, cols = spec.shape
        _cell_limit(n_heads * rows_ * cols, settings, "this tile")
        return _tile_response(tiles, run_id, record, layer, head, spec, format)
    if format == "bin" and size is not None:
        if record.n <= size:  # small enough to send whole, as a client drawing thumbnails expects
            size = None
        else:
            _cell_limit(n_heads * size * size, settings, "these thumbnails")
            thumbs = runs.kept_tiles(tiles, run_id=run_id, record=record, layer=layer,
                                     heads=list(range(record.n_heads)),
                                     spec=runs.whole_tile(record, size=size, pool="mean")).nan_to_num(0.0)
            thumbs = thumbs / thumbs.amax(dim=(-1, -2), keepdim=True).clamp_min(1e-12)  # (H, size, size)
            return attention_bytes(sqrt_u8(thumbs.reshape(thumbs.shape[0], -1)), n=record.n, heads=thumbs.shape[0],
                                   causal=record.causal, layer=layer, head=None, encoding="sqrt-u8-pooled",
                                   cacheable=False, extra={"Size": str(size)})
    visible = record.n * (record.n + 1) // 2 if record.causal else record.n * record.n
    _cell_limit(n_heads * visible, settings, "the whole head" if head is not None else "every head of this layer")
    if format in ("bin", "f32"):
        selected = record.packed(layer, head)  # (H or 1, cells)
        return attention_bytes(sqrt_u8(selected) if format == "bin" else f32_le(selected), n=record.n,
                               heads=selected.shape[0], causal=record.causal, layer=layer, head=head,
                               encoding="sqrt-u8" if format == "bin" else "f32")
    pattern = record.pattern(layer)  # (H, n, n)
    if head is not None:
        return _json({"layer": layer, "head": head, "n": record.n, "causal": record.causal,
                      "rows": rows(pattern[head], record.causal)})
    return _json({"layer": layer, "n_heads": record.n_heads, "n": record.n, "causal": record.causal,
                  "heads": [rows(h, record.causal, decimals=4) for h in pattern]})


@router.get("/runs/{run_id}/residual", response_model=Residual, responses=ERRORS,
            summary="The residual stream layer by layer: norms, change, attention vs MLP")
def residual(run_id: str, engine: EngineDep) -> Residual:
    return runs.residual(engine, run_id=run_id)


@router.get("/runs/{run_id}/logit-lens", response_model=LogitLens, responses=ERRORS,
            summary="Each layer's residual stream read through the final norm and LM head")
def logit_lens(run_id: str, engine: EngineDep, gate: GateDep,
               top_k: Annotated[int, Query(ge=1, le=50)] = 5) -> Response:
    record = engine.run(run_id)
    lens = gate.run(record.model, lambda: runs.lens(engine, run_id=run_id, top_k=top_k))
    # (L + 1) x n x top-k candidates: serialised from the typed result, like a run
    return _typed_json(LENS_JSON.dump_json(lens))


@router.get("/runs/{run_id}/sparsity", response_model=SparsityOut, responses=ERRORS,
            summary="How concentrated each head is: top-1 / top-5 mass and keys holding 90%, exact over all rows")
def sparsity(run_id: str, engine: EngineDep) -> SparsityOut:
    return SparsityOut(heads=runs.sparsity(engine, run_id=run_id))


@router.get("/runs/{run_id}/next", response_model=NextDistribution, responses=ERRORS,
            summary="Next-token distribution at one position, re-scaled by a temperature")
def next_token(run_id: str, engine: EngineDep, settings: SettingsDep,
               position: Annotated[int, Query(ge=-(2**31), le=2**31)],
               temperature: Annotated[float, Query(gt=0, le=100)] = 1.0,
               top_k: Annotated[int | None, Query(ge=1, le=MAX_TOP_K_SETTING,
                                                  description="at most the server's ATTNSCOPE_MAX_TOP_K (100 "
                                                  "unless configured; past it, 422); default 10, or that limit "
                                                  "if lower")] = None) -> NextDistribution:
    k = checked_top_k(top_k, settings)
    return runs.next_token(engine, run_id=run_id, position=position, temperature=temperature, top_k=k)


def _html_export(request: Request, run_id: str, *, heads: str | None, lang: str, dry_run: bool) -> Response:
    built = standalone.build_sync(request.app, run_id, heads=heads, lang=lang)  # the app itself, in-process
    if dry_run:
        return _json({"bytes": len(built.html), "exact_heads": built.exact_heads,
                      "overview_heads": built.overview_heads, "every_head": built.plan.every_head})
    return Response(built.html, media_type=standalone.MEDIA_TYPE,
                    headers={"Content-Disposition": f'attachment; filename="attnscope-run-{run_id}.html"',
                             "X-Attnscope-Exact-Heads": built.exact_heads})


@router.get("/runs/{run_id}/export",
            responses={**ERRORS, 200: {"description": "format=json: the run as JSON (attnscope-json/1); "
                                       "format=attnscope or safetensors: the run file; format=html: one HTML file",
                                       "content": {"application/json": {"schema": {"type": "object"}},
                                                   "text/html": {"schema": {"type": "string"}},
                                                   "application/octet-stream": {"schema": {"type": "string",
                                                                                           "format": "binary"}}}}},
            summary="The whole run as one file: JSON with every head's rows (short runs), the run file "
                    "(attnscope, or safetensors: the same file) or a standalone page (html)",
            description="`format=json` (default): summary, model, text and every head's attention; attention "
                        "keeps full float32 precision: `attention[layer][head]` is base64 of the head's visible "
                        "cells as little-endian float32, row-major as in the attention endpoint's binary form "
                        "(causal row i holds keys 0..i). `attnscope export RUN.json --layer L --head H --svg "
                        "out.svg` turns it into a figure. Its cells grow with n²: above ATTNSCOPE_MAX_CELLS the "
                        "JSON export (`attnscope-json/1`) is refused (422). "
                        "`format=html`: one self-contained HTML file of the explorer on this run (plotly.js "
                        "and the data inlined; opens from file:// with no network): every head's exact cells "
                        "while they fit (64 tokens on the bundled model), else every head's thumbnail, the "
                        "overview tile of each of `heads` (a long run) and their exact cells as far as 64 MB "
                        "holds them; `dry_run=1` answers `{bytes, exact_heads, overview_heads, every_head}` "
                        "first (the HTML response says its exact heads in X-Attnscope-Exact-Heads). "
                        "`format=attnscope`: the run file (`attnscope-run/1`), what the run keeps, O(n·d): each "
                        "layer's post-rotary Q and K, row normalisers, ALiBi bias, visible key ranges, the "
                        "residual stream and the predictions as safetensors tensors, and a JSON header with the "
                        "text, tokens, head scores, timings and the fingerprints of the model and tokenizer; "
                        "`POST /api/runs/import` (here or on another server), `attnscope open FILE`, "
                        "`attnscope.load(path)` and `model.runs.export.KeptRun.load(path).pattern(layer, head)` "
                        "read it back (README: What a run keeps). `format=safetensors`: the same file, named "
                        "`.safetensors`.")
def export_run(run_id: str, engine: EngineDep, settings: SettingsDep, request: Request,
               format: Literal["json", "safetensors", "html", "attnscope"] = "json",
               heads: Annotated[str | None, Query(max_length=4000, description="format=html: the heads whose exact "
                                                  "cells the file keeps, LAYER.HEAD,… (default: every head while they "
                                                  "fit, else the first)")] = None,
               lang: Literal["en", "zh"] = "en",
               dry_run: Annotated[bool, Query(description="format=html: answer the file's size and heads as JSON "
                                              "instead of the file")] = False) -> Response:
    if format == "html":
        engine.run(run_id)  # an unknown run: 404 before anything is built
        return _html_export(request, run_id, heads=heads, lang=lang, dry_run=dry_run)
    if format in ("attnscope", "safetensors"):  # the run file: one format, a safetensors file either name
        suffix = "attnscope" if format == "attnscope" else "safetensors"
        return Response(files.run_file(engine, run_id=run_id), media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="attnscope-run-{run_id}.{suffix}"'})
    record = engine.run(run_id)
    lm = engine.models.get(record.model)  # a run read back from its file may name a model not loaded here
    run = RUN_JSON.dump_python(run_body(run_id, record), mode="json")
    summary = {"format": EXPORT_FORMAT, "run_id": run_id, "text": record.text,
               "model_info": asdict(lm.info) if lm is not None else {"name": record.model}, "causal": record.causal,
               **{k: run[k] for k in ("model", "tokens", "predictions", "heads", "timing_ms", "scores_pending")}}
    cells = attention_cells(record)
    if cells > settings.max_cells:
        raise BadInput(f"the JSON export of this run would hold {cells:,} attention cells, more than this server's "
                       f"limit of {settings.max_cells:,} (ATTNSCOPE_MAX_CELLS): export format=safetensors instead "
                       "(the run file: what the run keeps, from which model.runs.export.KeptRun rebuilds any head)",
                       code="export_too_large",
                       params={"cells": cells, "limit": settings.max_cells})
    payload = {**summary, **attention_json(record)}
    return Response(json.dumps(payload, separators=(",", ":")), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="attnscope-run-{run_id}.json"'})
