"""Serial generation streamed as Server-Sent Events."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from attnscope.app.deps import EngineDep, GateDep, SettingsDep
from attnscope.app.errors import ErrorOut, status_of
from attnscope.app.schemas import GenerateRequest
from attnscope.app.settings import DEFAULT_TOP_K
from attnscope.model.errors import EngineError
from attnscope.model.services import generate as generate_service

log = logging.getLogger(__name__)
router = APIRouter(tags=["generate"])

SSE_DOC = """Server-Sent Events. One `token` event per new token:
`{"step", "id", "token", "text", "special", "partial", "prob", "model_prob", "top": [{"id", "token", "prob"}], "ms"}`
(`token` is the display string — a special token's name such as `<|endoftext|>`, or a
byte-level token that holds only part of a character as its bytes, e.g. `‹e6 88›`; `text`
is the characters this token completes, so that joining every event's `text` gives the
generated text exactly once; `prob` is the chosen token's probability under the sampling
distribution (1 at temperature 0: greedy), `model_prob` the model's own probability of it at
temperature 1, `top` the model's own top-5 at temperature 1, `ms` the step's time: one
forward over the newest token with the KV cache, the first step being the prefill over
the whole prompt). A final `done` event: `{"text", "n_new", "stop", "total_ms"}`, where
`text` is the generated text (special tokens left out) and `stop` says why it stopped:
`"eos"` (the model wrote end-of-text and `stop_at_eos` is true) or `"length"`
(`max_new_tokens` reached). A client that disconnects stops generation at once (logged
as stop `"client"`; no `done` event can reach it).

Everything that can be refused is refused before the stream starts, with an ordinary JSON error
(422 bad input, 413 a recording that could never be kept, 503 with Retry-After when too many
requests wait for the model). What fails after the stream started ends it with an `error` event
instead of `done`: `{"code", "message", "params", "status", "n_new"}` (`code` and `params` as in
every error body, `status` what the same failure would have answered before the stream, `n_new` the
tokens already sent).

With `"record": true` every step's activations are kept; token events then carry `rows`
(the new attention rows of `watch_layer`/`watch_head`, when given: the prefill's rows for
the prompt, then one row per fed token), and a `run` event before `done` gives the
`run_id` of an ordinary run over prompt + generated text (`{"run_id", "n"}`)."""


def sse(event: str, data: dict[str, object]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def failure(exc: Exception, sent: int) -> dict[str, object]:
    """The ``error`` event for a failure after the stream started: the engine's own words where it
    raised one of its errors, else a line that points to the server's log."""
    if isinstance(exc, EngineError):
        return {"code": exc.code, "message": str(exc), "params": exc.params, "status": status_of(exc), "n_new": sent}
    log.error("generation failed after %d tokens", sent, exc_info=exc)
    return {"code": "generation_failed", "message": f"generation failed after {sent} tokens: {exc}",
            "params": {"n_new": sent}, "status": 500, "n_new": sent}


@router.post("/generate", responses={200: {"content": {"text/event-stream": {}}, "description": SSE_DOC},
                                     404: {"model": ErrorOut}, 422: {"model": ErrorOut}},
             summary="Generate token by token with the KV cache (SSE)", description=SSE_DOC)
def generate(body: GenerateRequest, request: Request, engine: EngineDep, gate: GateDep,
             settings: SettingsDep) -> StreamingResponse:
    run = generate_service.start(engine, text=body.text, model=body.model, max_new_tokens=body.max_new_tokens,
                                 temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, seed=body.seed,
                                 stop_at_eos=body.stop_at_eos, record=body.record, watch_layer=body.watch_layer,
                                 watch_head=body.watch_head, max_new_limit=settings.max_new_tokens,
                                 top_k_kept=DEFAULT_TOP_K)  # checks every range; nothing runs yet
    admission = ExitStack()  # closed once, by whichever comes first: the stream's end or the response's
    admission.enter_context(gate.enter(run.lm.info.name))  # too many waiting: 503 + Retry-After now, not after the 200
    session = run.session

    async def steps() -> AsyncIterator[str]:
        start = time.perf_counter()
        while not run.done:
            if await request.is_disconnected():
                log.info("generation stopped (stop: client): the client went away after %d tokens", session.steps)
                return
            step = await run_in_threadpool(gate.on_compute, run.step)  # the model's forward
            event = {"step": step.index, "id": step.id, "token": step.token, "text": step.text,
                     "special": step.special, "partial": step.partial, "prob": step.prob,
                     "model_prob": step.model_prob,
                     "top": [{"id": i, "token": t, "prob": p} for i, t, p in step.top], "ms": step.ms}
            if (rows := run.new_rows()) is not None:
                event["rows"] = rows
            yield sse("token", event)
        finished = await run_in_threadpool(gate.on_compute, run.finish)  # a recording's assembly
        if finished.run is not None:
            if (rows := run.new_rows()) is not None:
                yield sse("rows", {"rows": rows})
            yield sse("run", {"run_id": finished.run.run_id, "n": finished.run.record.n})
        yield sse("done", {"text": finished.text, "n_new": finished.n_new, "stop": finished.stop,
                           "total_ms": 1e3 * (time.perf_counter() - start)})

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in steps():
                yield chunk
        except Exception as exc:  # noqa: BLE001 - the status is sent already: the stream ends with the reason
            yield sse("error", failure(exc, session.steps))
        finally:
            admission.close()

    # no-cache, not no-store: Chromium cancels a no-store response read through a stream reader even
    # after its last byte (a failed /api/generate, net::ERR_ABORTED, after every finished generation)
    return StreamingResponse(events(), media_type="text/event-stream", background=BackgroundTask(admission.close),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
