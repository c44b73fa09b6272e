"""Causal tools on a stored run or a pair of prompts: attribute, ablate, patch.

Each handler is a plain ``def`` (FastAPI runs it in the thread pool; patching runs there too, from an
``async`` handler that watches for the client going away and stops it between forwards), passes the model's gate and
returns the typed result of ``model.services.tools`` (which validates, budgets and locks) as it is.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool

from attnscope.app.deps import EngineDep, GateDep
from attnscope.app.errors import ERRORS
from attnscope.app.intervention_schemas import AblateRequest, PatchRequest, ScanRequest
from attnscope.model.errors import Cancelled
from attnscope.model.services import tools
from attnscope.model.tools.ablation import Ablation, Scan
from attnscope.model.tools.attribution import Attribution
from attnscope.model.tools.patching import Patch, PatchExample
from attnscope.model.tools.qk import QKAttribution

router = APIRouter(tags=["interventions"])
Int = Annotated[int, Query(ge=-(2**31), le=2**31)]
PATCH_JSON = TypeAdapter(Patch)


@router.get("/runs/{run_id}/attribution", response_model=Attribution, responses=ERRORS,
            summary="Direct logit attribution: each head, MLP, the embeddings and biases as terms of one logit",
            description="The final norm's scale at the position is frozen (TransformerLens' convention), so "
                        "the terms sum to `logit`; `error` is the float residue. With `token_b` the logit "
                        "difference token - token_b is attributed. `token` defaults to the prompt's next "
                        "token, or the top prediction at the last position.")
def attribute(run_id: str, engine: EngineDep, gate: GateDep, position: Int,
              token: Annotated[int | None, Query(ge=-(2**31), le=2**31)] = None,
              token_b: Annotated[int | None, Query(ge=-(2**31), le=2**31)] = None) -> Attribution:
    record = engine.run(run_id)
    return gate.run(record.model, lambda: tools.attribute(engine, run_id=run_id, position=position, token=token,
                                                          token_b=token_b))


@router.get("/runs/{run_id}/qk-attribution", response_model=QKAttribution, responses=ERRORS,
            summary="QK attribution: why a head attends from a query to a key, by upstream component on either side",
            description="The head's pre-softmax logit from `query` to `key` split into query-side x key-side "
                        "terms: the embeddings, each earlier head's own output, each earlier MLP and output bias, "
                        "the frozen input norm's shift and the Q/K projection's bias after rotation. The layer's "
                        "input norm (and any Q/K norm) is frozen at its scale on this run, rotary positions are "
                        "applied by the layer's own module, grouped K/V heads share their keys, and a per-key "
                        "position bias (ALiBi) is its own entry. `matrix[a][b]` (query-side component a x "
                        "key-side component b, indexed by `components`) sums to `logit - position_bias`, as do "
                        "each row of `query_side` and `key_side`; `error` is the largest residue. Without `key`: "
                        "every key the query sees (`query_side`, `key_side` per key; `matrix` null).")
def qk_attribution(run_id: str, engine: EngineDep, gate: GateDep, layer: Int, head: Int, query: Int,
                   key: Annotated[int | None, Query(ge=-(2**31), le=2**31)] = None) -> QKAttribution:
    record = engine.run(run_id)
    return gate.run(record.model, lambda: tools.qk_attribution(engine, run_id=run_id, layer=layer, head=head,
                                                               query=query, key=key))


@router.post("/runs/{run_id}/ablate", response_model=Ablation, responses=ERRORS,
             summary="Run the prompt again with some heads' outputs zeroed or replaced by their mean",
             description="Needs a run: create one with POST /api/runs and use its `run_id`. The example "
                         "ablates layer 4 head 0, the bundled model's induction head.")
def ablate(run_id: str, body: AblateRequest, engine: EngineDep, gate: GateDep) -> Ablation:
    record = engine.run(run_id)
    heads = [(layer, head) for layer, head in body.heads]
    return gate.run(record.model, lambda: tools.ablate(engine, run_id=run_id, heads=heads, mode=body.mode,
                                                       top_k=body.top_k))


@router.post("/runs/{run_id}/ablate/scan", response_model=Scan, responses=ERRORS,
             summary="Ablate every head (and every MLP) alone: the change of ln p(token) at one position",
             description="Batched: many ablations per forward, over the prefix the position sees. Needs a run: "
                         "create one with POST /api/runs and use its `run_id`; `position` is one of its "
                         "positions.")
def ablate_scan(run_id: str, body: ScanRequest, engine: EngineDep, gate: GateDep) -> Scan:
    record = engine.run(run_id)
    return gate.run(record.model, lambda: tools.ablate_scan(engine, run_id=run_id, position=body.position,
                                                            token=body.token, mode=body.mode))


@router.post("/patch", response_model=Patch, responses=ERRORS,
             summary="Activation patching from a clean prompt into a corrupted one",
             description="Metric: logit(answer) - logit(wrong) at `position` (default: the last). Each value is "
                         "(patched - corrupted) / (clean - corrupted): 1 restores the clean answer, 0 does "
                         "nothing. The prompts must have the same token count; answer and wrong must each "
                         "be one token. Every site is patched in its own forward: past about 20 TFLOP of them "
                         "(long prompts on a large model) the request is refused (422) before it runs.")
async def patch(body: PatchRequest, request: Request, engine: EngineDep, gate: GateDep) -> Response:
    lm = engine.model(body.model)
    stop = threading.Event()  # set when the client goes away (the page's Cancel): the loop stops between forwards

    def work() -> Patch:
        return gate.run(lm.info.name, lambda: tools.patch(
            engine, model=lm.info.name, clean=body.clean, corrupted=body.corrupted, answer=body.answer,
            wrong=body.wrong, position=body.position, stop=stop))

    task = asyncio.ensure_future(run_in_threadpool(work))
    while not task.done():
        await asyncio.wait({task}, timeout=0.5)
        if not task.done() and await request.is_disconnected():
            stop.set()
    try:
        out = task.result()
    except Cancelled:
        return Response(status_code=499)  # nobody reads it: the client closed the connection
    return Response(PATCH_JSON.dump_json(out), media_type="application/json")


@router.get("/models/{name}/patch-example", response_model=PatchExample, responses=ERRORS,
            summary="The Patch tool's default pair for this model, checked on it by one cheap forward",
            description="The first of a few candidate pairs (IOI, a copied sentence, a repeated colour) whose "
                        "clean metric is positive and at least 0.5 above the corrupted one; with it, what "
                        "patching it costs (patched rows, TFLOP, and seconds estimated on this server).")
def patch_example(name: str, engine: EngineDep, gate: GateDep) -> PatchExample:
    lm = engine.model(name)
    return gate.run(lm.info.name, lambda: tools.patch_example(engine, model=lm.info.name))
