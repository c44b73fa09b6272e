"""A request body spooled to a temporary file as it arrives: an upload of any size (a run file's import)
holds at most one buffer in memory, never the whole body. The body limit (``BodyLimit``) still applies:
past it, the stream raises and the file is removed."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from attnscope.model.runs.disk import TMP_PREFIX, host_name

BUFFER = 1 << 20  # bytes gathered before each write (one thread hop per MiB, not per network chunk)


@asynccontextmanager
async def spooled(request: Request, folder: Path | None) -> AsyncIterator[Path]:
    """The body as a file, removed after the ``with``. In ``folder`` (the run directory, named as its own
    temporaries are, so that a crash's leftover is cleared at the next start), else the system's temp."""
    where = folder if folder is not None else Path(tempfile.gettempdir())
    path = where / f"{TMP_PREFIX}{host_name()}.{os.getpid()}.{secrets.token_hex(6)}.import"
    handle = await run_in_threadpool(path.open, "wb")
    try:
        buffer = bytearray()
        async for chunk in request.stream():
            buffer += chunk
            if len(buffer) >= BUFFER:
                await run_in_threadpool(handle.write, buffer)  # the loop waits: the buffer is not touched meanwhile
                del buffer[:]
        if buffer:
            await run_in_threadpool(handle.write, buffer)
        await run_in_threadpool(handle.close)
        yield path
    finally:
        handle.close()
        with contextlib.suppress(OSError):
            path.unlink()
