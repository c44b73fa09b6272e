"""Services over a stored run: its heads, any head's attention, the residual stream, the logit lens,
the next-token distribution and sparsity.

Keyword-only and typed: the HTTP routes and the Python door (``model.services.scope``) call these
same functions, so both give the same numbers. Each checks its ranges once (``BadInput`` names the
valid range), takes the model's lock where it runs the model, and returns typed results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field

from attnscope.model.capture.generation import tempered_logits
from attnscope.model.errors import BadInput
from attnscope.model.load.models import LMHead, LoadedModel
from attnscope.model.load.tokens import token_map
from attnscope.model.results import ActualNext, LensPosition, LensStage, LogitLens, NextDistribution, TokenProb
from attnscope.model.runs.record import RunRecord
from attnscope.model.runs.tile_store import OVERVIEW, Tiles
from attnscope.model.runs.tiles import Pool, TileSpec, head_tile
from attnscope.model.scores import analysis
from attnscope.model.scores.analysis import HeadScore, ResidualLayer, residual_stats
from attnscope.model.services.engine import Engine

MAX_TOP_K = 50  # the lens's and the ablation's candidates a position, at most


@dataclass(frozen=True, slots=True)
class Heads:
    """Every head's scores, layer by layer and head by head."""

    run_id: str
    heads: list[HeadScore]
    scores_pending: Annotated[tuple[str, ...], Field(description=(
        "fields still being computed (null in `heads`); empty when complete"))]
    timing_ms: Annotated[dict[str, float], Field(description=(
        "the run's timings; once complete also \"exact_scores\" (ms of the late sweep) and \"scores_ready\" "
        "(ms from the analyse's start until every score was in)"))]
    error: Annotated[str | None, Field(description=(
        "why the pending scores could not be computed, if they could not"))] = None


@dataclass(frozen=True, slots=True)
class Residual:
    """The residual stream layer by layer: norms, change, and what attention and the MLP wrote."""

    n_layers: int
    n: int
    embed_norm: Annotated[list[float], Field(description="‖embedding output‖ (blocks.0.hook_resid_pre) per token")]
    layers: list[ResidualLayer]


def check_position(record: RunRecord, position: int, name: str = "position") -> None:
    record.check_position(position, name)


def heads(engine: Engine, *, run_id: str, wait: float | None = 0.0) -> Heads:
    """The run's head scores; ``wait`` seconds (None: as long as it takes) for late ones still owed."""
    record = engine.wait_scores(run_id, wait) if wait is None or wait > 0 else engine.run(run_id)
    return heads_of(run_id, record)


def heads_of(run_id: str, record: RunRecord) -> Heads:
    """The head scores ``record`` holds now, with the error that keeps the pending ones from coming."""
    s = record.summary
    error = record.pending.error if s.scores_pending and record.pending is not None else None
    return Heads(run_id=run_id, heads=list(s.heads), scores_pending=tuple(s.scores_pending),
                 timing_ms=dict(s.timing_ms), error=error)


def attention(engine: Engine, *, run_id: str, layer: int, head: int) -> torch.Tensor:
    """One head's attention weights, exact: (n, n) float32 on the CPU, masked cells 0."""
    record = engine.run(run_id)
    engine.check_layer_head(record, layer, head)
    weights, visible = record.head_rows(layer, head, 0, record.n)  # (n, n) each, rebuilt from the kept Q and K
    return weights.masked_fill(~visible, 0.0).float().cpu()  # (n, n)


def attention_tile(engine: Engine, *, run_id: str, layer: int, head: int, q0: int | None = None,
                   q1: int | None = None, k0: int | None = None, k1: int | None = None, size: int | None = None,
                   pool: str = "max") -> torch.Tensor:
    """A tile of one head, as ``GET /api/runs/ID/attention`` with tile parameters: (rows, cols) float32,
    NaN for a bin whose cells are all masked."""
    record = engine.run(run_id)
    engine.check_layer_head(record, layer, head)
    if pool not in ("max", "mean"):
        raise BadInput(f"pool {pool!r} is not one of max, mean", params={"pool": pool})
    spec = TileSpec(*span("q", q0, q1, record.n), *span("k", k0, k1, record.n), size=size,
                    pool="max" if pool == "max" else "mean")
    return head_tile(record.attention[layer], head, spec).float().cpu()


def check_top_k(top_k: int, most: int = MAX_TOP_K) -> None:
    """The candidates a view lists: 1..``most``."""
    if not 1 <= top_k <= most:
        raise BadInput(f"top_k {top_k} is out of range: 1..{most}", code="value_out_of_range",
                       params={"name": "top_k", "value": top_k, "min": 1, "max": most})


def span(name: str, lo: int | None, hi: int | None, n: int) -> tuple[int, int]:
    """[lo, hi) within the run's n positions (defaults: all of them)."""
    a, b = (0 if lo is None else lo), (n if hi is None else hi)
    if not 0 <= a < b <= n:
        raise BadInput(f"{name}0={a}, {name}1={b} is not a range of positions: this run needs "
                       f"0 <= {name}0 < {name}1 <= {n}", code="range_invalid", params={"axis": name, "lo": a, "hi": b,
                                                                                    "n": n})
    return a, b


def residual(engine: Engine, *, run_id: str) -> Residual:
    record = engine.run(run_id)
    layers = residual_stats(torch.stack(record.resid), torch.stack(record.attn_out), torch.stack(record.mlp_out))
    return Residual(n_layers=record.n_layers, n=record.n, embed_norm=record.resid[0].norm(dim=-1).tolist(),
                    layers=layers)


def lens(engine: Engine, *, run_id: str, top_k: int = 5) -> LogitLens:
    check_top_k(top_k)
    return logit_lens(engine, engine.run(run_id), top_k)


def next_token(engine: Engine, *, run_id: str, position: int, temperature: float = 1.0,
               top_k: int = 10) -> NextDistribution:
    if not (temperature > 0 and temperature <= 100):  # also refuses NaN
        raise BadInput("temperature must be a finite number in (0, 100]", code="temperature_invalid",
                       params={"temperature": temperature})
    if top_k < 1:
        vocab = engine.model_of(engine.run(run_id)).info.vocab_size  # more is allowed: it gives them all
        raise BadInput(f"top_k {top_k} is out of range: at least 1", code="value_out_of_range",
                       params={"name": "top_k", "value": top_k, "min": 1, "max": vocab})
    return next_distribution(engine, engine.run(run_id), position, temperature, top_k)


def _decoder(engine: Engine, record: RunRecord, what: str) -> tuple[LoadedModel, LMHead]:
    lm = engine.model_of(record)
    head = lm.lm_head()
    if head is None:
        raise BadInput(f"model {lm.info.name!r} is an encoder without an LM head: it has no {what}",
                       code="encoder_no_lm_head", params={"model": lm.info.name})
    return lm, head


def next_distribution(engine: Engine, record: RunRecord, position: int, temperature: float,
                      top_k: int) -> NextDistribution:
    """The exact next-token distribution at one position, from the stored final residual."""
    lm, head = _decoder(engine, record, "next-token distribution")
    if not 0 <= position < record.n:
        raise BadInput(f"position {position} is out of range: this run has positions 0..{record.n - 1}",
                       code="position_out_of_range", params={"position": position, "max": record.n - 1})
    with lm.lock, torch.inference_mode():
        logits = head.logits(record.resid[-1][position]).double()  # (V,)
    logp = tempered_logits(logits, temperature).log_softmax(-1)  # (V,) float64, any temperature > 0
    probs = logp.exp()
    # ranked by the logits, which every temperature keeps in order: where a tiny temperature leaves
    # all but one probability 0, the ties at 0 are not ranked by their ids
    top = logits.topk(min(top_k, logits.shape[-1]))
    ids: list[int] = top.indices.tolist()
    nxt = int(record.input_ids[position + 1]) if position + 1 < record.n else None
    strings = token_map(lm.tokenizer, ids if nxt is None else [*ids, nxt])
    actual = None
    if nxt is not None:
        actual = ActualNext(id=nxt, token=strings[nxt], prob=float(probs[nxt]),
                            rank=int((logits > logits[nxt]).sum()) + 1)
    entropy = -torch.where(probs > 0, probs * logp, torch.zeros_like(probs)).sum()  # 0 log 0 = 0
    return NextDistribution(
        position=position, temperature=temperature,
        top=[TokenProb(id=i, token=strings[i], prob=float(probs[i])) for i in ids],
        actual_next=actual, entropy=max(float(entropy), 0.0))


def logit_lens(engine: Engine, record: RunRecord, top_k: int) -> LogitLens:
    lm, head = _decoder(engine, record, "logit lens")
    with lm.lock:
        probs, ids = analysis.logit_lens(torch.stack(record.resid), head, top_k)  # (L+1, n, k)
    strings = token_map(lm.tokenizer, ids.flatten().tolist())
    id_rows, prob_rows = ids.tolist(), probs.tolist()  # [stage][position][k]
    layers = [
        LensStage(layer=stage - 1, label="embed" if stage == 0 else f"block {stage - 1}", positions=[
            LensPosition(position=pos, top=[TokenProb(id=i, token=strings[i], prob=p)
                                            for i, p in zip(id_rows[stage][pos], prob_rows[stage][pos],
                                                            strict=True)])
            for pos in range(record.n)])
        for stage in range(len(id_rows))
    ]
    return LogitLens(n_layers=lm.info.n_layers, n=record.n, top_k=top_k, layers=layers)


def sparsity(engine: Engine, *, run_id: str) -> list[analysis.HeadSparsity]:
    """How concentrated each head of a run is; computed once, then kept with the run (counted)."""
    record = engine.store.get(run_id)
    if record.sparsity is not None:
        return record.sparsity
    heads = []
    for layer, kept in enumerate(record.attention):
        acc = analysis.SparsityAccumulator(kept.n_heads, kept.n)
        for _q0, _q1, weights, _visible in kept.blocks():
            acc.add(weights)  # (H, r, n): every row, exactly, never the whole n x n
        heads += acc.finish(layer)

    def attach() -> bool:
        if record.sparsity is not None:  # another request attached it meanwhile
            return False
        record.sparsity = heads
        return True

    # ~0.3 kB a head's scores, estimated as the summary's are
    engine.store.grow(run_id, record, 300 * len(heads), attach)
    return heads


def kept_tiles(tiles: Tiles, *, run_id: str, record: RunRecord, layer: int, heads: list[int],
               spec: TileSpec) -> torch.Tensor:
    """(heads, Sq, Sk) as ``model.runs.tiles.head_tiles``, through the tile store (kept tiles, overviews computed
    ahead, thumbnails pooled from them)."""
    return torch.stack([tiles.tile(run_id, layer, record.attention[layer], h, spec) for h in heads])


def tile_spec(record: RunRecord, *, q0: int | None, q1: int | None, k0: int | None, k1: int | None,
              size: int | None, pool: Pool | None) -> TileSpec:
    """The tile a request names: queries [q0, q1) x keys [k0, k1) of the run (defaults: all), pooled into at
    most size x size bins (422 for a range outside the run)."""
    return TileSpec(*span("q", q0, q1, record.n), *span("k", k0, k1, record.n), size=size, pool=pool or "max")


def whole_tile(record: RunRecord, *, size: int, pool: Pool) -> TileSpec:
    """The whole square of the run pooled into size x size bins (thumbnails, overviews)."""
    return TileSpec(0, record.n, 0, record.n, size=size, pool=pool)


def prefetch_overviews(tiles: Tiles, *, run_id: str, record: RunRecord) -> None:
    """A long run is drawn from tiles: every head's overview is computed ahead, in the background, right away."""
    if record.n > OVERVIEW:
        tiles.prefetch.submit(run_id, record.attention)
