"""Public request and response shapes of the JSON API (data only)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator
from pydantic import Strict as StrictType
from pydantic_core import PydanticCustomError

from attnscope.model.scores.analysis import HeadSparsity
from attnscope.model.services.models import Offered

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


class ModelsOut(BaseModel):
    models: list[ModelOut] = Field(description="the loaded models")
    available: list[Offered] = Field(
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


class SparsityOut(BaseModel):
    heads: list[HeadSparsity]


class TruncatedOut(BaseModel):
    tokens: int = Field(description="tokens analysed: the model's limit (a token at the cut may leave one fewer)")
    chars: int = Field(description="characters analysed: the text's beginning, which the run's `text` holds")
    total_chars: int = Field(description="characters of the text sent")


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
