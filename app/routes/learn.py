"""Endpoints behind the Learn views: each one reads the running model's own numbers.

Each handler passes the model's gate where the view runs the model, and returns the typed result of
``model.services.learn`` (which validates, budgets and locks) as it is.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from attnscope.app.deps import EngineDep, GateDep
from attnscope.app.errors import ERRORS
from attnscope.app.schemas import TimingRequest
from attnscope.model.learn.anatomy import Anatomy
from attnscope.model.learn.embedding import Neighbourhood
from attnscope.model.learn.positions import PositionTable
from attnscope.model.learn.values import Contributions
from attnscope.model.services import learn
from attnscope.model.services.learn import Comparison, ContributionGaps, Timing

router = APIRouter(tags=["learn"])
Int = Annotated[int, Query(ge=-(2**31), le=2**31)]


@router.get("/runs/{run_id}/contributions", response_model=Contributions, responses=ERRORS,
            summary="What each source token adds to one head's output at one query")
def contributions(run_id: str, engine: EngineDep, gate: GateDep, layer: Int, head: Int,
                  position: Int) -> Contributions:
    record = engine.run(run_id)
    return gate.run(record.model, lambda: learn.contributions(engine, run_id=run_id, layer=layer, head=head,
                                                              position=position))


@router.get("/runs/{run_id}/contribution-gaps", response_model=ContributionGaps, responses=ERRORS,
            summary="Per head at one query: how far the attention weights are from what each source adds")
def contribution_gaps(run_id: str, engine: EngineDep, gate: GateDep, position: Int) -> ContributionGaps:
    record = engine.run(run_id)
    return gate.run(record.model, lambda: learn.contribution_gaps(engine, run_id=run_id, position=position))


@router.get("/models/{name}/embedding", response_model=Neighbourhood, responses=ERRORS,
            summary="A token's embedding row, its nearest neighbours and the ids next to it")
def embedding(name: str, engine: EngineDep, id: Int,
              top: Annotated[int, Query(ge=1, le=learn.MAX_TOP)] = 10) -> Neighbourhood:
    return learn.embedding(engine, model=name, id=id, top=top)


@router.get("/models/{name}/anatomy", response_model=Anatomy, responses=ERRORS,
            summary="Parameter counts by part of the network")
def anatomy(name: str, engine: EngineDep) -> Anatomy:
    return learn.anatomy(engine, model=name)


@router.get("/models/{name}/positions", response_model=PositionTable, responses=ERRORS,
            summary="How the model encodes position: its learned table, or its rotary frequencies")
def positions(name: str, engine: EngineDep,
              count: Annotated[int, Query(ge=1, le=learn.MAX_POSITIONS)] = 64) -> PositionTable:
    return learn.positions(engine, model=name, count=count)


@router.post("/timing", response_model=Timing, responses=ERRORS,
             summary="One parallel forward vs serial steps with and without the KV cache, measured now")
def timing(body: TimingRequest, engine: EngineDep, gate: GateDep) -> Timing:
    lm = engine.model(body.model)
    with gate.enter(lm.info.name):  # the service takes the lock per round: other requests get in between
        result = learn.timing(engine, model=lm.info.name, text=body.text, repeats=body.repeats,
                              repeat_to=body.repeat_to)
    return result


@router.get("/compare", response_model=Comparison, responses=ERRORS,
            summary="Same tokens, another order: per token, the cosine of its hidden states at every stage; "
                    "per head, how much attention changes")
def compare(a: str, b: str, engine: EngineDep) -> Comparison:
    return learn.compare(engine, a=a, b=b)
