"""A real uvicorn server on loopback, in a thread, for tests that need sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

if TYPE_CHECKING:
    from attnscope.model.services.engine import Engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve_engine(engine: Engine, **settings: Any) -> Iterator[str]:
    """The app on ``engine`` (its default model; ``settings`` beside it) served on loopback; the engine is
    closed when the server stops."""
    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings

    try:
        with serve(create_app(Settings(models={}, default_model=engine.default, **settings), engine)) as url:
            yield url
    finally:
        engine.close()
