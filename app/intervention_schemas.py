"""Request and response shapes of the causal tools: attribution, ablation, patching (data only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.schemas import Strict, TokenOut, _text_not_blank

INT32 = 2**31


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
    heads: list[tuple[int, int]] = Field(
        max_length=8192, description="[layer, head] pairs to ablate; an empty list changes nothing",
        examples=[[[1, 3], [2, 0]]])
    mode: Mode = Field("zero", description="zero: the head's output becomes 0; mean: its mean output over the "
                                           "run's positions")
    top_k: int = Field(5, ge=1, le=50, description="next-token candidates kept per position")


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
    heads: list[tuple[int, int]]
    mode: Mode
    positions: list[AblatedPosition]


class ScanRequest(Strict):
    position: int = Field(ge=-INT32, le=INT32)
    token: int | None = Field(None, ge=-INT32, le=INT32, description=(
        "vocabulary id whose log-probability is watched; default: the prompt's next token, or the top "
        "prediction at the last position"))
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


class PatchRequest(Strict):
    model: str | None = Field(None, description="a configured model name; default if omitted")
    clean: str = Field(description="the prompt whose activations are copied",
                       examples=["When Mary and John went to the store, John gave a drink to"])
    corrupted: str = Field(description="the prompt they are copied into: same token count",
                           examples=["When Mary and John went to the store, Mary gave a drink to"])
    answer: str = Field(description="one token, the clean prompt's answer (mind the leading space)",
                        examples=[" Mary"])
    wrong: str = Field(description="one token, the corrupted prompt's answer", examples=[" John"])
    position: int | None = Field(None, ge=-INT32, le=INT32, description="where the metric is read; default: last")

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
