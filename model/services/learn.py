"""Services for the Learn views: contributions and their gaps, a token's embedding, the parameter
anatomy, the position encoding, a timing of parallel vs serial, two runs compared.

Keyword-only and typed, like ``model.services.runs``: the HTTP routes and the Python door call these
same functions. Each checks its ranges once, reserves the memory it holds from the engine's budget,
takes the model's lock where it runs the model (the timing a turn at a time, ``learn.timing.Turns``),
and returns typed results with token strings decoded. The views that only read weights or kept runs
(embedding, anatomy, positions, compare) take no lock: the embedding's V x V sweep (seconds, warmed up
at start; a vocabulary too large for it is sampled instead, ``learn.embedding.SAMPLE_ROWS``) must not
stop every forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnscope.model.errors import BadInput, Param
from attnscope.model.learn import anatomy as anatomy_lesson
from attnscope.model.learn import compare as compare_lesson
from attnscope.model.learn import embedding as embedding_lesson
from attnscope.model.learn import positions as positions_lesson
from attnscope.model.learn import timing as timing_lesson
from attnscope.model.learn import values
from attnscope.model.learn.anatomy import Anatomy
from attnscope.model.learn.compare import HeadDiff, TokenMatch
from attnscope.model.learn.embedding import Neighbourhood
from attnscope.model.learn.positions import PositionTable
from attnscope.model.learn.timing import Timings
from attnscope.model.learn.values import Contributions, HeadGap
from attnscope.model.load.models import LoadedModel, input_embeddings
from attnscope.model.load.tokens import ids_tensor
from attnscope.model.runs.budget import estimate
from attnscope.model.services.engine import Engine
from attnscope.model.services.runs import check_position

TIMING_MAX_TOKENS = 32  # the uncached serial run grows with the square of the length
TIMING_BUDGET_S = 10.0  # a timing estimated to take longer is refused with its numbers (timing_over_budget)
MAX_TOP = 50  # nearest rows of E one embedding request may ask for
MAX_POSITIONS = 1024  # positions one position-table request may ask for
MAX_REPEATS = 5  # timed repeats of each mode (32 tokens x 5 on the bundled model: about 9 s on 2 cores)


@dataclass(frozen=True, slots=True)
class ContributionGaps:
    """Per head at one query: how far the weights are from what each source adds."""

    position: int
    heads: list[HeadGap]


@dataclass(frozen=True, slots=True)
class Timing(Timings):
    """A timing of ``tokens`` on ``model``: the milliseconds of ``learn.timing.Timings``."""

    model: str
    tokens: list[str]


@dataclass(frozen=True, slots=True)
class Comparison:
    """Runs ``a`` and ``b`` (same model): per token of A, its hidden states against the same token in
    B at every stage; per head, how much the attention changes."""

    a: str
    b: str
    stages: list[str]  # "embed", then "block 0", "block 1", ...
    tokens: list[TokenMatch]
    heads: list[HeadDiff]


def check_range(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        params: dict[str, Param] = {"name": name, "value": value, "min": lo, "max": hi}
        raise BadInput(f"{name} {value} is out of range: {lo}..{hi}", code="value_out_of_range", params=params)


def forward_bytes(lm: LoadedModel, n: int) -> int:
    """A plain forward over n tokens at its peak: one block's activations, a block of attention weights,
    and the logits of every position."""
    est = estimate(lm, n, 1)
    return est.peak - est.keep + 4 * n * lm.info.vocab_size


def contributions(engine: Engine, *, run_id: str, layer: int, head: int, position: int) -> Contributions:
    """What each source token the query at ``position`` sees adds to one head's output."""
    record = engine.run(run_id)
    engine.check_layer_head(record, layer, head)
    check_position(record, position)
    lm = engine.model_of(record)
    held = forward_bytes(lm, record.n) + 4 * record.n * lm.info.d_model + 2 * 4 * values.PROJECT_CELLS
    with engine.budget.reserve(held), lm.lock:
        return values.contributions(lm, record, layer, head, position)


def contribution_gaps(engine: Engine, *, run_id: str, position: int) -> ContributionGaps:
    """Per head at ``position``: the total-variation distance between the weights and each source's
    share of what the head adds (0: the weights tell the whole story)."""
    record = engine.run(run_id)
    check_position(record, position)
    lm = engine.model_of(record)
    info = lm.info
    held = (forward_bytes(lm, record.n) + 4 * info.n_layers * record.n * info.n_heads * info.d_head
            + 2 * 4 * values.PROJECT_CELLS)
    with engine.budget.reserve(held), lm.lock:
        heads = values.contribution_gaps(lm, record, position)
    return ContributionGaps(position=position, heads=heads)


def embedding(engine: Engine, *, model: str | None = None, id: int, top: int = 10) -> Neighbourhood:
    """Row ``id`` of the token embedding E, its ``top`` nearest rows, the ids next to it, and which
    rows training never moved apart."""
    lm = engine.model(model)
    vocab, d = embedding_shape(lm)
    if not 0 <= id < vocab:
        raise BadInput(f"token id {id} is out of range: the vocabulary has ids 0..{vocab - 1}", code="bad_id",
                       params={"token_id": id, "max": vocab - 1})
    check_range("top", top, 1, min(MAX_TOP, vocab - 1))
    with engine.budget.reserve(embedding_lesson.sweep_bytes(vocab, d)):
        return embedding_lesson.neighbours(lm, id, top)


def embedding_shape(lm: LoadedModel) -> tuple[int, int]:
    """(rows, columns) of the token embedding E."""
    E = input_embeddings(lm.model)
    return int(E.shape[0]), int(E.shape[1])


def anatomy(engine: Engine, *, model: str | None = None) -> Anatomy:
    """The model's parameters counted by part (counts only: nothing held, no budget)."""
    return anatomy_lesson.anatomy(engine.model(model))


def positions(engine: Engine, *, model: str | None = None, count: int = 64) -> PositionTable:
    """The first ``count`` positions (at most the model's) of its learned table, or its rotary angles."""
    lm = engine.model(model)
    check_range("count", count, 1, MAX_POSITIONS)
    count = min(count, lm.info.max_positions or count)
    with engine.budget.reserve(4 * count * (2 * lm.info.d_model + count)):
        return positions_lesson.position_table(lm, count)


def timing(engine: Engine, *, model: str | None = None, text: str, repeats: int = 5,
           repeat_to: int | None = None) -> Timing:
    """One parallel forward over ``text`` against serial steps with and without the KV cache, each
    timed ``repeats`` times; ``repeat_to`` repeats the prompt's tokens to that many."""
    lm = engine.model(model)
    check_range("repeats", repeats, 1, MAX_REPEATS)
    if repeat_to is not None:
        check_range("repeat_to", repeat_to, 1, TIMING_MAX_TOKENS)
    if not lm.info.has_lm_head:
        raise BadInput(f"model {lm.info.name!r} is an encoder: it does not generate, "
                       "so there is nothing serial to time", code="encoder_no_lm_head",
                       params={"model": lm.info.name})
    tokens = engine.tokenize(lm, text)
    if len(tokens) > TIMING_MAX_TOKENS:
        raise BadInput(f"the prompt has {len(tokens)} tokens; timing takes at most {TIMING_MAX_TOKENS} "
                       "(the uncached serial run grows with the square of the length)", code="timing_long",
                       params={"tokens": len(tokens), "max": TIMING_MAX_TOKENS})
    if repeat_to is not None:
        tokens = (tokens * -(-repeat_to // len(tokens)))[:repeat_to]
    info, n = lm.info, len(tokens)
    kv_cache = 2 * 4 * info.n_layers * n * info.n_kv_heads * info.d_head
    with engine.budget.reserve(forward_bytes(lm, n) + kv_cache):  # the lock: a turn at a time, inside
        cost = timing_lesson.cost(lm, ids_tensor(tokens), repeats)  # two probe forwards, before the work
        if cost.seconds > TIMING_BUDGET_S:
            raise BadInput(f"timing {n} tokens {repeats} times would take about {cost.seconds:.0f} s here "
                           f"({cost.forwards:,} forwards of {lm.info.name}); a timing may take at most "
                           f"{TIMING_BUDGET_S:.0f} s: ask for fewer repeats or tokens", code="timing_over_budget",
                           params={"seconds": round(cost.seconds, 1), "budget": TIMING_BUDGET_S,
                                   "forwards": cost.forwards, "tokens": n, "repeats": repeats})
        measured = timing_lesson.parallel_vs_serial(lm, ids_tensor(tokens), repeats)
    return Timing(model=lm.info.name, tokens=[t.text for t in tokens],
                  **{f.name: getattr(measured, f.name) for f in dataclasses.fields(measured)})


def compare(engine: Engine, *, a: str, b: str) -> Comparison:
    """Two runs of one model (the same tokens in another order, typically): per token, the cosine of its
    hidden states at every stage; per head, the mean change of its attention rows."""
    run_a, run_b = engine.run(a), engine.run(b)
    if run_a.model != run_b.model:
        raise BadInput("both runs must come from the same model", code="different_models",
                       params={"a": run_a.model, "b": run_b.model})
    with engine.budget.reserve(compare_lesson.block_bytes(run_a.attention + run_b.attention)):
        tokens = compare_lesson.hidden_similarity(run_a.input_ids.tolist(), run_a.resid, run_b.input_ids.tolist(),
                                                  run_b.resid, [t.text for t in run_a.summary.tokens])
        heads = compare_lesson.attention_differences(run_a.attention, run_b.attention)
    return Comparison(a=a, b=b, stages=["embed"] + [f"block {i}" for i in range(run_a.n_layers)], tokens=tokens,
                      heads=heads)
