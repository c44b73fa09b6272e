"""Causal tools on a stored run or a pair of prompts: attribute, ablate, patch.

Each handler is a plain ``def`` (FastAPI runs it in the thread pool), passes the model's
gate, and leaves the forwards to ``model/`` under the model's lock.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from attnscope.app.deps import EngineDep, GateDep
from attnscope.app.errors import ERRORS
from attnscope.app.intervention_schemas import (
    AblatedNext,
    AblatedPosition,
    AblateOut,
    AblateRequest,
    AttributionOut,
    Candidate,
    FinalStepOut,
    PatchOut,
    PatchRequest,
    PromptOut,
    ScanOut,
    ScanRequest,
    TermOut,
    TokenRef,
)
from attnscope.app.schemas import TokenOut
from attnscope.model.errors import BadInput
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import ids_tensor, token_map
from attnscope.model.tools import ablation, attribution, patching

router = APIRouter(prefix="/api", tags=["interventions"])
Int = Annotated[int, Query(ge=-(2**31), le=2**31)]


def _refs(lm: LoadedModel, ids: list[int]) -> list[TokenRef]:
    strings = token_map(lm.tokenizer, ids)
    return [TokenRef(id=i, token=strings[i]) for i in ids]


@router.get("/runs/{run_id}/attribution", response_model=AttributionOut, responses=ERRORS,
            summary="Direct logit attribution: each head, MLP, the embeddings and biases as terms of one logit",
            description="The final norm's scale at the position is frozen (TransformerLens' convention), so "
                        "the terms sum to `logit`; `error` is the float residue. With `token_b` the logit "
                        "difference token - token_b is attributed. `token` defaults to the prompt's next "
                        "token, or the top prediction at the last position.")
def attribute(run_id: str, engine: EngineDep, gate: GateDep, position: Int,
              token: Annotated[int | None, Query(ge=-(2**31), le=2**31)] = None,
              token_b: Annotated[int | None, Query(ge=-(2**31), le=2**31)] = None) -> AttributionOut:
    cache = engine.run(run_id)
    lm = engine.model(cache.model)
    if not 0 <= position < cache.n:
        raise BadInput(f"position {position} is out of range: this run has positions 0..{cache.n - 1}")
    with gate.enter(lm.info.name):
        chosen = ablation.default_token(cache, lm, position) if token is None else token
        result = attribution.attribute(lm, cache, position, chosen, token_b)
    refs = _refs(lm, [result.token] + ([] if result.token_b is None else [result.token_b]))
    return AttributionOut(position=result.position, token=refs[0], token_b=refs[1] if len(refs) > 1 else None,
                          logit=result.logit, terms=[TermOut.model_validate(t, from_attributes=True)
                                                     for t in result.terms], error=result.error,
                          final_transform=result.final_transform,
                          final_steps=[FinalStepOut.model_validate(st, from_attributes=True)
                                       for st in result.final_steps])


@router.post("/runs/{run_id}/ablate", response_model=AblateOut, responses=ERRORS,
             summary="Run the prompt again with some heads' outputs zeroed or replaced by their mean",
             description="Needs a run: create one with POST /api/runs and use its `run_id`. The example "
                         "ablates layer 4 head 0, the bundled model's induction head.")
def ablate(run_id: str, body: AblateRequest, engine: EngineDep, gate: GateDep) -> AblateOut:
    cache = engine.run(run_id)
    lm = engine.model(cache.model)
    heads = [(layer, head) for layer, head in body.heads]
    with gate.enter(lm.info.name):
        positions = ablation.ablate(lm, cache, heads, body.mode, body.top_k)
    ids = [c.id for p in positions for c in p.top] + [p.actual_next.id for p in positions if p.actual_next]
    strings = token_map(lm.tokenizer, ids)
    return AblateOut(heads=heads, mode=body.mode, positions=[
        AblatedPosition(
            position=p.position, kl=p.kl,
            top=[Candidate(id=c.id, token=strings[c.id], prob=c.prob, prob_before=c.prob_before) for c in p.top],
            actual_next=None if p.actual_next is None else AblatedNext(
                id=p.actual_next.id, token=strings[p.actual_next.id], prob_before=p.actual_next.prob_before,
                prob_after=p.actual_next.prob_after))
        for p in positions])


@router.post("/runs/{run_id}/ablate/scan", response_model=ScanOut, responses=ERRORS,
             summary="Ablate every head (and every MLP) alone: the change of ln p(token) at one position",
             description="Batched: many ablations per forward, over the prefix the position sees. Needs a run: "
                         "create one with POST /api/runs and use its `run_id`; `position` is one of its "
                         "positions.")
def ablate_scan(run_id: str, body: ScanRequest, engine: EngineDep, gate: GateDep) -> ScanOut:
    cache = engine.run(run_id)
    lm = engine.model(cache.model)
    if not 0 <= body.position < cache.n:
        raise BadInput(f"position {body.position} is out of range: this run has positions 0..{cache.n - 1}")
    with gate.enter(lm.info.name):
        token = ablation.default_token(cache, lm, body.position) if body.token is None else body.token
        attribution.check_token(lm, token, "token")
        result = ablation.scan(lm, cache, body.position, token, body.mode)
    return ScanOut(position=result.position, token=_refs(lm, [token])[0], mode=body.mode, logprob=result.logprob,
                   effects=result.heads, mlp=result.mlp, forwards=result.forwards)


@router.post("/patch", response_model=PatchOut, responses=ERRORS,
             summary="Activation patching from a clean prompt into a corrupted one",
             description="Metric: logit(answer) - logit(wrong) at `position` (default: the last). Each value is "
                         "(patched - corrupted) / (clean - corrupted): 1 restores the clean answer, 0 does "
                         "nothing. The prompts must have the same token count; answer and wrong must each "
                         "be one token. Every site is patched in its own forward: past about 20 TFLOP of them "
                         "(long prompts on a large model) the request is refused (422) before it runs.")
def patch(body: PatchRequest, engine: EngineDep, gate: GateDep) -> PatchOut:
    lm = engine.model(body.model)
    clean_tokens = engine.tokenize(lm, body.clean)
    corrupted_tokens = engine.tokenize(lm, body.corrupted)
    answer = patching.single_token(lm, body.answer, "answer")
    wrong = patching.single_token(lm, body.wrong, "wrong")
    if answer == wrong:
        raise BadInput(f"answer and wrong are the same token ({body.answer!r}): the metric would always be 0")
    clean_ids, corrupted_ids = ids_tensor(clean_tokens), ids_tensor(corrupted_tokens)
    with gate.enter(lm.info.name):
        result = patching.patch(lm, clean_ids, corrupted_ids, answer, wrong, body.position)
    refs = _refs(lm, [answer, wrong])
    return PatchOut(
        model=lm.info.name,
        clean=PromptOut(text=body.clean, tokens=[TokenOut.model_validate(t, from_attributes=True)
                                                 for t in clean_tokens], metric=result.clean_metric),
        corrupted=PromptOut(text=body.corrupted, tokens=[TokenOut.model_validate(t, from_attributes=True)
                                                         for t in corrupted_tokens],
                            metric=result.corrupted_metric),
        answer=refs[0], wrong=refs[1], position=result.position, first_difference=result.first_difference,
        resid=result.resid, attn_out=result.attn_out, mlp_out=result.mlp_out, heads=result.heads,
        forwards=result.forwards)
