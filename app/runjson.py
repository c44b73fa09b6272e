"""A run's JSON, serialised fast: RunOut's fields over the engine's typed results (``RunBody``), and
the logit lens's the same way; and the attention of the JSON export (``attnscope-run/2``). Used by the
run routes and the command line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from attnscope.app.encoding import f32_base64
from attnscope.app.schemas import RunOut, TruncatedOut
from attnscope.model.load.tokens import Token
from attnscope.model.results import LogitLens, PositionPrediction
from attnscope.model.runs.record import RunRecord
from attnscope.model.scores.analysis import INDUCTION_MIN_QUERIES, HeadScore, induction_queries


@dataclass(frozen=True, slots=True)
class RunBody:
    """RunOut's fields over the engine's typed results.

    A run's JSON is serialised from this by pydantic-core without building and validating
    a RunOut: at 1,024 positions x top-k that would cost more than the analysis itself.
    The schema is still RunOut: tests validate the JSON against it and check that the
    fields agree.
    """

    run_id: str
    model: str
    causal: bool
    n_layers: int
    n_heads: int
    text: str
    tokens: list[Token]
    predictions: list[PositionPrediction]
    heads: list[HeadScore]
    induction_queries: int
    induction_min_queries: int
    timing_ms: dict[str, float]
    scores_pending: tuple[str, ...]
    stored: bool
    truncated: TruncatedOut | None = None


RUN_JSON = TypeAdapter(RunBody)
LENS_JSON = TypeAdapter(LogitLens)  # the fields of LogitLensOut, as RunBody's are RunOut's


def run_body(run_id: str, record: RunRecord, truncated: TruncatedOut | None = None) -> RunBody:
    s = record.summary
    return RunBody(run_id=run_id, model=s.model, causal=record.causal, n_layers=record.n_layers,
                   n_heads=record.n_heads, text=record.text, tokens=s.tokens, predictions=s.predictions, heads=s.heads,
                   induction_queries=induction_queries(record.input_ids), induction_min_queries=INDUCTION_MIN_QUERIES,
                   timing_ms=s.timing_ms, scores_pending=s.scores_pending, stored=record.stored, truncated=truncated)


def run_out(run_id: str, record: RunRecord) -> RunOut:
    """The run as a validated RunOut (for callers that want the object, not the bytes)."""
    return RunOut.model_validate_json(RUN_JSON.dump_json(run_body(run_id, record)))


EXPORT_FORMAT = "attnscope-run/2"


def attention_cells(record: RunRecord) -> int:
    """Every head's visible attention cells: what a JSON export of the run holds."""
    visible = record.n * (record.n + 1) // 2 if record.causal else record.n * record.n
    return visible * record.n_heads * record.n_layers


def attention_json(record: RunRecord) -> dict[str, Any]:
    """The JSON export's attention: [layer][head] each head's visible cells, base64 float32 (exact)."""
    return {"attention_encoding": "f32-le-base64",
            "attention": [[f32_base64(head_cells) for head_cells in record.packed(layer)]
                          for layer in range(record.n_layers)]}
