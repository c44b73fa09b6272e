"""ASGI middleware: allowed Host names, request-body size limit and charset, security headers."""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Iterable, Mapping

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attnscope.app.error_codes import ErrorCode, error_body
from attnscope.model.errors import Param

CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    # plotly sets style attributes at run time; no inline *scripts* are allowed
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "font-src 'self' data:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]



def watched(receive: Receive, check: Callable[[bytes, int], None]) -> Receive:
    """``receive`` that shows ``check`` each chunk of the body and the bytes before it (it raises to stop
    the request)."""
    seen = 0

    async def receive_checked() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            body: bytes = message.get("body", b"")
            check(body, seen)
            seen += len(body)
        return message

    return receive_checked
class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k, v) for k, v in SECURITY_HEADERS if k not in names
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def send_error(send: Send, status: int, code: ErrorCode, message: str,
                     params: Mapping[str, Param] | None = None) -> None:
    """A JSON error in the shape every other error has (``{"code", "message", "params", "detail"}``)."""
    body = json.dumps(error_body(code, message, params)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")


def host_name(header: str) -> str:
    """The name of a Host header, without its port, lower case: ``[::1]:8000`` -> ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    name, colon, port = header.rpartition(":")
    return name if colon and port.isdigit() else header


class AllowedHosts:
    """Answer 400 unless the Host header names this server: loopback names, the address it is bound
    to, and the configured ones (``*`` allows any, ``*.example.org`` any subdomain). A page that
    rebinds its own DNS name to 127.0.0.1 sends its own name as Host, and is refused (DNS rebinding)."""

    def __init__(self, app: ASGIApp, bound: str, allowed: Iterable[str]) -> None:
        self.app = app
        names = [name.strip().lower() for name in allowed if name.strip()]
        self.any = "*" in names
        bound = bound.strip().lower()
        if bound not in WILDCARD_BINDS:
            names.append(f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound)
        self.exact = set(LOOPBACK_HOSTS) | {n for n in names if not n.startswith("*.")}
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))  # ".example.org"

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        name = host_name(header or "")
        return name in self.exact or (bool(name) and name.endswith(self.suffixes) and bool(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"host")
        if self.allows(header):
            await self.app(scope, receive, send)
            return
        shown = "no Host header" if header is None else f"the Host header {header[:200]!r}"
        await send_error(send, 400, "host_not_allowed",
                         f"this server does not answer to {shown}: it answers to {', '.join(sorted(self.exact))}; "
                         "to reach it by another name, add that name to ATTNSCOPE_ALLOWED_HOSTS",
                         {"host": None if header is None else header[:200], "allowed": sorted(self.exact)})


MAX_URL_BYTES = 256 << 10  # a request's path and query string at most (uvicorn reads up to H11_MAX_EVENT)
H11_MAX_EVENT = 1 << 20  # uvicorn's h11 limit on a request line and headers: past it only uvicorn can answer


class UrlLimit:
    """Answer 414 in the JSON every error has (and with the security headers, which wrap it) for a request
    line whose path and query are longer than MAX_URL_BYTES: no route takes one, and uvicorn reads up to
    H11_MAX_EVENT before it would answer with its own plain-text 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or scope.get("path", "").encode()) + len(scope.get("query_string", b""))
            if size > MAX_URL_BYTES:
                await send_error(send, 414, "uri_too_long", f"the request's address is {size:,} bytes; this server "
                                 f"reads at most {MAX_URL_BYTES:,} (send a long text in a POST body instead)",
                                 {"bytes": size, "max_bytes": MAX_URL_BYTES})
                return
        await self.app(scope, receive, send)


def _json_type(content_type: str | None) -> bool:
    if not content_type:
        return True  # FastAPI reads an undeclared body as JSON
    parsed = email.message.Message()
    parsed["content-type"] = content_type
    subtype = parsed.get_content_subtype()
    return parsed.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class Utf8Json:
    """Answer 415 for a JSON body declared in a charset other than UTF-8: JSON is UTF-8 (RFC 8259), and a
    Latin-1 body read as UTF-8 would be mangled or refused with a vaguer message. A body sent as UTF-16 or
    UTF-32 without saying so (json.loads would guess it from its BOM or its NUL bytes, which no UTF-8 JSON
    text holds) is refused as not UTF-8 (400 body_not_utf8), as it streams in."""

    BINARY = frozenset({"/api/runs/import", "/api/surveys", "/api/surveys/open"})  # bodies of bytes (files), never JSON

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = _header(scope, b"content-type") if scope["type"] == "http" else None
        sniff = scope["type"] == "http" and _json_type(content_type) and scope.get("path") not in self.BINARY
        if sniff:
            def utf8_only(body: bytes, seen: int) -> None:
                at = 0 if seen == 0 and body[:2] in (b"\xff\xfe", b"\xfe\xff") else body.find(b"\x00")
                if at >= 0:
                    raise UnicodeDecodeError("utf-8", body, at, at + 1, "a UTF-16 or UTF-32 body, not UTF-8")

            receive = watched(receive, utf8_only)
        if content_type:
            parsed = email.message.Message()
            parsed["content-type"] = content_type
            charset = parsed.get_param("charset")
            subtype = parsed.get_content_subtype()
            if (parsed.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))
                    and isinstance(charset, str) and charset.strip().lower() not in ("utf-8", "utf8")):
                await send_error(send, 415, "unsupported_media_type",
                                 f"the request body is declared as charset={charset[:40]}; send JSON encoded as "
                                 "UTF-8 (Content-Type: application/json, or with charset=utf-8)",
                                 {"charset": charset[:40]})
                return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except UnicodeDecodeError as err:  # read outside FastAPI's body parsing (which answers 400 itself)
            if not sniff or started:
                raise
            byte = bytes(err.object[err.start:err.start + 1]).hex()
            await send_error(send, 400, "body_not_utf8", f"the request body is not valid UTF-8 (byte 0x{byte} at "
                             f"offset {err.start}): send JSON encoded as UTF-8", {"byte": f"0x{byte}",
                                                                                   "offset": err.start})


class BodyTooLarge(Exception):
    """Raised from ``receive`` when a body streams past the limit; the error handlers answer 413 with it."""

    def __init__(self, max_bytes: int, setting: str = "ATTNSCOPE_MAX_BODY_BYTES") -> None:
        self.max_bytes = max_bytes
        super().__init__(f"request body is larger than the limit of {max_bytes:,} bytes ({setting})")


class BodyLimit:
    """Answer 413 for bodies over ``max_bytes``, by Content-Length or as they stream in (chunked, no
    Content-Length): the same answer either way. ``paths``: a path with its own limit and the setting
    that names it (a run file's import)."""

    def __init__(self, app: ASGIApp, max_bytes: int, paths: dict[str, tuple[int, str]] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.paths = paths or {}

    async def _reject(self, send: Send, limit: int, setting: str) -> None:
        await send_error(send, 413, "body_too_large", str(BodyTooLarge(limit, setting)), {"max_bytes": limit})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self.paths.get(scope.get("path", ""), (self.max_bytes, "ATTNSCOPE_MAX_BODY_BYTES"))
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._reject(send, limit, setting)
                    return
        started = False

        def within(body: bytes, seen: int) -> None:
            if seen + len(body) > limit:
                raise BodyTooLarge(limit, setting)

        limited_receive = watched(receive, within)

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:  # read outside FastAPI's body parsing (which turns it into this 413 itself)
            if not started:
                await self._reject(send, limit, setting)


class Cors(CORSMiddleware):
    """Starlette's CORS, its refused preflight (plain text "Disallowed CORS origin") answered in the JSON
    every other error has."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        reason = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        return JSONResponse(error_body("cors_refused", f"this CORS preflight is refused: its {reason} is not "
                                                       "allowed (ATTNSCOPE_CORS_ORIGINS)", {"reason": reason}),
                            status_code=400, headers=headers)
