"""Map engine errors and validation failures to JSON errors a person can read."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnscope.app.middleware import BodyTooLarge
from attnscope.app.schemas import ErrorOut
from attnscope.model.errors import (
    AttentionUnavailable,
    BadInput,
    EngineError,
    ModelLoadError,
    RunNotFound,
    TooLarge,
    UnknownModel,
)

# the error responses every API route may give, for OpenAPI (a route adds its own)
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 422: {"model": ErrorOut}}

log = logging.getLogger(__name__)

STATUS: dict[type[EngineError], int] = {
    UnknownModel: 404,
    RunNotFound: 404,
    BadInput: 422,
    AttentionUnavailable: 422,
    ModelLoadError: 503,
    TooLarge: 413,
}


class Busy(Exception):
    """Too many requests are already waiting for this model."""

    def __init__(self, model: str, retry_after: int = 1) -> None:
        self.retry_after = retry_after
        super().__init__(f"model {model!r} is busy: too many requests are waiting; retry in {retry_after} s")


def error_body(detail: object, message: str) -> dict[str, object]:
    return {"detail": detail, "message": message}


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
        status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 400)
        return JSONResponse(error_body(str(exc), str(exc)), status_code=status)

    @app.exception_handler(Busy)
    async def busy(_request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse(error_body(str(exc), str(exc)), status_code=503,
                            headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        full = list(exc.errors())
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in full]
        message = "; ".join(_describe(e) for e in full) or "invalid request"
        return JSONResponse(error_body(errors, message), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        unreadable = _unreadable_body(exc.__cause__)
        if unreadable is not None:  # FastAPI's "There was an error parsing the body", said precisely
            status, message = unreadable
            return JSONResponse(error_body(message, message), status_code=status)
        return JSONResponse(error_body(exc.detail, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


def _unreadable_body(cause: BaseException | None) -> tuple[int, str] | None:
    """Why a request body could not be read, when FastAPI's body parsing failed on it."""
    if isinstance(cause, BodyTooLarge):  # a chunked body (no Content-Length) streamed past the limit
        return 413, str(cause)
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start:cause.start + 1].hex()
        return 400, (f"the request body is not valid UTF-8 (byte 0x{byte} at offset {cause.start}): send JSON "
                     "encoded as UTF-8")
    if isinstance(cause, RecursionError):
        return 400, ("the request body's JSON is nested too deeply to read (arrays or objects inside each "
                     "other hundreds of levels deep); no request of this API needs more than a few levels")
    return None
