"""Request and response shapes of the causal tools: attribution, ablation, patching (data only)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt, field_validator

from attnscope.app.schemas import Strict, TokenOut, _text_not_blank

INT32 = 2**31
# a layer, head, position or vocabulary id: a JSON integer (never true/false or "3"). The schema states its
# minimum, 0; a negative one is refused (422) by the route, whose message names the valid range (positions
# 0..n-1 of this run, this model's layers and heads, its vocabulary), where pydantic could only say ">= 0"
Index = Annotated[StrictInt, Field(le=INT32 - 1, json_schema_extra={"minimum": 0})]


class TokenRef(BaseModel):
    id: int
    token: str = Field(description="display string of the vocabulary entry")


class TermOut(BaseModel):
    kind: Literal["embed", "head", "mlp", "bias"]
    layer: int | None = Field(description="the block; null for the embeddings and for the final bias")
    head: int | None = Field(description="the head, for kind 'head'; otherwise null")
    value: float = Field(description="this component's share of the logit (or of the difference)")


class FinalStepOut(BaseModel):
    op: Literal["multiply", "divide", "softcap"] = Field(description=(
        "multiply: x * value; divide: x / value; softcap: tanh(x / value) * value"))
    value: float
    setting: str = Field(description="the model config's attribute the value comes from")


class AttributionOut(BaseModel):
    position: int
    token: TokenRef
    token_b: TokenRef | None = Field(description="the token subtracted, when a difference is attributed")
    logit: float = Field(description="the model's logit of token (minus token_b's) at position")
    terms: list[TermOut] = Field(description=(
        "embeddings, every head's own output through its slice of W_O, each attention projection's bias "
        "(kind 'bias' with a layer), every MLP, and the final norm's shift plus the LM head's bias (kind "
        "'bias', layer null); the final norm's scale at position is frozen, so the terms sum to logit"))
    error: float = Field(description="logit minus the sum of the terms: the float residue")
    final_transform: str | None = Field(description=(
        "what the model applies to its logits after the LM head (soft-capping), if anything; the attributed "
        "logit is the one before it"))
    final_steps: list[FinalStepOut] = Field(description=(
        "the same transform step by step, in order (empty when the model applies none), for a client that "
        "says it in another language"))


Mode = Literal["zero", "mean"]


class AblateRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [{"heads": [[4, 0]], "mode": "zero", "top_k": 5}]})

    heads: list[tuple[Index, Index]] = Field(
        max_length=8192, description="[layer, head] pairs to ablate (within the run's model: 422 otherwise); an "
                                     "empty list changes nothing", examples=[[[4, 0]]])
    mode: Mode = Field("zero", description="zero: the head's output becomes 0; mean: its mean output over the "
                                           "run's positions")
    top_k: StrictInt = Field(5, ge=1, le=50, description="next-token candidates kept per position")


class Candidate(BaseModel):
    id: int
    token: str
    prob: float = Field(description="after the ablation")
    prob_before: float = Field(description="the model's own probability of this token")


class AblatedNext(BaseModel):
    id: int
    token: str
    prob_before: float
    prob_after: float


class AblatedPosition(BaseModel):
    position: int
    kl: float = Field(description="KL(original || ablated) of the next-token distribution, nats")
    top: list[Candidate] = Field(description="the ablated distribution's most likely tokens")
    actual_next: AblatedNext | None = Field(description="the prompt's next token; null at the last position")


class AblateOut(BaseModel):
    # an example: Swagger UI samples a tuple's prefixItems as nulls
    heads: list[tuple[int, int]] = Field(description="the [layer, head] pairs ablated", examples=[[[4, 0]]])
    mode: Mode
    positions: list[AblatedPosition]


class ScanRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [{"position": 1, "mode": "zero"}]})

    position: Index = Field(description="a position of the run: 0 .. n-1 (422 otherwise)", examples=[1])
    token: Index | None = Field(None, description=(
        "vocabulary id whose log-probability is watched (below the model's vocabulary size: 422 otherwise); "
        "default: the prompt's next token, or the top prediction at the last position"))
    mode: Mode = "zero"


class ScanOut(BaseModel):
    position: int
    token: TokenRef
    mode: Mode
    logprob: float = Field(description="ln p(token) at position without any ablation")
    effects: list[list[float]] = Field(description="[layer][head] change of ln p(token) when that head alone "
                                                   "is ablated (negative: the head helped)")
    mlp: list[float] = Field(description="[layer] the same for each MLP")
    forwards: int = Field(description="batched forwards the scan ran")


# the explorer's default pair (static/js/tools/patching.js): copying that the bundled model does
PATCH_EXAMPLE: dict[str, JsonValue] = {"clean": "My friend John lives in the city. My friend John lives in the",
                 "corrupted": "My friend John lives in the country. My friend John lives in the",
                 "answer": " city", "wrong": " country"}


class PatchRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [PATCH_EXAMPLE]})

    model: str | None = Field(None, description="a configured model name; default if omitted")
    clean: str = Field(description="the prompt whose activations are copied", examples=[PATCH_EXAMPLE["clean"]])
    corrupted: str = Field(description="the prompt they are copied into: same token count",
                           examples=[PATCH_EXAMPLE["corrupted"]])
    answer: str = Field(description="one token, the clean prompt's answer (mind the leading space)",
                        examples=[PATCH_EXAMPLE["answer"]])
    wrong: str = Field(description="one token, the corrupted prompt's answer", examples=[PATCH_EXAMPLE["wrong"]])
    position: Index | None = Field(None, description="where the metric is read: 0 .. n-1; default: the last")

    _check_clean = field_validator("clean", "corrupted")(_text_not_blank)

    @field_validator("answer", "wrong")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("must be one token, not empty")
        return value


class PromptOut(BaseModel):
    text: str
    tokens: list[TokenOut]
    metric: float = Field(description="logit(answer) - logit(wrong) at position")


class PatchExampleOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: str
    clean: str
    corrupted: str
    answer: str
    wrong: str
    clean_metric: float = Field(description="logit(answer) - logit(wrong) at the last position, clean prompt")
    corrupted_metric: float
    separated: bool = Field(description="clean > 0 and clean - corrupted >= 0.5: the pair suits this model "
                                        "(else it is the best of the pairs tried)")
    forwards: int = Field(description="patched rows patching this pair runs")
    tflop: float
    seconds: float = Field(description="how long patching it should take here, from the probe forward's speed")


class PatchOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model: str
    clean: PromptOut
    corrupted: PromptOut
    answer: TokenRef
    wrong: TokenRef
    position: int
    first_difference: int = Field(description="first position where the prompts' tokens differ")
    resid: list[list[float]] = Field(description=(
        "[stage][position], L + 1 stages: stage 0 the embeddings (blocks.0.hook_resid_pre), stage i the "
        "output of block i - 1; each value (patched - corrupted) / (clean - corrupted)"))
    attn_out: list[list[float]] = Field(description="[layer][position] patching the attention sublayer's output")
    mlp_out: list[list[float]] = Field(description="[layer][position] patching the MLP's output")
    heads: list[list[float]] = Field(description="[layer][head] patching one head's output at every position")
    forwards: int = Field(description="batched forwards the patches ran")
