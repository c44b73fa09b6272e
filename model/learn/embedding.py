"""Learn §3-4, "Token ids" and "Embeddings": a token's row of E, its nearest rows, the ids next to
it (k ± 1, no closer than any random pair), and which rows training never moved apart.

The untrained rows take a V x V sweep, computed once per model (``warm`` at start-up, in the
background, where it is cheap) and kept; everything else reads E directly.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.load.models import LoadedModel, input_embeddings
from attnscope.model.load.tokens import token_map

TWIN_COS = 0.95  # two rows this parallel are the same direction, for a trained embedding never
MIN_TWINS = 3  # a row with this many such twins belongs to a block of untouched rows
TWIN_BLOCK = 1024  # rows per side of one block of cosines: (1024, 1024) float32, 4 MiB
RANDOM_PAIRS = 4000  # random pairs of trained rows: the scale a neighbour's cosine is read against
_untrained: dict[tuple[int, int], torch.Tensor] = {}
_untrained_busy: dict[tuple[int, int], threading.Event] = {}  # computations in flight, by model
_untrained_lock = threading.Lock()

# the largest untrained-rows sweep (V x V x d multiply-adds, half of them twice) worth running at every
# start-up: both bundled models (attnscope-tiny 1.1e11, minilm-l6 3.6e11) are seconds; GPT-2's 50k x 768
# (1.9e12) or a 128k x 4096 vocabulary (6.9e13) would be minutes to hours of CPU beside every request,
# for a view that may never be opened, and is left to the first request that asks for it
WARM_FLOPS = 10**12
# a vocabulary whose sweep costs more (SmolLM2's 49k x 576: 1.4e12, over a minute of 2 CPU cores) is
# never swept for the view: the rows it shows are checked one by one (V x d each) and the untrained
# count and the random pairs come from this many rows drawn at random (V x d each: under a second)
SAMPLE_ROWS = 256
_sampled: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (rows, their flags), by model


class Stopped(Exception):
    """A background computation was asked to stop (the server is shutting down)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One row of E compared with the asked one."""

    id: int
    token: str  # its display string (untrusted text)
    cos: float  # cosine with the asked row
    untrained: Annotated[bool, Field(description=(
        "the row is one of a block of near-identical rows training never moved apart"))]


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    """A token's row of E and the rows around it, by direction and by number."""

    model: str
    id: int
    token: str
    vector: Annotated[list[float], Field(description="row id of the token embedding matrix E (d_model values)")]
    norm: float
    untrained: Annotated[bool, Field(description=(
        "this row is one of the near-identical rows of tokens training never saw"))]
    untrained_count: Annotated[int, Field(description=(
        "how many rows of E are flagged as untrained (an estimate from `untrained_examined` rows drawn at "
        "random where that is less than V)"))]
    untrained_examined: Annotated[int, Field(description=(
        "rows of E whose near-twins were counted: the vocabulary size, or a random sample where the V x V "
        "sweep is too costly"))]
    neighbours: Annotated[list[Row], Field(description="nearest rows of E by cosine similarity")]
    adjacent: Annotated[list[Row], Field(description="the ids k-1 and k+1: neighbours in number only")]
    double: Annotated[list[Row], Field(description="the id 2k, when the vocabulary has it")]
    random_mean: Annotated[float, Field(description="mean cosine between random pairs of trained rows, for scale")]
    random_std: float


def untrained_rows(lm: LoadedModel, stop: threading.Event | None = None) -> torch.Tensor:
    """(V,) bool: rows of E that training never moved apart.

    A token the training text never contains gets no gradient of its own; with a tied LM head
    every such row only ever receives the same "predict me less" push, so those rows drift
    together and end up nearly parallel (cosine ~1 to each other), while trained rows spread
    out. A row with at least MIN_TWINS other rows at cosine >= TWIN_COS is flagged. Computed
    once per model (V x V cosines, half of them, in blocks: seconds for a 30k vocabulary), by
    ``warm`` in the background when the server starts; a request that comes while it runs
    waits for it rather than computing it again. ``stop`` set: Stopped, between two blocks."""
    E = input_embeddings(lm.model)
    key = (id(lm.model), E.data_ptr())
    while True:
        with _untrained_lock:
            if key in _untrained:
                return _untrained[key]
            busy = _untrained_busy.get(key)
            if busy is None:
                busy = _untrained_busy[key] = threading.Event()
                break
        busy.wait()  # another thread computes it; if it failed, the loop computes it here
    try:
        flags = twin_counts(E.detach(), stop) >= MIN_TWINS
        with _untrained_lock:
            _untrained[key] = flags
    finally:
        with _untrained_lock:
            del _untrained_busy[key]
        busy.set()
    return flags


def twin_counts(E: torch.Tensor, stop: threading.Event | None = None) -> torch.Tensor:
    """(V, d) -> (V,) long: how many *other* rows each row has at cosine >= TWIN_COS. Each pair of
    blocks is compared once and counted for both sides (the cosine matrix is symmetric)."""
    unit = torch.nn.functional.normalize(E.float(), dim=-1)  # (V, d)
    V, step = unit.shape[0], TWIN_BLOCK
    twins = torch.zeros(V, dtype=torch.long, device=unit.device)  # beside the rows (a GPU model's on the GPU)
    with torch.inference_mode():
        for a in range(0, V, step):
            if stop is not None and stop.is_set():
                raise Stopped
            near = (unit[a : a + step] @ unit[a:].T) >= TWIN_COS  # (block, V - a): this block and the rest
            twins[a : a + step] += near.sum(-1)
            twins[a + step :] += near[:, step:].sum(0)  # the later rows' pairs with this block
    return (twins - 1).cpu()  # each row is its own twin once


def sweep_flops(lm: LoadedModel) -> int:
    """What ``untrained_rows`` costs for this model's embedding: V x V x d (V x V/2 dot products of 2d)."""
    vocab, d = input_embeddings(lm.model).shape
    return int(vocab) * int(vocab) * int(d)


def sweep_bytes(vocab: int, d: int) -> int:
    """What ``untrained_rows`` and ``neighbours`` hold at their peak: the unit rows (float32), one block of
    cosines and its flags, the counts, and the random pairs' rows."""
    return 4 * vocab * d + 5 * TWIN_BLOCK * vocab + 24 * vocab + 2 * 4 * RANDOM_PAIRS * d


def twin_flags(unit: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """(len(ids),) bool: whether each of these unit rows has MIN_TWINS other rows at cosine >= TWIN_COS
    (one V x d pass per row: what ``untrained_rows`` says of them, without the V x V sweep)."""
    with torch.inference_mode():
        near = (unit[torch.tensor(ids, dtype=torch.long, device=unit.device)] @ unit.T) >= TWIN_COS  # (k, V)
        return ((near.sum(-1) - 1) >= MIN_TWINS).cpu()


def sampled_rows(lm: LoadedModel, unit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SAMPLE_ROWS ids of E drawn at random (seeded) and their untrained flags, computed once per model."""
    E = input_embeddings(lm.model)
    key = (id(lm.model), E.data_ptr())
    with _untrained_lock:
        if key in _sampled:
            return _sampled[key]
    V = unit.shape[0]
    rows = torch.randperm(V, generator=torch.Generator().manual_seed(0))[: min(SAMPLE_ROWS, V)]
    found = (rows, twin_flags(unit, rows.tolist()))
    with _untrained_lock:
        _sampled[key] = found
    return found


def swept(lm: LoadedModel) -> bool:
    """Whether the view reads every row's flag (the V x V sweep: cheap enough, or done already)."""
    E = input_embeddings(lm.model)
    with _untrained_lock:
        done = (id(lm.model), E.data_ptr()) in _untrained
    return done or sweep_flops(lm) <= WARM_FLOPS


def warm(lm: LoadedModel, stop: threading.Event | None = None) -> bool:
    """What the Learn views compute once per model, computed now (``Engine.warm_up`` calls it in a
    background thread at start-up, so the first embedding request answers as fast as the next).
    False: the sweep costs more than WARM_FLOPS and is left to the first request."""
    if sweep_flops(lm) > WARM_FLOPS:
        return False
    untrained_rows(lm, stop)
    return True


def neighbours(lm: LoadedModel, token_id: int, top: int) -> Neighbourhood:
    """Row ``token_id`` of E (0 <= token_id < V, checked by the caller), its ``top`` nearest rows by
    cosine, its numeric neighbours, and random pairs of trained rows for scale; every row's token
    decoded. A vocabulary too large to sweep (``swept``) flags the rows shown one by one and estimates
    the rest from SAMPLE_ROWS rows drawn at random: seconds instead of minutes."""
    E = input_embeddings(lm.model).detach()  # (V, d)
    V = E.shape[0]
    unit = torch.nn.functional.normalize(E.float(), dim=-1)
    cos = (unit @ unit[token_id]).cpu()  # (V,)
    cos_others = cos.clone()
    cos_others[token_id] = -2
    best = cos_others.topk(top)
    near = best.indices.tolist()
    adjacent = [i for i in (token_id - 1, token_id + 1) if 0 <= i < V]
    double = [2 * token_id] if 0 < 2 * token_id < V else []
    shown = [token_id, *near, *adjacent, *double]
    if swept(lm):
        flags = untrained_rows(lm)
        untrained = {i: bool(flags[i]) for i in shown}
        count, examined = int(flags.sum()), V
        trained = (~flags).nonzero().flatten()
    else:  # too large to sweep: the shown rows one by one, the count and the baseline from a sample
        untrained = dict(zip(shown, twin_flags(unit, shown).tolist(), strict=True))
        sample, sample_flags = sampled_rows(lm, unit)
        count, examined = round(float(sample_flags.float().mean()) * V), int(sample.numel())
        trained = sample[~sample_flags]
    # the baseline: random pairs of *trained* rows (untouched rows are near-copies of each
    # other and would make any pair look close)
    pool = trained if trained.numel() >= 2 else torch.arange(V)
    gen = torch.Generator().manual_seed(0)
    a = pool[torch.randint(0, pool.numel(), (RANDOM_PAIRS,), generator=gen)]
    b = pool[torch.randint(0, pool.numel(), (RANDOM_PAIRS,), generator=gen)]
    keep = a != b
    random_cos = (unit[a[keep].to(unit.device)] * unit[b[keep].to(unit.device)]).sum(-1).cpu()

    strings = token_map(lm.tokenizer, shown)

    def rows(ids: list[int]) -> list[Row]:
        return [Row(id=i, token=strings[i], cos=float(cos[i]), untrained=bool(untrained[i])) for i in ids]

    own = E[token_id].float()
    return Neighbourhood(
        model=lm.info.name, id=token_id, token=strings[token_id], vector=own.tolist(), norm=float(own.norm()),
        untrained=untrained[token_id], untrained_count=count, untrained_examined=examined,
        neighbours=rows(near), adjacent=rows(adjacent), double=rows(double),
        random_mean=float(random_cos.mean()), random_std=float(random_cos.std()))
