"""The explorer as one self-contained HTML document: the web app's own page, stylesheets, ES modules
and plotly.js inlined, with no request to a server for any of them and no build step.

Each module's relative imports are rewritten to bare names (``attnscope/js/views/heatmap.js``) and an
import map points each name at the module's source as a ``data:`` URL, so the same files the web app
serves run unchanged from ``about:srcdoc`` (the notebook widget's frame) or ``file://``. What the
page asks of ``/api/…`` goes through ``fetch``: ``transport`` is a classic script, run before the
modules, that answers it another way (the widget's comm).
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "static"
TEMPLATES = ROOT / "templates"
PREFIX = "attnscope/"  # the bare name of static/<path> in the import map
# a static import or export-from, a side-effect import and a dynamic import, of a relative path
RELATIVE = re.compile(r"""(\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)(["'])(\.{1,2}/[^"']+)\2""")


def _bare(relative: str, importer: str) -> str:
    """``../i18n/en.js`` imported by ``js/i18n.js`` -> ``attnscope/i18n/en.js``."""
    return PREFIX + posixpath.normpath(posixpath.join(posixpath.dirname(importer), relative))


def _rewriter(importer: str) -> Callable[[re.Match[str]], str]:
    def rewrite(m: re.Match[str]) -> str:
        return f"{m.group(1)}{m.group(2)}{_bare(m.group(3), importer)}{m.group(2)}"

    return rewrite


@cache
def modules() -> dict[str, str]:
    """Every ES module of static/ by its bare name, its relative imports rewritten to bare names."""
    out: dict[str, str] = {}
    for path in sorted([*(STATIC / "js").rglob("*.js"), *(STATIC / "i18n").glob("*.js")]):
        rel = path.relative_to(STATIC).as_posix()
        if rel.startswith(("js/embed/", "js/widget.js")):  # the hosts' own scripts, not the page's modules
            continue
        source = path.read_text(encoding="utf-8")
        out[PREFIX + rel] = RELATIVE.sub(_rewriter(rel), source)
    return out


def import_map() -> str:
    entries = {name: "data:text/javascript;base64," + base64.b64encode(src.encode("utf-8")).decode("ascii")
               for name, src in modules().items()}
    return json.dumps({"imports": entries}, separators=(",", ":"))


def transport_script() -> str:
    """The frame's fetch over postMessage (static/js/embed/transport.js)."""
    return (STATIC / "js" / "embed" / "transport.js").read_text(encoding="utf-8")


ENTRY = '<script type="module" src="/static/js/main.js"></script>'  # the page's module, as index.html loads it
PLOTLY_TAG = '<script src="/vendor/plotly.min.js" defer></script>'


def inline_script(source: str) -> str:
    return "<script>" + source.replace("</script", "<\\/script") + "</script>"


def embed_script(embed: dict[str, object], then: str = "") -> str:
    """``globalThis.ATTNSCOPE_EMBED = embed`` (``page.js`` reads it), then ``then``, as one inline script."""
    return inline_script("globalThis.ATTNSCOPE_EMBED = " + json.dumps(embed).replace("<", "\\u003c") + ";\n" + then)


@cache
def page_html() -> str:
    """templates/index.html rendered, as the web app serves it (the embedded documents rewrite it)."""
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]))
    return env.get_template("index.html").render()


@cache
def plotly_js_path() -> Path:
    """plotly.js as the installed plotly package ships it (never a CDN)."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def _plotly() -> str:
    return plotly_js_path().read_text(encoding="utf-8")


def explorer_document(*, embed: dict[str, object], transport: str, extra_css: str = "") -> str:
    """The explorer page, whole: ``embed`` becomes ``globalThis.ATTNSCOPE_EMBED`` (``search``: the
    query the page starts from, e.g. ``?text=…&lang=zh``)."""
    html = page_html()
    css = {name: (STATIC / "css" / name).read_text(encoding="utf-8") for name in ("app.css", "tools.css")}
    for name, text in css.items():
        html = html.replace(f'<link rel="stylesheet" href="/static/css/{name}">',
                            "<style>" + text.replace("</style", "<\\/style") + "</style>")
    html = re.sub(r'<link rel="icon"[^>]*>', "", html)
    html = html.replace(PLOTLY_TAG, inline_script(_plotly()))
    boot = (embed_script(embed, transport)
            + '<script type="importmap">' + import_map() + "</script>"
            + '<script type="module">import "attnscope/js/main.js";</script>')
    html = html.replace(ENTRY, boot)
    if extra_css:
        html = html.replace("</head>", "<style>" + extra_css + "</style></head>", 1)
    return html
