"""Endpoints behind the Learn views: each one reads the running model's own numbers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from attnscope.app.convert import fields_of
from attnscope.app.deps import EngineDep, GateDep
from attnscope.app.errors import ERRORS
from attnscope.app.schemas import (
    AnatomyOut,
    CompareOut,
    CompareToken,
    ContributionGapsOut,
    ContributionsOut,
    EmbeddingOut,
    HeadDiff,
    HeadGap,
    Neighbour,
    PositionsOut,
    TimingOut,
    TimingRequest,
)
from attnscope.model.errors import BadInput
from attnscope.model.learn import lessons
from attnscope.model.load.tokens import ids_tensor, token_map

router = APIRouter(prefix="/api", tags=["learn"])
Int = Annotated[int, Query(ge=-(2**31), le=2**31)]
TIMING_MAX_TOKENS = 64


@router.get("/runs/{run_id}/contributions", response_model=ContributionsOut, responses=ERRORS,
            summary="What each source token adds to one head's output at one query")
def contributions(run_id: str, engine: EngineDep, gate: GateDep, layer: Int, head: Int,
                  position: Int) -> ContributionsOut:
    cache = engine.run(run_id)
    engine.check_layer_head(cache, layer, head)
    if not 0 <= position < cache.n:
        raise BadInput(f"position {position} is out of range: this run has positions 0..{cache.n - 1}")
    lm = engine.model(cache.model)
    with gate.enter(lm.info.name), lm.lock:
        norms = lessons.value_contributions(lm, cache.input_ids, layer)[head]  # (n,)
    visible = position + 1 if cache.causal else cache.n
    weights = cache.head_rows(layer, head, position, position + 1, 0, visible)[0][0]  # (visible,)
    return ContributionsOut(layer=layer, head=head, position=position, weights=weights.tolist(),
                            value_norms=norms[:visible].tolist(), contributions=(weights * norms[:visible]).tolist())


@router.get("/runs/{run_id}/contribution-gaps", response_model=ContributionGapsOut, responses=ERRORS,
            summary="Per head at one query: how far the attention weights are from what each source adds")
def contribution_gaps(run_id: str, engine: EngineDep, gate: GateDep, position: Int) -> ContributionGapsOut:
    cache = engine.run(run_id)
    if not 0 <= position < cache.n:
        raise BadInput(f"position {position} is out of range: this run has positions 0..{cache.n - 1}")
    lm = engine.model(cache.model)
    with gate.enter(lm.info.name), lm.lock:
        heads = lessons.contribution_gaps(lm, cache.input_ids, cache.attention, position, cache.causal)
    return ContributionGapsOut(position=position, heads=[HeadGap(**h) for h in heads])


@router.get("/models/{name}/embedding", response_model=EmbeddingOut, responses=ERRORS,
            summary="A token's embedding row, its nearest neighbours and the ids next to it")
def embedding(name: str, engine: EngineDep, id: Int, top: Annotated[int, Query(ge=1, le=50)] = 10) -> EmbeddingOut:
    lm = engine.model(name)
    data = lessons.embedding_neighbours(lm, id, top)
    groups = {k: data[k] for k in ("neighbours", "adjacent", "double")}
    strings = token_map(lm.tokenizer, [id] + [r[0] for rows in groups.values() for r in rows])
    listed = {k: [Neighbour(id=i, token=strings[i], cos=c, untrained=u) for i, c, u in rows]
              for k, rows in groups.items()}
    return EmbeddingOut(
        model=name, id=id, token=strings[id], norm=data["norm"], vector=data["vector"],
        neighbours=listed["neighbours"], adjacent=listed["adjacent"], double=listed["double"],
        untrained=data["untrained"], untrained_count=data["untrained_count"],
        random_mean=data["random_mean"], random_std=data["random_std"])


@router.get("/models/{name}/anatomy", response_model=AnatomyOut, responses=ERRORS,
            summary="Parameter counts by part of the network")
def anatomy(name: str, engine: EngineDep) -> AnatomyOut:
    lm = engine.model(name)
    return AnatomyOut.model_validate({**fields_of(lessons.anatomy(lm)), "model": name}, from_attributes=True)


@router.get("/models/{name}/positions", response_model=PositionsOut, responses=ERRORS,
            summary="How the model encodes position: its learned table, or its rotary frequencies")
def positions(name: str, engine: EngineDep, count: Annotated[int, Query(ge=1, le=1024)] = 64) -> PositionsOut:
    lm = engine.model(name)
    table = lessons.position_table(lm, min(count, lm.info.max_positions or count))
    return PositionsOut.model_validate({**fields_of(table), "model": name})


@router.post("/timing", response_model=TimingOut, responses=ERRORS,
             summary="One parallel forward vs serial steps with and without the KV cache, measured now")
def timing(body: TimingRequest, engine: EngineDep, gate: GateDep) -> TimingOut:
    lm = engine.model(body.model)
    if not lm.info.has_lm_head:
        raise BadInput(f"model {lm.info.name!r} is an encoder: it does not generate, "
                       "so there is nothing serial to time")
    tokens = engine.tokenize(lm, body.text)
    if len(tokens) > TIMING_MAX_TOKENS:
        raise BadInput(f"the prompt has {len(tokens)} tokens; timing takes at most {TIMING_MAX_TOKENS} "
                       "(the uncached serial run grows with the square of the length)")
    if body.repeat_to is not None:
        tokens = (tokens * -(-body.repeat_to // len(tokens)))[: body.repeat_to]
    with gate.enter(lm.info.name):  # the lock is taken per round: other requests get in between
        result = lessons.parallel_vs_serial(lm, ids_tensor(tokens), body.repeats)
    return TimingOut(model=lm.info.name, tokens=[t.text for t in tokens], **result)


@router.get("/compare", response_model=CompareOut, responses=ERRORS,
            summary="Same tokens, another order: per token, the cosine of its hidden states at every stage; "
                    "per head, how much attention changes")
def compare(a: str, b: str, engine: EngineDep) -> CompareOut:
    run_a, run_b = engine.run(a), engine.run(b)
    if run_a.model != run_b.model:
        raise BadInput("both runs must come from the same model")
    texts = [t.text for t in run_a.summary.tokens]
    pairs = lessons.hidden_similarity(run_a.input_ids.tolist(), run_a.resid, run_b.input_ids.tolist(), run_b.resid)
    heads = lessons.attention_differences(run_a.attention, run_b.attention)
    stages = ["embed"] + [f"block {i}" for i in range(run_a.n_layers)]
    return CompareOut(a=a, b=b, stages=stages, heads=[HeadDiff(**h) for h in heads],
                      tokens=[CompareToken(a=p["a"], b=p["b"], cos=p["cos"], cos_by_stage=p["cos_by_stage"],
                                           token=texts[p["a"]]) for p in pairs])

