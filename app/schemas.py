"""Public request and response shapes of the JSON API (data only)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator
from pydantic import Strict as StrictType
from pydantic_core import PydanticCustomError

from attnscope.model.scores.analysis import INDUCTION_NEAR, INDUCTION_RULE

PositionEncoding = Literal["learned", "sinusoidal", "rotary", "alibi", "none"]


# request numbers are JSON numbers: true/false or "5" for an integer (or a number) is refused with 422, not
# read as 1/0 or 5. Request models hold lists of [layer, head] tuples, which a model-wide strict mode would
# refuse as JSON arrays: the strictness is per field.
StrictFloat = Annotated[float, StrictType()]  # an integer is still a number: 1 reads as 1.0
MAX_TOP_K_SETTING = 10_000  # ATTNSCOPE_MAX_TOP_K's own upper bound; the OpenAPI document states the server's value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ModelOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    name: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int = Field(description="K/V heads; fewer than n_heads for grouped-query attention")
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int
    max_positions: int | None = Field(description="the model's position limit; null when it has none (ALiBi)")
    max_tokens: int = Field(description="longest prompt this server accepts for this model")
    family: str = Field(description="the model family (transformers' model_type), one of the supported ones")
    device: str = Field(description="where the model runs: 'cpu', 'cuda:0', 'mps', ... (its input embedding's "
                                    "device when layers are spread over several)")
    dtype: str = Field(description="the weights' dtype: float32, bfloat16 or float16 (analysis is float32)")
    has_chat_template: bool = Field(description="the tokenizer has a chat template: POST /api/runs accepts messages")
    weights: str | None = Field(None, description="where the weights came from when that changes what they are: "
                                "\"GGUF Q4_1, de-quantized to float32\" — the quantized model itself, in float32; its "
                                "attention is exact for those weights (null: the checkpoint's own weights)")
    position_encoding: PositionEncoding
    causal: bool
    has_lm_head: bool
    n_params: int
    default: bool
    induction_scores: list[list[float]] = Field(
        description="[layer][head] induction score on a random sequence repeated twice")


class AvailableModelOut(BaseModel):
    name: str
    about: str = Field(description="what the model is and where it comes from")


class ModelsOut(BaseModel):
    models: list[ModelOut] = Field(description="the loaded models")
    available: list[AvailableModelOut] = Field(
        default_factory=list, description="models offered but not loaded yet (a real model whose package is "
        "installed): the first request naming one loads it (seconds; a GGUF file's first de-quantization, a "
        "minute), then it is listed in `models`")


class HealthOut(BaseModel):
    status: str = Field(description="'ok' once the models are loaded")
    models: list[str] = Field(description="names of the loaded models")
    runs: int = Field(description="runs kept server-side")
    run_cache_bytes: int = Field(description="bytes of activations (and summaries) those runs hold")
    run_cache_max_bytes: int = Field(
        description="the run store's cap (ATTNSCOPE_RUN_STORE_BYTES): least recently used runs go first")
    tile_cache_bytes: int = Field(0, description="bytes of computed attention tiles kept for reuse (overviews, "
                                  "zoom tiles), apart from the runs")
    tile_cache_max_bytes: int = Field(0, description="its cap (ATTNSCOPE_TILE_CACHE_BYTES)")
    rss_bytes: int | None = Field(description="the server process's resident memory; null where unknown")
    worker: int = Field(0, description="which process answered (its id): with `serve --workers N`, requests "
                                       "are spread over N")
    run_dir: str | None = Field(None, description="the run directory behind the memory (ATTNSCOPE_RUN_DIR), or "
                                                  "null: runs in memory only")
    run_dir_bytes: int = Field(0, description="bytes of run files there")


def _text_not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty", "text is empty or only whitespace; type a prompt to analyse")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: unpaired surrogate at character {exc.start}") from None
    return value


class ChatMessage(Strict):
    role: str = Field(min_length=1, max_length=32, description="system, user, assistant, ...", examples=["user"])
    content: str = Field(max_length=1_000_000, examples=["What is attention?"])


class StoredOut(BaseModel):
    run_id: str
    stored: bool = Field(description="the run's file is on disk, whole and fsync'd: it survives a crash")
    directory: bool = Field(description="whether this server keeps runs on disk at all (a run directory)")


class RunRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"text": "The cat sat on the mat. The cat sat on the", "top_k": 5}]})

    text: str | None = Field(None, description="the prompt; any Unicode; at most the server's ATTNSCOPE_MAX_TOKENS "
                             "tokens (32,768 unless configured) and the model's own limit (`max_tokens` in GET "
                             "/api/models); a run too large to keep answers 413 before its forward",
                             examples=["The cat sat on the mat. The cat sat on the"])
    messages: list[ChatMessage] | None = Field(
        None, min_length=1, max_length=1000,
        description="instead of text: a chat, rendered with the model's chat template (with the generation "
                    "prompt); its special tokens are marked in the run's tokens. 422 when the model has no template")
    model: str | None = Field(None, description="a configured model name (GET /api/models); default if omitted")
    top_k: StrictInt | None = Field(None, ge=1, le=MAX_TOP_K_SETTING,
                                    description="next-token candidates kept per position: at most the "
                                    "server's ATTNSCOPE_MAX_TOP_K (100 unless configured; past it, 422); default "
                                    "10, or that limit if lower", examples=[5])
    truncate: StrictBool = Field(False, description="a text over the model's token limit: analyse its beginning, the "
                                              "first limit tokens (the run's `truncated` says what was kept), "
                                              "instead of answering 422. Text only, not messages")

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str | None) -> str | None:
        return None if value is None else _text_not_blank(value)

    @model_validator(mode="after")
    def _text_or_messages(self) -> RunRequest:
        if (self.text is None) == (self.messages is None):
            raise ValueError('send either "text" (the prompt) or "messages" (a chat, for a model with a chat '
                             'template), not both')
        if self.truncate and self.messages is not None:
            raise ValueError('"truncate" cuts a "text" only: a chat is not cut; send fewer or shorter messages')
        return self


class TokenOut(BaseModel):
    index: int
    text: str = Field(description="display string (BPE markers cleaned)")
    id: int
    start: int = Field(description="character offset of the first character this token completes")
    end: int = Field(description="character offset just past the last; start == end when it completes none. "
                                 "Spans never overlap: consecutive tokens are contiguous and rebuild the text once")
    special: bool = Field(False, description="a special token (<|endoftext|>, [CLS]); it covers no text of a "
                                             "prompt (in a chat run: its spelling in the rendered template)")
    partial: bool = Field(False, description="holds bytes of a character that a later token completes "
                                             "(text then shows those bytes, e.g. ‹e6 88›)")


class TopToken(BaseModel):
    id: int
    token: str
    prob: float


class ActualNext(TopToken):
    rank: int = Field(description="1 = the model's most likely token")


class PredictionOut(BaseModel):
    position: int
    top: list[TopToken]
    actual_next: ActualNext | None


class HeadOut(BaseModel):
    layer: int
    head: int
    entropy: float | None = Field(description="mean row entropy, nats, exact over every row; null while pending "
                                              "(the run's scores_pending lists it)")
    prev_token: float | None = Field(description="mean attention from token i to i-1, exact over every row; null "
                                                 "while pending (the run's scores_pending lists it)")
    first_token: float | None = Field(description="mean attention from token i to token 0 (sink), exact over every "
                                                  "row; null while pending (the run's scores_pending lists it)")
    max: float | None = Field(description="mean over rows of the largest weight, exact over every row; null while "
                                          "pending (the run's scores_pending lists it)")
    induction: float | None = Field(description=f"copying evidence: {INDUCTION_RULE} (the run's induction_queries "
                                                "counts them); null then, or while pending (the run's "
                                                "scores_pending lists it)")


class SparsityHead(BaseModel):
    layer: int
    head: int
    top1: float = Field(description="mean share of a row's mass on its largest key")
    top5: float = Field(description="mean share of a row's mass on its 5 largest keys")
    keys_90: float = Field(description="mean number of keys that hold 90% of a row's mass")


class SparsityOut(BaseModel):
    heads: list[SparsityHead]


class TruncatedOut(BaseModel):
    tokens: int = Field(description="tokens analysed: the model's limit (a token at the cut may leave one fewer)")
    chars: int = Field(description="characters analysed: the text's beginning, which the run's `text` holds")
    total_chars: int = Field(description="characters of the text sent")


class RunOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    run_id: str
    model: str
    causal: bool
    n_layers: int
    n_heads: int
    text: str = Field(description="the text the tokens cover (for a recorded generation: prompt + generated text)")
    tokens: list[TokenOut]
    predictions: list[PredictionOut] = Field(description="next-token distribution at every position, from one "
                                                         "forward; empty for encoders")
    heads: list[HeadOut]
    induction_queries: int = Field(description="queries that count for the induction score: their token occurred "
                                               f"earlier at j with j + 1 more than {INDUCTION_NEAR} positions back")
    induction_min_queries: int = Field(description="how many such queries a score needs (fewer: `induction` is "
                                                   "null)")
    timing_ms: dict[str, float]
    scores_pending: list[str] = Field(
        default=[], description="head score fields still being computed after this response (on layers the "
                                "fused kernel ran: \"entropy\", \"max\", \"prev_token\", \"first_token\", "
                                "\"induction\"): null in `heads` until then; GET /api/runs/{run_id}/heads?wait=S "
                                "returns them")
    stored: bool = Field(
        default=False, description="whether the run's file is on disk now (written whole and fsync'd, in the "
                                   "server's run directory): a run answered with `stored: false` is being "
                                   "written in the background (a crash in that moment loses it), or is kept in "
                                   "memory only (no run directory, or over its cap). GET "
                                   "/api/runs/{run_id}/stored?wait=S waits for the file")
    truncated: TruncatedOut | None = Field(
        default=None, description="set when `truncate` cut the text to the model's limit (in the answer to that "
                                  "POST /api/runs): what was kept; null otherwise")


class HeadsOut(BaseModel):
    run_id: str
    heads: list[HeadOut]
    scores_pending: list[str] = Field(description="fields still being computed (null in `heads`); empty when complete")
    timing_ms: dict[str, float] = Field(description="the run's timings; once complete also \"exact_scores\" (ms of "
                                                    "the late sweep) and \"scores_ready\" (ms from the analyse's "
                                                    "start until every score was in)")
    error: str | None = Field(default=None, description="why the pending scores could not be computed, if they "
                                                        "could not")


class AttentionOut(BaseModel):
    layer: int
    head: int
    n: int
    causal: bool
    rows: list[list[float]] = Field(description="row i = query i; causal: i+1 visible weights, else n")


class LayerAttentionOut(BaseModel):
    layer: int
    n_heads: int
    n: int
    causal: bool
    heads: list[list[list[float]]] = Field(description="[head][query][key], rows as in AttentionOut")


class AttentionTileOut(BaseModel):
    layer: int
    head: int | None = Field(description="the head asked for; null: every head of the layer, one tile each")
    n_heads: int = Field(description="tiles in `cells` (1 when a head was asked for)")
    n: int
    causal: bool
    q0: int
    q1: int
    k0: int
    k1: int
    pool: Literal["max", "mean"] = Field(description="how a bin of several cells pools its visible cells")
    exact: bool = Field(description="every bin is one cell: the values are the weights themselves")
    q_edges: list[int] = Field(description="the query bins' boundaries: bin i covers [q_edges[i], q_edges[i+1])")
    k_edges: list[int] = Field(description="the key bins' boundaries, likewise")
    cells: list[list[list[float | None]]] = Field(
        description="[head][query bin][key bin]; null where every cell of the bin is masked")


class NextOut(BaseModel):
    position: int
    temperature: float
    top: list[TopToken] = Field(description="softmax(logits / temperature) over the whole vocabulary, top-k")
    actual_next: ActualNext | None = Field(description="the prompt's own next token at this temperature")
    entropy: float = Field(description="entropy of the re-scaled distribution, nats")


class ResidualLayerOut(BaseModel):
    layer: int
    resid_norm: list[float] = Field(description="‖resid_post‖ per token")
    cos_prev: list[float] = Field(description="cosine(resid_post, resid_pre) per token")
    attn_norm: list[float] = Field(description="‖attention sublayer output‖ per token")
    mlp_norm: list[float] = Field(description="‖MLP sublayer output‖ per token")


class ResidualOut(BaseModel):
    n_layers: int
    n: int
    embed_norm: list[float] = Field(description="‖embedding output‖ (blocks.0.hook_resid_pre) per token")
    layers: list[ResidualLayerOut]


class LensPosition(BaseModel):
    position: int
    top: list[TopToken]


class LensLayer(BaseModel):
    layer: int = Field(description="-1 = the embedding output, i = after block i")
    label: str
    positions: list[LensPosition]


class LogitLensOut(BaseModel):
    n_layers: int
    n: int
    top_k: int
    layers: list[LensLayer]


class GenerateRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"text": "The cat sat on the mat. The cat sat on the", "max_new_tokens": 8, "temperature": 0.0}]})

    text: str = Field(examples=["The cat sat on the mat. The cat sat on the"])
    model: str | None = Field(None, description="a configured model name (GET /api/models); default if omitted")
    max_new_tokens: StrictInt = Field(32, ge=1, description="at most the server's ATTNSCOPE_MAX_NEW_TOKENS (512 "
                                      "unless configured; past it, 422), and prompt + new tokens within the "
                                      "model's limit", examples=[8])
    temperature: StrictFloat = Field(1.0, ge=0.0, le=10.0, description="0 = greedy")
    top_k: StrictInt = Field(0, ge=0, le=100_000, description="0 = no top-k filter")
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0)
    seed: StrictInt = Field(0, ge=0, le=2**63 - 1)
    stop_at_eos: StrictBool = Field(True, description="stop when the model writes end-of-text (`done.stop` is then "
                                                      "\"eos\"); false: go on past it until max_new_tokens")
    record: StrictBool = Field(False, description="keep every step's activations; a final `run` event names the "
                                                  "run over prompt + generated text")
    watch_layer: StrictInt | None = Field(None, ge=0, le=10_000,
                                          description="with record: send this head's new attention rows in each "
                                                      "event")
    watch_head: StrictInt | None = Field(None, ge=0, le=10_000)

    _check_text = field_validator("text")(_text_not_blank)

    @field_validator("temperature", "top_p")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


# ---- Learn views ---------------------------------------------------------------------------

class TimingRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [{"text": "The cat sat on the mat", "repeats": 3}]})

    text: str = Field(description="the prompt: at most 32 tokens (the uncached serial run grows with the square "
                                  "of the length; past it, 422). The work is estimated first from two probe "
                                  "forwards: a timing that would take over 10 s here answers 422 "
                                  "`timing_over_budget` with the estimate", examples=["The cat sat on the mat"])
    model: str | None = Field(None, description="a configured model with an LM head; default if omitted")
    repeat_to: StrictInt | None = Field(None, ge=1, le=32,
                                        description="repeat the prompt's tokens to this many (a longer text to time)")
    repeats: StrictInt = Field(5, ge=1, le=5,
                               description="timed repeats of each mode; the per-step times are their medians")

    _check_text = field_validator("text")(_text_not_blank)
