"""A run as one self-contained HTML file (``GET /api/runs/{id}/export?format=html``, ``run.save_html``):
the explorer's own page and modules, plotly.js and the run's data, opened from ``file://`` with no
network at all.

The page runs unchanged: its ``fetch("/api/…")`` is answered by static/js/embed/offline.js from what
the file holds —

* **recorded answers**: the requests the explorer makes when it opens a run (the model, the run with
  its late head scores, sparsity, each position's next-token distribution; the head grid's thumbnails
  and a long run's overview tile where the cells are not kept), made here to the app itself
  in-process (ASGI, no socket) and stored as they came, keyed by method, path and sorted query;
* **exact cells** of the heads it keeps (float32, as ``format=f32`` gives them), from which the page
  derives what the server would send for them: the head's bytes (``format=bin``: the same bytes) and
  any tile, exact or pooled (thumbnails, a token's focus row, a long run's overview and zooms: the
  server computes tiles from the run's Q and K, so these agree with it within float32 rounding).

Every head's exact cells are kept while they fit ``EXACT_BUDGET`` (a 64-token run of the bundled
model), and for any run of at most ``EXACT_TOKENS`` up to ``EXACT_CAP`` (a 64-token run of a model
with 1,000 heads); above it, every head's thumbnail and the exact cells of the heads asked for
(``heads="4.0,2.3"``, default the first) as far as ``HEADS_CAP`` holds them — a head over it (16k
tokens: 537 MB) keeps its overview tile and the last query's row. A request for a head it does not
keep answers the client-side code ``offline_head``, for anything else it did not save
``offline_file`` (static/i18n: ``err.<code>``). ``dry_run`` (the route) says the size first.

One byte stream holds it all (a JSON manifest, then plotly.js, the stylesheets, the modules and the
data), gzip-compressed — the page inflates it with ``DecompressionStream`` — and written into the
document as single bytes: the file is declared windows-1252, whose decoder maps each byte to one
character, and what an HTML parser would lose or stop at in a script (CR; ``<`` before ``/`` or
``!``) and the escape (``=``) are written as ``=`` and the byte plus 64. That costs about 0.8 % where
base64 costs 33 %.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np

from attnscope.app import inprocess
from attnscope.app.embed import (
    ENTRY,
    PLOTLY_TAG,
    STATIC,
    embed_script,
    inline_script,
    modules,
    page_html,
    plotly_js_path,
)
from attnscope.model.errors import BadInput

log = logging.getLogger(__name__)

THUMB = 64  # static/js/views/headgrid.js's THUMB: a head's thumbnail, at most THUMB x THUMB bins
TILE = 256  # static/js/views/tiled.js's TILE: a long run's overview tile, at most TILE x TILE bins
EXACT_MAX = 256  # static/js/views/tiled.js's EXACT_MAX: longer runs are drawn from tiles
SPARSITY_AUTO_MAX = 2048  # static/js/explorer/analyse.js: the page asks for sparsity up to this length
NEXT_EVERY_MAX = 2048  # next-token distributions at every position up to this length, else the last only
EXACT_BUDGET = 1 << 20  # float32 bytes of exact cells: every head's while they fit (bundled model, 64 tokens: 400 KB)
# a run of at most EXACT_TOKENS keeps every head's exact cells up to EXACT_CAP, whatever the model: a real
# model has hundreds of heads (SmolLM2-135M: 270, 64 tokens 2.2 MB of float32, about 1.3 MB in the file)
EXACT_TOKENS = 64
EXACT_CAP = 8 << 20  # 1,000 heads of 64 tokens
HEADS_CAP = 64 << 20  # float32 bytes of the chosen heads' exact cells, and of their overview tiles, at most
SCORES_WAITS = 5  # a minute each: a long run's late head scores
TOP_K = 10  # the page asks for the top 10 (static/js/explorer/analyse.js, api.js's getNext)
MEDIA_TYPE = "text/html; charset=windows-1252"
KEPT_HEADERS = ("content-type",)  # with every x-attn-* header
# what an HTML parser would lose (CR: CR LF and CR become LF) or stop at in a script ("</", "<!--"), and
# the escape itself; NUL it turns into U+FFFD, which no other byte decodes to: the page maps it back
ESCAPED = re.compile(rb"[\r=]|<(?=[/!])")
EXTRA_CSS = "header.top nav{display:none}"  # the server's other pages are not in the file


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


Call = Callable[[str, str, bytes], Coroutine[Any, Any, Answer]]


def asgi_caller(app: Any) -> Call:
    """``call(method, url, body)``: one request to the ASGI ``app`` in-process, its whole answer."""

    async def call(method: str, url: str, body: bytes = b"") -> Answer:
        start: list[tuple[int, dict[str, str]]] = [(500, {})]
        chunks: list[bytes] = []

        def keep(first: tuple[int, dict[str, str]] | None, chunk: bytes, _more: bool) -> None:
            if first is not None:
                start[0] = first
            chunks.append(chunk)

        await inprocess.call(app, method, url, keep, body=body,
                             headers=[("content-type", "application/json")] if body else [])
        return Answer(start[0][0], start[0][1], b"".join(chunks))

    return call


def canonical(method: str, path: str, params: dict[str, str]) -> str:
    """The key of a request in the file (offline.js builds the same): the page's long-poll ``wait`` dropped."""
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(params.items()) if k != "wait")
    return f"{method} {path}?{query}"


def parse_heads(heads: str, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """``"4.0,2.3"`` -> [(4, 0), (2, 3)], each a head of the run."""
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in heads.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+)\.(\d+)", part)
        if not m or int(m[1]) >= n_layers or int(m[2]) >= n_heads:
            shown = part if len(part) <= 40 else part[:40] + "…"  # an excerpt: never the whole input echoed
            raise BadInput(f"heads: {shown!r} is not LAYER.HEAD of this run (layers 0..{n_layers - 1}, "
                           f"heads 0..{n_heads - 1}), e.g. heads=4.0,2.3")
        if (int(m[1]), int(m[2])) not in out:
            out.append((int(m[1]), int(m[2])))
    if not out:
        raise BadInput("heads: name at least one head as LAYER.HEAD, e.g. heads=4.0,2.3")
    return out


@dataclass(frozen=True)
class Plan:
    """What the file keeps of a run."""

    run_id: str
    n: int
    n_layers: int
    n_heads: int
    causal: bool
    chosen: tuple[tuple[int, int], ...]  # the heads asked for (every head under the budget): it opens on the first
    exact: tuple[tuple[int, int], ...]  # those whose exact cells it keeps: as many as fit HEADS_CAP, in order

    @property
    def every_head(self) -> bool:
        return len(self.exact) == self.n_layers * self.n_heads

    @property
    def overview(self) -> tuple[tuple[int, int], ...]:
        """A long run's chosen heads, whose overview tile the page opens on (derived from the exact
        cells where it keeps them, else recorded with the last query's row)."""
        return self.chosen[: max(1, HEADS_CAP // (4 * TILE * TILE))] if self.n > EXACT_MAX else ()

    @property
    def cells(self) -> int:  # visible cells of one head
        return self.n * (self.n + 1) // 2 if self.causal else self.n * self.n


def plan(run: dict[str, Any], heads: str | None) -> Plan:
    n, layers, per_layer = len(run["tokens"]), int(run["n_layers"]), int(run["n_heads"])
    causal = bool(run["causal"])
    cells = n * (n + 1) // 2 if causal else n * n
    every = 4 * cells * layers * per_layer
    if heads is None and (every <= EXACT_BUDGET or (n <= EXACT_TOKENS and every <= EXACT_CAP)):
        chosen = [(layer, head) for layer in range(layers) for head in range(per_layer)]
    else:
        chosen = parse_heads(heads or "0.0", layers, per_layer)
    exact = chosen[: HEADS_CAP // (4 * cells)]  # a 16k-token head alone is 537 MB: then overviews only
    return Plan(str(run["run_id"]), n, layers, per_layer, causal, tuple(chosen), tuple(exact))


@dataclass
class Payload:
    """The byte stream the page inflates: a 4-byte length, the JSON manifest, then the blobs."""

    manifest: dict[str, Any] = field(default_factory=lambda: {"modules": {}, "responses": {}, "exact": {}})
    blobs: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, data: bytes) -> list[int]:
        where = [self.size, len(data)]
        self.blobs.append(data)
        self.size += len(data)
        return where

    def answer(self, key: str, answer: Answer, status: int | None = None) -> None:
        headers = {k: v for k, v in answer.headers.items() if k in KEPT_HEADERS or k.startswith("x-attn-")}
        shuffled = headers.get("x-attn-encoding", "").startswith("f32")
        body = shuffle(answer.body) if shuffled else answer.body
        self.manifest["responses"][key] = {"status": status or answer.status, "headers": headers,
                                           "body": self.add(body), "shuffled": shuffled}

    def packed(self) -> bytes:
        head = json.dumps(self.manifest, separators=(",", ":")).encode("utf-8")
        return len(head).to_bytes(4, "big") + head + b"".join(self.blobs)


def shuffle(f32: bytes) -> bytes:
    """Float32 bytes as four planes (every first byte, then every second, …): the exponent bytes of
    attention weights then compress well, where interleaved they do not."""
    return np.frombuffer(f32, dtype=np.uint8).reshape(-1, 4).T.tobytes()


class Failed(RuntimeError):
    pass


def _ok(answer: Answer, what: str) -> Answer:
    if answer.status >= 300:
        raise Failed(f"{what} answered {answer.status}: {answer.body[:300]!r}")
    return answer


async def record(call: Call, run_id: str, heads: str | None) -> tuple[Plan, Payload, dict[str, Any]]:
    """Ask the app what the explorer asks when it opens the run; returns the plan, the payload's data
    part and the run's summary."""
    base = f"/api/runs/{quote(run_id, safe='')}"
    payload = Payload()
    for _ in range(SCORES_WAITS):  # the late head scores, all in: the page's own wait would never end
        scores = _ok(await call("GET", f"{base}/heads?wait=60", b""), "the run's heads")
        if scores.status != 202:
            break
    else:
        raise BadInput("the run's head scores are still being computed: save it as HTML once they are in")
    run = json.loads(_ok(await call("GET", base, b""), "the run").body)
    p = plan(run, heads)
    models = json.loads(_ok(await call("GET", "/api/models", b""), "the models").body)
    models["models"] = [{**m, "default": True} for m in models["models"] if m["name"] == run["model"]]
    payload.answer("GET /api/models?", Answer(200, {"content-type": "application/json"},
                                               json.dumps(models, separators=(",", ":")).encode()))
    payload.answer("POST /api/runs?", Answer(201, {"content-type": "application/json"},
                                             json.dumps(run, separators=(",", ":"), ensure_ascii=False).encode()))
    if run["scores_pending"]:  # scores that could not be computed: the page asks, and hears why
        payload.answer(canonical("GET", f"{base}/heads", {}), Answer(200, scores.headers, scores.body))

    async def keep(params: dict[str, str], path: str = "attention") -> None:
        url = f"{base}/{path}?{urlencode(params)}"
        answer = await call("GET", url, b"")
        if answer.status >= 500:
            raise Failed(f"{url} answered {answer.status}: {answer.body[:300]!r}")
        payload.answer(canonical("GET", f"{base}/{path}", params), answer)  # a refusal too, as the server says it

    if p.n <= SPARSITY_AUTO_MAX:
        await keep({}, "sparsity")
    if any(m.get("has_lm_head") for m in models["models"]):  # the page asks an encoder for none
        for pos in range(p.n) if p.n <= NEXT_EVERY_MAX else [p.n - 1]:
            await keep({"position": str(pos), "temperature": "1", "top_k": str(TOP_K)}, "next")
    whole = {"q0": "0", "q1": str(p.n), "k0": "0", "k1": str(p.n), "pool": "max"}
    for layer in range(p.n_layers):  # the head grid's thumbnails: derived in the page where it keeps every head
        if not all((layer, h) in p.exact for h in range(p.n_heads)):
            await keep({"layer": str(layer), "format": "bin", **whole, "size": str(THUMB)})
    for layer, head in p.exact:
        url = f"{base}/attention?layer={layer}&head={head}&format=f32"
        cells = _ok(await call("GET", url, b""), url).body
        payload.manifest["exact"][f"{layer}.{head}"] = payload.add(shuffle(cells))
    for layer, head in p.overview:
        if (layer, head) not in p.exact:  # a long run opens on its overview tile and the last query's row
            await keep({"layer": str(layer), "head": str(head), "format": "f32", **whole, "size": str(TILE)})
            last = p.n - 1
            await keep({"layer": str(layer), "head": str(head), "format": "f32", "pool": "max", "q0": str(last),
                        "q1": str(p.n), "k0": "0", "k1": str(p.n if not p.causal else last + 1)})
    payload.manifest["run"] = {"run_id": p.run_id, "n": p.n, "n_layers": p.n_layers, "n_heads": p.n_heads,
                               "causal": p.causal, "text": run["text"], "model": run["model"],
                               "every_head": p.every_head, "overview": [f"{h[0]}.{h[1]}" for h in p.overview]}
    return p, payload, run


def _assets(payload: Payload) -> None:
    payload.manifest["plotly"] = payload.add(plotly_js_path().read_bytes())
    payload.manifest["css"] = [payload.add((STATIC / "css" / name).read_bytes()) for name in ("app.css", "tools.css")]
    for name, source in explorer_modules().items():
        payload.manifest["modules"][name] = payload.add(without_comment_lines(source).encode("utf-8"))


COMMENT_LINE = re.compile(r"^[ \t]*//(?: [^\n]*)?\n", re.MULTILINE)


def without_comment_lines(source: str) -> str:
    """A module with its whole-line ``//`` comments left out (the file's code, every statement as written:
    about 46 kB of the explorer's sources are comments, 15 kB of a file that must stay under 2 MB). A
    comment that ends a line of code stays; no module has a line starting with ``// `` inside a template
    literal (tests/app/test_standalone.py checks)."""
    return COMMENT_LINE.sub("", source)


# the explorer's views that need the server and its model (QK attribution, the corpus survey): imported when
# first opened, and left out of an offline file, whose page says so when they are opened
SERVER_ONLY = frozenset({"attnscope/js/tools/qk.js", "attnscope/js/tools/survey.js"})
BARE = re.compile(r"""(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)["'](attnscope/[^"']+)["']""")


def explorer_modules(entry: str = "attnscope/js/main.js") -> dict[str, str]:
    """The modules the explorer imports, statically or dynamically, from its entry (not Learn's)."""
    every = modules()
    out: dict[str, str] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        if name not in out and name not in SERVER_ONLY:
            out[name] = every[name]
            todo += BARE.findall(out[name])
    return dict(sorted(out.items()))


def escape(data: bytes) -> bytes:
    return ESCAPED.sub(lambda m: b"=" + bytes([(m[0][0] + 64) & 0xFF]), data)


def _ascii(html: str) -> str:
    """The page's text and attributes in ASCII (character references), as a windows-1252 document needs."""
    return re.sub(r"[^\x00-\x7f]", lambda m: f"&#{ord(m[0])};", html)


def offline_script() -> str:
    source = (STATIC / "js" / "embed" / "offline.js").read_text(encoding="utf-8")
    if not source.isascii():
        raise ValueError("static/js/embed/offline.js must be ASCII: it is inlined into a windows-1252 document")
    return source


def document(payload: bytes, *, search: str) -> bytes:
    """The explorer page around ``payload`` (gzip-compressed already)."""
    html = page_html().replace('<meta charset="utf-8">', '<meta charset="windows-1252">', 1)
    for pattern in (r'<link rel="icon"[^>]*>', r'<link rel="stylesheet"[^>]*>'):
        html = re.sub(pattern, "", html)
    html = html.replace(PLOTLY_TAG, "")
    if ENTRY not in html or "windows-1252" not in html:
        raise ValueError("templates/index.html changed: app/standalone.py no longer finds its entry or charset")
    head, tail = _ascii(html).split(ENTRY, 1)
    boot = (f"<style>{EXTRA_CSS}</style>" + embed_script({"search": search, "offline": True})
            + '<script type="application/x-attnscope" id="attnscope-payload">')
    end = "</script>" + inline_script(offline_script()) + tail
    return (head + boot).encode("ascii") + escape(payload) + end.encode("ascii")


@dataclass(frozen=True)
class Built:
    html: bytes
    plan: Plan

    @property
    def exact_heads(self) -> str:
        """``all``, or the heads whose exact cells it keeps as ``L.H,…`` (empty: none)."""
        return "all" if self.plan.every_head else names(self.plan.exact)

    @property
    def overview_heads(self) -> str:
        """A long run's heads whose overview tile it keeps, ``L.H,…`` (empty for a short run)."""
        return names(self.plan.overview)


def names(heads: tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{layer}.{head}" for layer, head in heads)


async def build(call: Call, run_id: str, *, heads: str | None = None, lang: str = "en") -> Built:
    """The standalone document of a run, from the app behind ``call``."""
    if lang not in ("en", "zh"):
        raise BadInput(f"lang must be en or zh, not {lang!r}")
    p, payload, run = await record(call, run_id, heads)
    _assets(payload)
    first = p.chosen[0]
    search = "?" + urlencode({"text": run["text"], "model": run["model"], "layer": first[0], "head": first[1],
                              "lang": lang})
    return Built(document(gzip.compress(payload.packed(), 9, mtime=0), search=search), p)


class Recent:
    """The last few files built, so that a download after its ``dry_run`` is not built twice (a run
    does not change once its late scores are in, and the file waits for them)."""

    def __init__(self, keep: int = 2, max_bytes: int = 8 << 20) -> None:
        self.keep, self.max_bytes = keep, max_bytes
        self.lock = threading.Lock()
        self.files: OrderedDict[tuple[int, str, str | None, str], Built] = OrderedDict()

    def get(self, key: tuple[int, str, str | None, str]) -> Built | None:
        with self.lock:
            return self.files.get(key)

    def put(self, key: tuple[int, str, str | None, str], built: Built) -> None:
        if len(built.html) > self.max_bytes:
            return
        with self.lock:
            self.files[key] = built
            while len(self.files) > self.keep:
                self.files.popitem(last=False)


RECENT = Recent()


def build_sync(app: Any, run_id: str, *, heads: str | None = None, lang: str = "en") -> Built:
    """``build`` on ``app`` in-process: in this thread (a sync route's worker thread, a script), or in
    one of its own where an event loop already runs here (a notebook)."""
    key = (id(app), run_id, heads, lang)
    if (kept := RECENT.get(key)) is not None:
        return kept

    def work() -> Built:
        return asyncio.run(build(asgi_caller(app), run_id, heads=heads, lang=lang))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        built = work()
    else:
        with ThreadPoolExecutor(1, thread_name_prefix="attnscope-html") as pool:
            built = pool.submit(work).result()
    RECENT.put(key, built)
    return built
