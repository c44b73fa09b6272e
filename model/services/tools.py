"""Services for the causal tools: direct logit attribution, head ablation (one set, or every head
alone), activation patching.

Each validates its inputs once, reserves the memory its batched forwards need from the engine's
budget, takes the model's lock (the tools in ``model.tools`` assume their caller holds it), and
returns typed results whose token ids come with their display strings.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from attnscope.model.errors import BadInput
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import Token, ids_tensor, token_map
from attnscope.model.services.engine import Engine
from attnscope.model.services.runs import check_position, check_top_k
from attnscope.model.tools import ablation, attribution, patching
from attnscope.model.tools.intervene import batch_bytes, require_decoder

Mode = Literal["zero", "mean"]


@dataclass(frozen=True, slots=True)
class TokenRef:
    """A vocabulary id and its display string (untrusted text)."""

    id: int
    token: str


@dataclass(frozen=True, slots=True)
class Attribution:
    """The logit of ``token`` (minus ``token_b``'s) at ``position``, split into ``terms`` that sum to it
    up to ``error``."""

    position: int
    token: TokenRef
    token_b: TokenRef | None
    logit: float
    terms: list[attribution.Term]
    error: float
    final_transform: str | None
    final_steps: list[attribution.FinalStep]


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    token: str
    prob: float  # after the ablation
    prob_before: float  # the model's own


@dataclass(frozen=True, slots=True)
class AblatedNext:
    id: int
    token: str
    prob_before: float
    prob_after: float


@dataclass(frozen=True, slots=True)
class AblatedPosition:
    position: int
    kl: float  # KL(original || ablated) of the next-token distribution, nats
    top: list[Candidate]
    actual_next: AblatedNext | None


@dataclass(frozen=True, slots=True)
class Ablation:
    """Every position's next-token distribution with ``heads`` ablated, against the original."""

    heads: list[tuple[int, int]]
    mode: Mode
    positions: list[AblatedPosition]


@dataclass(frozen=True, slots=True)
class Scan:
    """The change in ln p(token) at ``position`` when each head (``effects[layer][head]``) or each MLP
    (``mlp[layer]``) alone is ablated."""

    position: int
    token: TokenRef
    mode: Mode
    logprob: float
    effects: list[list[float]]
    mlp: list[float]
    forwards: int


@dataclass(frozen=True, slots=True)
class PatchPrompt:
    text: str
    tokens: list[Token]
    metric: float  # logit(answer) - logit(wrong) at the position


@dataclass(frozen=True, slots=True)
class Patch:
    """Activation patching from ``clean`` into ``corrupted``: each value is (patched - corrupted) /
    (clean - corrupted) of the metric; 1 restores the clean answer."""

    model: str
    clean: PatchPrompt
    corrupted: PatchPrompt
    answer: TokenRef
    wrong: TokenRef
    position: int
    first_difference: int
    resid: list[list[float]]  # [stage][position]
    attn_out: list[list[float]]  # [layer][position]
    mlp_out: list[list[float]]  # [layer][position]
    heads: list[list[float]]  # [layer][head]
    forwards: int


def refs(lm: LoadedModel, ids: list[int]) -> list[TokenRef]:
    strings = token_map(lm.tokenizer, ids)
    return [TokenRef(id=i, token=strings[i]) for i in ids]


def _mode(mode: str) -> Mode:
    if mode not in ("zero", "mean"):
        raise BadInput(f"mode {mode!r} is not one of zero, mean", params={"mode": mode})
    return "zero" if mode == "zero" else "mean"


def attribute(engine: Engine, *, run_id: str, position: int, token: int | None = None,
              token_b: int | None = None) -> Attribution:
    record = engine.run(run_id)
    lm = engine.model_of(record)
    check_position(record, position)
    with engine.budget.reserve(batch_bytes(lm, position + 1, position + 1)), lm.lock:
        chosen = ablation.default_token(record, lm, position) if token is None else token
        result = attribution.attribute(lm, record, position, chosen, token_b)
    named = refs(lm, [result.token] + ([] if result.token_b is None else [result.token_b]))
    return Attribution(position=result.position, token=named[0], token_b=named[1] if len(named) > 1 else None,
                       logit=result.logit, terms=result.terms, error=result.error,
                       final_transform=result.final_transform, final_steps=result.final_steps)


def ablate(engine: Engine, *, run_id: str, heads: list[tuple[int, int]], mode: str = "zero",
           top_k: int = 5) -> Ablation:
    record = engine.run(run_id)
    lm = engine.model_of(record)
    checked = _mode(mode)
    check_top_k(top_k)
    pairs = [(int(layer), int(head)) for layer, head in heads]
    with engine.budget.reserve(batch_bytes(lm, record.n, record.n)), lm.lock:
        positions = ablation.ablate(lm, record, pairs, checked, top_k)
    strings = token_map(lm.tokenizer, [c.id for p in positions for c in p.top]
                        + [p.actual_next.id for p in positions if p.actual_next])
    return Ablation(heads=pairs, mode=checked, positions=[
        AblatedPosition(
            position=p.position, kl=p.kl,
            top=[Candidate(id=c.id, token=strings[c.id], prob=c.prob, prob_before=c.prob_before) for c in p.top],
            actual_next=None if p.actual_next is None else AblatedNext(
                id=p.actual_next.id, token=strings[p.actual_next.id], prob_before=p.actual_next.prob_before,
                prob_after=p.actual_next.prob_after))
        for p in positions])


def ablate_scan(engine: Engine, *, run_id: str, position: int, token: int | None = None,
                mode: str = "zero") -> Scan:
    record = engine.run(run_id)
    lm = engine.model_of(record)
    checked = _mode(mode)
    check_position(record, position)
    with engine.budget.reserve(batch_bytes(lm, position + 1, 1)), lm.lock:
        chosen = ablation.default_token(record, lm, position) if token is None else token
        attribution.check_token(lm, chosen, "token")
        result = ablation.scan(lm, record, position, chosen, checked)
    return Scan(position=result.position, token=refs(lm, [chosen])[0], mode=checked, logprob=result.logprob,
                effects=result.heads, mlp=result.mlp, forwards=result.forwards)


@dataclass(frozen=True, slots=True)
class PatchExample:
    """The default pair for ``model`` (the first of ``patching.PAIRS`` it separates, by one cheap forward
    each), its two metrics, and what patching it costs: ``forwards`` patched rows, ``tflop``, and
    ``seconds`` estimated from the probe's speed per row (a batched forward of ``patching.PROBE_ROWS``)."""

    model: str
    clean: str
    corrupted: str
    answer: str
    wrong: str
    clean_metric: float
    corrupted_metric: float
    separated: bool  # clean > 0 and clean - corrupted >= patching.MIN_GAP; else the best pair tried
    forwards: int
    tflop: float
    seconds: float


_examples: dict[tuple[str, int], PatchExample] = {}  # by model name and id(model): a few forwards each, once


def patch_example(engine: Engine, *, model: str | None = None) -> PatchExample:
    lm = engine.model(model)
    key = (lm.info.name, id(lm.model))
    if key in _examples:
        return _examples[key]
    require_decoder(lm, "activation patching")
    best: PatchExample | None = None
    for pair in patching.PAIRS:
        clean_tokens, corrupted_tokens = engine.tokenize(lm, pair.clean), engine.tokenize(lm, pair.corrupted)
        try:
            answer_id = patching.single_token(lm, pair.answer, "answer")
            wrong_id = patching.single_token(lm, pair.wrong, "wrong")
        except BadInput:
            continue
        if len(clean_tokens) != len(corrupted_tokens):
            continue
        clean_ids, corrupted_ids = ids_tensor(clean_tokens), ids_tensor(corrupted_tokens)
        with engine.budget.reserve(batch_bytes(lm, len(clean_tokens), 1)), lm.lock:
            clean_m, corrupted_m, per_row = patching.separates(lm, clean_ids, corrupted_ids, answer_id, wrong_id)
        forwards, flops = patching.cost(lm, clean_ids, corrupted_ids)
        found = PatchExample(model=lm.info.name, clean=pair.clean, corrupted=pair.corrupted, answer=pair.answer,
                             wrong=pair.wrong, clean_metric=clean_m, corrupted_metric=corrupted_m,
                             separated=clean_m > 0 and clean_m - corrupted_m >= patching.MIN_GAP,
                             forwards=forwards, tflop=flops / 1e12, seconds=per_row * forwards)
        if found.separated:
            best = found
            break
        if best is None or found.clean_metric - found.corrupted_metric > best.clean_metric - best.corrupted_metric:
            best = found
    if best is None:
        raise BadInput(f"none of the example pairs fits {lm.info.name!r}'s tokenizer (same token count, one-token "
                       "answers): type a pair of your own", code="patch_no_example", params={"model": lm.info.name})
    _examples[key] = best
    return best


def patch(engine: Engine, *, clean: str, corrupted: str, answer: str, wrong: str, position: int | None = None,
          model: str | None = None, stop: threading.Event | None = None) -> Patch:
    lm = engine.model(model)
    clean_tokens = engine.tokenize(lm, clean)
    corrupted_tokens = engine.tokenize(lm, corrupted)
    answer_id = patching.single_token(lm, answer, "answer")
    wrong_id = patching.single_token(lm, wrong, "wrong")
    if answer_id == wrong_id:
        raise BadInput(f"answer and wrong are the same token ({answer!r}): the metric would always be 0",
                       code="patch_same_token", params={"answer": answer})
    clean_ids, corrupted_ids = ids_tensor(clean_tokens), ids_tensor(corrupted_tokens)
    with engine.budget.reserve(batch_bytes(lm, len(clean_tokens), 1)), lm.lock:
        result = patching.patch(lm, clean_ids, corrupted_ids, answer_id, wrong_id, position, stop=stop)
    named = refs(lm, [answer_id, wrong_id])
    return Patch(model=lm.info.name, clean=PatchPrompt(clean, clean_tokens, result.clean_metric),
                 corrupted=PatchPrompt(corrupted, corrupted_tokens, result.corrupted_metric),
                 answer=named[0], wrong=named[1], position=result.position, first_difference=result.first_difference,
                 resid=result.resid, attn_out=result.attn_out, mlp_out=result.mlp_out, heads=result.heads,
                 forwards=result.forwards)
