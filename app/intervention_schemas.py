"""Request shapes of the causal tools: ablation, patching (data only). Their answers are the tools' own
result types (``model.tools``), declared once."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, StrictInt, field_validator

from attnscope.app.schemas import Strict, _text_not_blank

INT32 = 2**31
# a layer, head, position or vocabulary id: a JSON integer (never true/false or "3"). The schema states its
# minimum, 0; a negative one is refused (422) by the route, whose message names the valid range (positions
# 0..n-1 of this run, this model's layers and heads, its vocabulary), where pydantic could only say ">= 0"
Index = Annotated[StrictInt, Field(le=INT32 - 1, json_schema_extra={"minimum": 0})]


Mode = Literal["zero", "mean"]


class AblateRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [{"heads": [[4, 0]], "mode": "zero", "top_k": 5}]})

    heads: list[tuple[Index, Index]] = Field(
        max_length=8192, description="[layer, head] pairs to ablate (within the run's model: 422 otherwise); an "
                                     "empty list changes nothing", examples=[[[4, 0]]])
    mode: Mode = Field("zero", description="zero: the head's output becomes 0; mean: its mean output over the "
                                           "run's positions")
    top_k: StrictInt = Field(5, ge=1, le=50, description="next-token candidates kept per position")


class ScanRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [{"position": 1, "mode": "zero"}]})

    position: Index = Field(description="a position of the run: 0 .. n-1 (422 otherwise)", examples=[1])
    token: Index | None = Field(None, description=(
        "vocabulary id whose log-probability is watched (below the model's vocabulary size: 422 otherwise); "
        "default: the prompt's next token, or the top prediction at the last position"))
    mode: Mode = "zero"


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
