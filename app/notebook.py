"""The explorer in a notebook: an anywidget whose frame runs the web app's own page, its ``/api``
requests carried over the widget's comm (custom messages, bodies as binary buffers) and answered in
the kernel by the same routes and services as the web app, on the model object the notebook holds.
No port is opened, so it works on remote kernels (JupyterHub, Colab, VS Code).

``attnscope.show(model, tokenizer, text)``, ``scope.show(text)`` and ``attnscope.show(run)`` make one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlencode

import anywidget
import traitlets

from attnscope.app import inprocess
from attnscope.app.embed import explorer_document, transport_script
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.services.scope import Scope

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parents[1] / "static"
EMBED_CSS = "header.top nav{display:none} body{margin:0}"  # no links to the server's other pages


class Bridge:
    """The HTTP door's app, called in-process (ASGI, no socket) on one event loop in its own thread.

    Requests run concurrently, as on the server (a thumbnail waits on no heatmap); the Scope's model is
    borrowed while at least one is in flight and given back as soon as none is, so the notebook's own
    code finds its model as it left it between the widget's bursts of requests."""

    def __init__(self, scope: Scope) -> None:
        name = scope.model.info.name
        self.scope = scope
        self.app = create_app(Settings(models={}, default_model=name), scope.engine)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0  # requests in flight (on the loop's thread only)
        self._borrow: ExitStack | None = None
        self._pending = 0  # submitted and not yet answered (any thread, under _idle)
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="attnscope-widget", daemon=True)
        self._thread.start()

    def submit(self, request: dict[str, Any], body: bytes, reply: Any) -> None:
        """Answer ``request`` ({id, method, url, headers}) by calling ``reply(content, buffers)`` as the
        response starts, for each chunk of its body, and when it is done."""
        with self._idle:
            self._pending += 1
        try:
            self._loop.call_soon_threadsafe(self._start, request, body, reply)
        except RuntimeError:  # closed: nobody will answer
            self._done()

    def close(self) -> None:
        if not self._loop.is_closed():
            with suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)

    def wait(self) -> None:
        """Until every request submitted so far is answered and the model given back."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._stop.wait())
            for task in list(self._tasks):  # closed mid-request: the frame is gone; give the model back
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        finally:
            self._loop.close()

    def _start(self, request: dict[str, Any], body: bytes, reply: Any) -> None:
        task = self._loop.create_task(self._answer(request, body, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    async def _answer(self, request: dict[str, Any], body: bytes, reply: Any) -> None:
        try:
            if self._active == 0:  # the first request in flight borrows the model
                stack = ExitStack()
                stack.enter_context(self.scope.borrowed())
                self._borrow = stack
            self._active += 1
            try:
                await self.call(request, body, reply)
            finally:
                self._active -= 1
                if self._active == 0 and self._borrow is not None:  # the last one gives it back
                    self._borrow.close()
                    self._borrow = None
        except Exception:  # the frame must hear back, whatever failed
            log.exception("the widget's request %s %s failed", request.get("method"), request.get("url"))
            reply({"type": "response", "id": request["id"], "start": True, "status": 500,
                   "headers": {"content-type": "application/json"}, "done": True},
                  [b'{"code":"internal_error","message":"the kernel failed to answer: see its log","params":{}}'])
        finally:
            self._done()

    async def call(self, request: dict[str, Any], body: bytes, reply: Any) -> None:
        ident = request["id"]

        def forward(start: tuple[int, dict[str, str]] | None, chunk: bytes, more: bool) -> None:
            content: dict[str, Any] = {"type": "response", "id": ident, "done": not more}
            if start is not None:  # the first body message carries the status and headers too
                content.update(start=True, status=start[0], headers=start[1])
            reply(content, [chunk] if chunk else [])

        sent = [(str(k), str(v)) for k, v in dict(request.get("headers") or {}).items()]
        await inprocess.call(self.app, str(request.get("method") or "GET"), str(request["url"]), forward,
                             body=body, headers=sent)


class Explorer(anywidget.AnyWidget):
    """The explorer on a Scope's model, in the output cell.

    The page (5 MB with plotly.js) is sent when a view asks for it, as a binary message, not as a
    synced trait: a saved notebook keeps only ``query`` and ``height``. Re-executing a cell closes the
    widget it showed before (its worker thread ends); a kernel restart ends the process, threads and all.
    """

    _esm = STATIC / "js" / "widget.js"
    query = traitlets.Unicode("").tag(sync=True)  # the page's search string: ?lang=..&text=..
    height = traitlets.Int(780).tag(sync=True)
    _shown: ClassVar[dict[str, weakref.ref[Explorer]]] = {}  # cell id -> the widget it showed last
    _shown_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, scope: Scope, *, text: str | None = None, lang: str = "en", height: int = 780) -> None:
        if lang not in ("en", "zh"):
            raise ValueError(f"lang must be 'en' or 'zh', not {lang!r}")
        query = "?" + urlencode({"lang": lang, **({"text": text} if text else {})})
        super().__init__(query=query, height=height)
        self.scope = scope
        self._page: tuple[str, bytes] | None = None  # (query, the document for it)
        self._bridge = Bridge(scope)
        self.on_msg(self._on_msg)
        # a dropped widget's worker thread ends with it (and at exit)
        self._finalizer = weakref.finalize(self, self._bridge.close)
        self._replace_in_cell()

    def _replace_in_cell(self) -> None:
        """Close the widget this cell showed before, if it is re-executed (JupyterLab, VS Code and nbclient
        name the cell in each request's metadata; elsewhere nothing is replaced)."""
        cell = current_cell()
        if cell is None:
            return
        with Explorer._shown_lock:
            before = Explorer._shown.get(cell)
            Explorer._shown[cell] = weakref.ref(self)
        old = before() if before is not None else None
        if old is not None and old is not self:
            old.close()

    def page(self) -> bytes:
        """The explorer's document for the current query, built once per widget and query."""
        if self._page is None or self._page[0] != self.query:
            document = explorer_document(embed={"search": self.query}, transport=transport_script(),
                                         extra_css=EMBED_CSS)
            self._page = (self.query, document.encode("utf-8"))
        return self._page[1]

    def _on_msg(self, _widget: Any, content: Any, buffers: list[Any]) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "page":
            self.reply({"type": "page"}, [self.page()])
        elif content.get("type") == "request":
            body = bytes(buffers[0]) if buffers else b""
            self._bridge.submit(content, body, self.reply)

    def reply(self, content: dict[str, Any], buffers: list[bytes]) -> None:
        self.send(content, buffers)

    def close(self) -> None:
        self._bridge.close()
        super().close()


def current_cell() -> str | None:
    """The id of the notebook cell being executed, from the request's metadata (None outside a kernel)."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        parent = kernel.get_parent() if kernel is not None else None
    except Exception:  # noqa: BLE001 - no IPython, or an old kernel: nothing to replace
        return None
    cell = (parent or {}).get("metadata", {}).get("cellId")
    return str(cell) if cell else None
