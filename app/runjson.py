"""A run's JSON (``RunBody``: its one HTTP schema, over the engine's typed results), serialised fast, and
the logit lens's and the head scores' the same way; and the attention of the JSON export. Used by the run
routes and the command line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from attnscope.app.encoding import f32_base64
from attnscope.app.schemas import TruncatedOut
from attnscope.model.load.tokens import Token
from attnscope.model.results import LogitLens, PositionPrediction
from attnscope.model.runs.record import RunRecord
from attnscope.model.scores.analysis import INDUCTION_MIN_QUERIES, INDUCTION_NEAR, HeadScore, induction_queries
from attnscope.model.services.runs import Heads


@dataclass(frozen=True, slots=True)
class RunBody:
    """A run as the API answers it (``POST /api/runs``, ``GET /api/runs/{id}``): the route's response model,
    over the engine's typed results.

    Its JSON is serialised by pydantic-core straight from these dataclasses (``RUN_JSON``), without
    validating them again: at 1,024 positions x top-k that would cost more than the analysis itself.
    """

    run_id: str
    model: str
    causal: bool
    n_layers: int
    n_heads: int
    text: Annotated[str, Field(description=(
        "the text the tokens cover (for a recorded generation: prompt + generated text)"))]
    tokens: list[Token]
    predictions: Annotated[list[PositionPrediction], Field(description=(
        "next-token distribution at every position, from one forward; empty for encoders"))]
    heads: list[HeadScore]
    induction_queries: Annotated[int, Field(description=(
        "queries that count for the induction score: their token occurred earlier at j with j + 1 more than "
        f"{INDUCTION_NEAR} positions back"))]
    induction_min_queries: Annotated[int, Field(description=(
        "how many such queries a score needs (fewer: `induction` is null)"))]
    timing_ms: dict[str, float]
    scores_pending: Annotated[tuple[str, ...], Field(description=(
        "head score fields still being computed after this response (on layers the fused kernel ran: "
        "\"entropy\", \"max\", \"prev_token\", \"first_token\", \"induction\"): null in `heads` until then; "
        "GET /api/runs/{run_id}/heads?wait=S returns them"))]
    stored: Annotated[bool, Field(description=(
        "whether the run's file is on disk now (written whole and fsync'd, in the server's run directory): a "
        "run answered with `stored: false` is being written in the background (a crash in that moment loses "
        "it), or is kept in memory only (no run directory, or over its cap). GET "
        "/api/runs/{run_id}/stored?wait=S waits for the file"))]
    truncated: Annotated[TruncatedOut | None, Field(description=(
        "set when `truncate` cut the text to the model's limit (in the answer to that POST /api/runs): what "
        "was kept; null otherwise"))] = None


RUN_JSON = TypeAdapter(RunBody)
LENS_JSON = TypeAdapter(LogitLens)
HEADS_JSON = TypeAdapter(Heads)


def run_body(run_id: str, record: RunRecord, truncated: TruncatedOut | None = None) -> RunBody:
    s = record.summary
    return RunBody(run_id=run_id, model=s.model, causal=record.causal, n_layers=record.n_layers,
                   n_heads=record.n_heads, text=record.text, tokens=s.tokens, predictions=s.predictions, heads=s.heads,
                   induction_queries=induction_queries(record.input_ids), induction_min_queries=INDUCTION_MIN_QUERIES,
                   timing_ms=s.timing_ms, scores_pending=s.scores_pending, stored=record.stored, truncated=truncated)


# the JSON export's name: JSON, not a version of the run file (files written as "attnscope-run/2" before it
# was renamed are the same JSON, and `attnscope export` reads both)
EXPORT_FORMAT = "attnscope-json/1"


def attention_cells(record: RunRecord) -> int:
    """Every head's visible attention cells: what a JSON export of the run holds."""
    visible = record.n * (record.n + 1) // 2 if record.causal else record.n * record.n
    return visible * record.n_heads * record.n_layers


def attention_json(record: RunRecord) -> dict[str, Any]:
    """The JSON export's attention: [layer][head] each head's visible cells, base64 float32 (exact)."""
    return {"attention_encoding": "f32-le-base64",
            "attention": [[f32_base64(head_cells) for head_cells in record.packed(layer)]
                          for layer in range(record.n_layers)]}
