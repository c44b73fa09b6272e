"""Map engine errors and validation failures to JSON errors a person can read, each with its stable
``code`` and ``params`` (app/error_codes.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnscope.app.error_codes import ErrorCode, ErrorOut, error_body
from attnscope.app.middleware import BodyTooLarge
from attnscope.model.errors import (
    AttentionUnavailable,
    BadInput,
    EngineError,
    ImportBusy,
    ModelLoadError,
    Param,
    RunComing,
    RunDetached,
    RunNotFound,
    SurveyNotFound,
    TooLarge,
    UnknownModel,
)

__all__ = ["ERRORS", "STATUS", "Busy", "ErrorOut", "error_body", "install"]

# the error responses every API route may give, for OpenAPI (a route adds its own)
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}}

log = logging.getLogger(__name__)

STATUS: dict[type[EngineError], int] = {
    UnknownModel: 404,
    RunNotFound: 404,
    SurveyNotFound: 404,
    RunDetached: 409,
    RunComing: 503,
    ImportBusy: 503,
    BadInput: 422,
    AttentionUnavailable: 422,
    ModelLoadError: 503,
    TooLarge: 413,
}


class Busy(Exception):
    """Too many requests are already waiting for this model."""

    def __init__(self, model: str, retry_after: int = 1) -> None:
        self.model = model
        self.retry_after = retry_after
        super().__init__(f"model {model!r} is busy: too many requests are waiting; retry in {retry_after} s")


def _path(loc: list[Any]) -> str:
    """A location as a person writes it: ``heads[0][1]``, ``text``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


NUMBER_TYPES = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false"}


def _wrong_json_type(kind: str, value: object) -> str | None:
    """Strict request fields: say what came instead of a JSON number (or boolean)."""
    if kind not in NUMBER_TYPES or not isinstance(value, (bool, str)):
        return None
    sent = f"the string {json.dumps(value[:40])}" if isinstance(value, str) else json.dumps(value)
    unquoted = " (without quotes)" if isinstance(value, str) and kind != "bool_type" else ""
    return f"must be {NUMBER_TYPES[kind]}{unquoted}, not {sent}"


def _field(error: dict[str, Any]) -> str:
    """Where a validation error is: ``heads[0][1]``, a query parameter by name, ``body`` for the whole body."""
    return _path([p for p in error.get("loc", ()) if p not in ("body", "query", "path")]) or "body"


def _code(errors: list[dict[str, Any]]) -> ErrorCode:
    """A validator's own code (a ``PydanticCustomError`` whose type is one of ours, such as ``empty``) when it
    is the only error; else ``invalid_request``."""
    kinds = {str(e.get("type", "")) for e in errors}
    return "empty" if kinds == {"empty"} else "invalid_request"


def _describe(error: dict[str, Any]) -> str:
    """One validation error in words a person reads: where (``heads[0][1]``, query parameters by name) and what."""
    loc = [p for p in error.get("loc", ()) if p not in ("body", "query", "path")]
    kind = str(error.get("type", ""))
    in_body = tuple(error.get("loc", ()))[:1] == ("body",)
    wrong = _wrong_json_type(kind, error.get("input")) if in_body else None
    if wrong is not None:
        return f"{_path(loc) or 'body'}: {wrong}"
    if kind == "json_invalid":
        at = f" (at character {loc[-1]})" if loc and isinstance(loc[-1], int) else ""
        return f"the request body is not valid JSON{at}"
    if not loc and kind in ("model_attributes_type", "dict_type"):
        return "the request body must be a JSON object, sent with Content-Type: application/json"
    where = _path(loc) or "body"
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if kind == "missing" and loc and isinstance(loc[-1], int):
        return f"{_path(loc[:-1])} is too short: item {loc[-1]} is missing"
    if kind == "missing":
        msg = "this field is required"
    first = msg.split(" ", 1)[0]
    if loc and first == str(loc[-1]):  # "text: text is empty" -> "text is empty"
        return msg
    return f"{where}: {msg}"


def install(app: FastAPI) -> None:
    @app.exception_handler(EngineError)
    async def engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RunComing | ImportBusy) else None
        return JSONResponse(error_body(exc.code, str(exc), exc.params), status_code=status_of(exc), headers=headers)

    @app.exception_handler(Busy)
    async def busy(_request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse(error_body("busy", str(exc), {"model": exc.model, "retry_after": exc.retry_after}),
                            status_code=503, headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        full = list(exc.errors())
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in full]
        problems = [_describe(e) for e in full]
        message = "; ".join(problems) or "invalid request"
        first = full[0] if full else {}
        params: dict[str, Param] = {"field": _field(first), "problem": problems[0] if problems else "invalid request",
                  "type": str(first.get("type", "")), "count": len(full)}
        return JSONResponse(error_body(_code(full), message, params, errors), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        unreadable = _unreadable_body(exc.__cause__)
        if unreadable is not None:  # FastAPI's "There was an error parsing the body", said precisely
            status, code, message, params = unreadable
            return JSONResponse(error_body(code, message, params), status_code=status)
        code, params = _http_code(exc.status_code, request)
        return JSONResponse(error_body(code, str(exc.detail), params, exc.detail), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(_request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback after this answer (its ServerErrorMiddleware re-raises)
        return JSONResponse(error_body("internal_error", "internal server error: the server's log says what failed",
                                       {"error": type(exc).__name__}), status_code=500)


def status_of(exc: EngineError) -> int:
    """The HTTP status of an engine error (the generate stream names it in its ``error`` event too)."""
    return next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 400)


def _http_code(status: int, request: Request) -> tuple[ErrorCode, dict[str, Param]]:
    if status == 404:
        return "not_found", {"path": request.url.path[:200]}
    if status == 405:
        return "method_not_allowed", {"method": request.method, "path": request.url.path[:200]}
    return "http_error", {"status": status}


def _unreadable_body(cause: BaseException | None) -> tuple[int, ErrorCode, str, dict[str, Param]] | None:
    """Why a request body could not be read, when FastAPI's body parsing failed on it."""
    if isinstance(cause, BodyTooLarge):  # a chunked body (no Content-Length) streamed past the limit
        return 413, "body_too_large", str(cause), {"max_bytes": cause.max_bytes}
    if isinstance(cause, UnicodeDecodeError):
        byte = bytes(cause.object[cause.start:cause.start + 1]).hex()
        return 400, "body_not_utf8", (f"the request body is not valid UTF-8 (byte 0x{byte} at offset {cause.start}): "
                                      "send JSON encoded as UTF-8"), {"byte": f"0x{byte}", "offset": cause.start}
    if isinstance(cause, RecursionError):
        return 400, "json_too_deep", ("the request body's JSON is nested too deeply to read (arrays or objects "
                                      "inside each other hundreds of levels deep); no request of this API needs "
                                      "more than a few levels"), {}
    return None
