"""Errors the engine raises; ``app/errors.py`` maps each to an HTTP status.

Every error carries a stable ``code`` (a short snake_case string a client can branch on and
translate, ``err.<code>`` in the browser's catalogues) and the ``params`` that render it in
another language; ``message`` is the English sentence, written for a person and safe to show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal, get_args

# A parameter's value: what JSON carries as it is.
Param = str | int | float | bool | None | Sequence[str | int]

EngineCode = Literal[
    # class defaults: an error raised with no code of its own
    "engine_error", "bad_input", "too_large", "attention_unavailable", "model_load_error",
    "unknown_model", "run_not_found", "run_expired",
    # runs kept on disk and run files
    "bad_run_file", "run_over_disk", "run_model_missing", "run_model_changed", "run_being_written",
    "run_file_not_finite", "run_file_text_mismatch", "import_busy",
    # the prompt
    "empty", "chat_template_missing", "chat_template_rejected", "chat_template_empty",
    "too_long", "too_long_at_least", "too_long_at_least_read", "too_long_at_least_length", "too_long_chars",
    # ranges over a model or a run
    "layer_out_of_range", "head_out_of_range", "layer_head_out_of_range", "position_out_of_range",
    "token_out_of_range", "bad_id", "range_invalid", "value_out_of_range", "top_k_too_large",
    "temperature_invalid",
    "no_lm_head", "encoder_no_lm_head", "post_norm_unsupported", "norm_unsupported", "projection_shape",
    "qk_unsupported", "key_not_visible", "survey_not_found",
    # limits on what a request may cost
    "run_too_big", "run_over_cache", "forward_too_big", "forward_busy", "too_many_cells", "export_too_large",
    "timing_long", "timing_over_budget", "max_new_tokens_too_large", "generate_too_long", "watch_needs_record",
    "watch_out_of_range",
    "different_models",
    # the Patch tool
    "patch_space", "patch_one", "patch_lengths", "patch_same_token", "patch_same", "patch_flops", "patch_no_example",
    # loading a model (start-up, and a request for a model not loaded yet)
    "loading", "device_invalid", "device_unavailable", "package_missing", "model_folder_missing",
    "hub_unreachable", "architecture_unsupported",
]
ENGINE_CODES: tuple[EngineCode, ...] = get_args(EngineCode)

# The params each code carries (a raise site may add more): what its translations may name, besides
# the English ``message``. tests/app/test_error_codes.py holds the catalogues and the raise sites to it.
PARAMS: dict[EngineCode, tuple[str, ...]] = {
    "engine_error": (), "bad_input": (), "too_large": (), "attention_unavailable": (), "model_load_error": (),
    "unknown_model": ("model", "available"),
    "run_not_found": ("run_id",), "run_expired": ("run_id",),
    # reason: what is wrong with the file (English); size, cap: formatted ("1,234 MiB")
    "bad_run_file": ("reason",), "run_over_disk": ("size", "cap"), "run_being_written": ("run_id", "retry_after"),
    # tensor: the first tensor holding a NaN or an infinity; reason: how the token spans fail the text
    "run_file_not_finite": ("reason", "tensor"), "run_file_text_mismatch": ("reason",),
    # sizes formatted ("1,234 MiB"): the imports in flight, the bytes this one needs, the budget
    "import_busy": ("in_flight", "need", "budget"),
    "run_model_missing": ("model", "available"), "run_model_changed": ("model",),
    "empty": (),
    "chat_template_missing": ("model",), "chat_template_rejected": ("reason",), "chat_template_empty": (),
    # tokens: the count (or the count so far); limit: the model's token limit; what: "prompt", "clean prompt", ...
    "too_long": ("what", "tokens", "limit"),
    "too_long_at_least": ("what", "tokens", "limit"),
    "too_long_at_least_read": ("what", "tokens", "limit", "read_chars", "total_chars"),
    "too_long_at_least_length": ("what", "tokens", "limit", "total_chars"),
    "too_long_chars": ("what", "chars", "limit"),
    "layer_out_of_range": ("layer", "max"), "head_out_of_range": ("head", "max"),
    "layer_head_out_of_range": ("layer", "head", "max_layer", "max_head"),
    "position_out_of_range": ("position", "max"),
    "token_out_of_range": ("name", "token", "max"), "bad_id": ("token_id", "max"),
    "range_invalid": ("axis", "lo", "hi", "n"),
    # an argument outside its range (name: "top", "count", "repeats", ...): the HTTP door's schemas refuse
    # these before the engine; the Python door meets them here
    "value_out_of_range": ("name", "value", "min", "max"),
    "top_k_too_large": ("top_k", "limit"), "temperature_invalid": (),
    "no_lm_head": ("model",), "encoder_no_lm_head": ("model",), "post_norm_unsupported": ("model",),
    "norm_unsupported": ("norm",), "qk_unsupported": ("model", "reason"),
    "key_not_visible": ("layer", "query", "key"), "survey_not_found": ("id",),
    "projection_shape": ("layer", "inputs", "heads"),
    # sizes are formatted ("1,234 MiB")
    "run_too_big": ("keep", "tokens", "peak", "cap"), "run_over_cache": ("keep", "cap"),
    "forward_too_big": ("need", "limit"), "forward_busy": ("need",),
    "too_many_cells": ("cells", "limit"), "export_too_large": ("cells", "limit"),
    "timing_long": ("tokens", "max"), "timing_over_budget": ("seconds", "budget", "forwards", "tokens", "repeats"),
    "max_new_tokens_too_large": ("max_new_tokens", "limit"),
    "generate_too_long": ("tokens", "max_new_tokens", "limit"),
    "watch_needs_record": (), "watch_out_of_range": ("max_layer", "max_head"),
    "different_models": (),
    # field: "answer" or "wrong"; pieces: the text's tokens
    "patch_space": ("field", "text", "tokens", "pieces"), "patch_one": ("field", "text", "tokens", "pieces"),
    "patch_lengths": ("clean", "corrupted"), "patch_same_token": ("answer",),
    "patch_same": ("clean", "corrupted"), "patch_flops": ("forwards", "tokens", "tflop", "limit"),
    "patch_no_example": ("model",),
    "loading": (), "device_invalid": ("device",), "device_unavailable": ("device",),
    "package_missing": ("package",), "model_folder_missing": ("model", "folder"),
    "hub_unreachable": ("model", "source"), "architecture_unsupported": ("model", "reason"),
}


class EngineError(Exception):
    """Base class: the message is written for a person and is safe to show; ``code`` and ``params``
    say the same for a program (and for a page that shows it in another language)."""

    default_code: ClassVar[EngineCode] = "engine_error"

    def __init__(self, message: str, *, code: EngineCode | None = None,
                 params: Mapping[str, Param] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code: EngineCode = code or self.default_code
        self.params: dict[str, Param] = dict(params or {})


class UnknownModel(EngineError):
    default_code = "unknown_model"

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"unknown model {name!r}; configured models: {', '.join(available)}",
                         params={"model": name, "available": list(available)})


class RunComing(EngineError):
    """A run another worker answered a moment ago, whose file it is still writing: 503, retry shortly."""

    default_code = "run_being_written"
    retry_after = 1

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} is still being written by another worker; retry in {self.retry_after} s",
                         params={"run_id": run_id, "retry_after": self.retry_after})


class ImportBusy(EngineError):
    """Run files being opened at once would hold more than the memory budget: 503, retry shortly."""

    default_code = "import_busy"
    retry_after = 2

    def __init__(self, in_flight: str, need: str, budget: str) -> None:
        super().__init__(f"other run files (and forwards) being opened hold {in_flight} now; this one needs {need} "
                         f"and the memory budget is {budget} (ATTNSCOPE_FORWARD_BYTES): retry in {self.retry_after} s",
                         params={"in_flight": in_flight, "need": need, "budget": budget})


class SurveyNotFound(EngineError):
    default_code = "survey_not_found"

    def __init__(self, survey_id: str) -> None:
        super().__init__(f"unknown survey {survey_id!r} (the server keeps a few, and none across restarts)",
                         params={"id": survey_id})


class RunNotFound(EngineError):
    default_code = "run_not_found"

    def __init__(self, run_id: str, expired: bool) -> None:
        self.expired = expired
        super().__init__("run expired, analyse again" if expired else f"unknown run {run_id!r}",
                         code="run_expired" if expired else "run_not_found", params={"run_id": run_id})


class BadInput(EngineError):
    """The request is well-formed but asks for something this model or run cannot give."""

    default_code = "bad_input"


class BadRunFile(BadInput):
    """A run file that is not a complete attnscope run (truncated, another format, inconsistent): 422."""

    def __init__(self, reason: str, *, code: EngineCode = "bad_run_file", params: Mapping[str, Param] | None = None
                 ) -> None:
        super().__init__(f"not a usable attnscope run file: {reason}", code=code,
                         params={"reason": reason, **(params or {})})


class RunDetached(EngineError):
    """A stored run whose model is not here as it was (not loaded, or its weights changed): its attention
    is shown from what it keeps, but a tool that runs the model refuses (409)."""

    default_code = "run_model_missing"


class AttentionUnavailable(EngineError):
    """The model's attention implementation does not return weights."""

    default_code = "attention_unavailable"


class ModelLoadError(EngineError):
    """A configured model could not be loaded."""

    default_code = "model_load_error"


class TooLarge(EngineError):
    """What a request would keep or need is more than this server allows (413)."""

    default_code = "too_large"


class Cancelled(Exception):
    """The patching was asked to stop (its client went away) between two batched forwards."""
