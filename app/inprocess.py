"""One request to the HTTP door's ASGI app in-process (no socket, no port): the notebook widget's bridge
streams each answer to its frame; the standalone HTML builder keeps the answers it records."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import unquote

# the answer's status and headers (on its first body chunk only, else None), a chunk, whether more follows
OnBody = Callable[[tuple[int, dict[str, str]] | None, bytes, bool], None]


async def call(app: Any, method: str, url: str, on_body: OnBody, *, body: bytes = b"",
               headers: Iterable[tuple[str, str]] = ()) -> None:
    """``method url`` with ``body`` and ``headers`` (any Host is replaced: the app is asked as localhost),
    each body chunk of the answer handed to ``on_body`` as the app sends it."""
    path, _, query = url.partition("?")
    sent = [(b"host", b"localhost")] + [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                        for k, v in headers if k.lower() != "host"]
    if body:
        sent.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": unquote(path), "raw_path": path.encode("latin-1"),
             "query_string": query.encode("latin-1"), "root_path": "", "headers": sent,
             "client": ("127.0.0.1", 0), "server": ("localhost", 80)}
    read = False
    start: list[tuple[int, dict[str, str]]] = []  # until the first body chunk carries it

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the caller never disconnects mid-request
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.append((int(message["status"]),
                          {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message["headers"]}))
        elif message["type"] == "http.response.body":
            on_body(start.pop() if start else None, bytes(message.get("body", b"")),
                    bool(message.get("more_body", False)))

    await app(scope, receive, send)
