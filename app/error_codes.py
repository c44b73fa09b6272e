"""The error body every refusal sends: ``{"code", "message", "params", "detail"}``, its OpenAPI schema,
and the list of codes (the engine's, ``model/errors.py``, and the HTTP door's own).

``code`` is stable: a client branches on it and the browser translates by it (``err.<code>`` in
static/i18n/*.js, filled from ``params``); ``message`` is the English sentence for a person;
``detail`` is what it was before codes (the message, or FastAPI's list of validation errors)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from pydantic import BaseModel, Field, JsonValue

from attnscope.model.errors import ENGINE_CODES, EngineCode, Param
from attnscope.model.errors import PARAMS as ENGINE_PARAMS

HttpCode = Literal[
    "invalid_request",  # 422: the body or a query parameter does not fit the schema (params: field, problem)
    "not_found",  # 404: no such route or asset (params: path)
    "method_not_allowed",  # 405 (params: method)
    "http_error",  # any other HTTP refusal of the framework (params: status)
    "body_too_large",  # 413: over ATTNSCOPE_MAX_BODY_BYTES (params: max_bytes)
    "unsupported_media_type",  # 415: JSON declared in a charset other than UTF-8 (params: charset)
    "body_not_utf8",  # 400 (params: byte, offset)
    "uri_too_long",  # 414: a request line longer than the server reads (params: bytes, max_bytes)
    "json_too_deep",  # 400: JSON nested hundreds of levels deep
    "host_not_allowed",  # 400: a Host header this server does not answer to (params: host, allowed)
    "cors_refused",  # 400: a CORS preflight from an origin, method or header not allowed (params: reason)
    "busy",  # 503 with Retry-After (params: model, retry_after)
    "generation_failed",  # the generate stream's error event for an unexpected failure (params: n_new)
    "internal_error",  # 500: a bug; the server's log has the traceback
]
HTTP_CODES: tuple[HttpCode, ...] = get_args(HttpCode)
HTTP_PARAMS: dict[HttpCode, tuple[str, ...]] = {
    "invalid_request": ("field", "problem"), "not_found": ("path",), "method_not_allowed": ("method",),
    "http_error": ("status",), "body_too_large": ("max_bytes",), "unsupported_media_type": ("charset",),
    "body_not_utf8": ("byte", "offset"), "uri_too_long": ("bytes", "max_bytes"), "json_too_deep": (),
    "host_not_allowed": ("host", "allowed"),
    "cors_refused": ("reason",), "busy": ("model", "retry_after"), "generation_failed": ("n_new",),
    "internal_error": (),
}

ErrorCode = Literal[EngineCode, HttpCode]
CODES: tuple[str, ...] = (*ENGINE_CODES, *HTTP_CODES)
# the params each code carries (see model/errors.py's PARAMS)
PARAMS: dict[str, tuple[str, ...]] = {**dict(ENGINE_PARAMS.items()), **dict(HTTP_PARAMS.items())}

CODE_DOC = ("stable and short (snake_case): branch on it, and translate by it with `params`; one of "
            + ", ".join(f"`{c}`" for c in CODES))


class ErrorOut(BaseModel):
    code: ErrorCode = Field(description=CODE_DOC)
    message: str = Field(description="one line for a person, in English")
    params: dict[str, JsonValue] = Field(description="the values the message names (a model, a limit, a count), "
                                                     "to say it in another language")
    detail: str | list[dict[str, JsonValue]] = Field(
        description="the message again, or FastAPI's list of validation errors (kept for older clients)")


def error_body(code: ErrorCode, message: str, params: Mapping[str, Param] | None = None,
               detail: object = None) -> dict[str, object]:
    """The JSON of an error response (``detail`` defaults to the message)."""
    return {"code": code, "message": message, "params": dict(params or {}),
            "detail": message if detail is None else detail}
