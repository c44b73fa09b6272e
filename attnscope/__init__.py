"""attnscope: see inside a transformer language model.

One import name for everything installed: ``attnscope.app`` (the HTTP door: FastAPI routes, schemas,
the ``attnscope`` command) and ``attnscope.model`` (loading, capture, runs, scores, tools, lessons),
with the browser's ``static/`` and ``templates/`` and the bundled model inside the package. In the
repository these are the top-level folders ``app/``, ``model/``, ``static/`` and ``templates/``;
pyproject.toml's ``package-dir`` maps them into this package (no links), so that an editable install
and an installed wheel import the same names (and a user's own ``model.py`` or ``app.py`` shadows
nothing).

The Python door: ``attnscope.Scope(model, tokenizer)`` (``model.services.scope``), imported on first
use so that ``attnscope --help`` loads no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
# what a script needs, without deep imports: the doors, the bundled model's folder and the result types
# (imported on first use, so that ``attnscope --help`` loads no torch)
_EXPORTS = {
    "Scope": "attnscope.model.services.scope", "Run": "attnscope.model.services.scope",
    "Generated": "attnscope.model.services.scope", "RunFile": "attnscope.model.services.files",
    "HeadScore": "attnscope.model.scores.analysis", "HeadSparsity": "attnscope.model.scores.analysis",
    "Token": "attnscope.model.load.tokens", "PositionPrediction": "attnscope.model.results",
    "NextDistribution": "attnscope.model.results", "LogitLens": "attnscope.model.results",
    "Heads": "attnscope.model.services.runs", "Residual": "attnscope.model.services.runs",
    "Ablation": "attnscope.model.tools.ablation", "Scan": "attnscope.model.tools.ablation",
    "Patch": "attnscope.model.tools.patching", "Attribution": "attnscope.model.tools.attribution",
    "QKAttribution": "attnscope.model.tools.qk", "Component": "attnscope.model.tools.qk",
    "Survey": "attnscope.model.survey.stats", "HeadSurvey": "attnscope.model.survey.stats",
    "EngineError": "attnscope.model.errors", "BadInput": "attnscope.model.errors",
    "TooLarge": "attnscope.model.errors",
}
__all__ = [
    "BUNDLED",
    "Ablation",
    "Attribution",
    "BadInput",
    "Component",
    "EngineError",
    "Generated",
    "HeadScore",
    "HeadSparsity",
    "HeadSurvey",
    "Heads",
    "LogitLens",
    "NextDistribution",
    "Patch",
    "PositionPrediction",
    "QKAttribution",
    "Residual",
    "Run",
    "RunFile",
    "Scan",
    "Scope",
    "Survey",
    "Token",
    "TooLarge",
    "__version__",
    "load",
    "save_html",
    "show",
]

if TYPE_CHECKING:
    from attnscope.model.errors import BadInput, EngineError, TooLarge
    from attnscope.model.load.tokens import Token
    from attnscope.model.results import LogitLens, NextDistribution, PositionPrediction
    from attnscope.model.scores.analysis import HeadScore, HeadSparsity
    from attnscope.model.services.files import RunFile
    from attnscope.model.services.runs import Heads, Residual
    from attnscope.model.services.scope import Generated, Run, Scope
    from attnscope.model.survey.stats import HeadSurvey, Survey
    from attnscope.model.tools.ablation import Ablation, Scan
    from attnscope.model.tools.attribution import Attribution
    from attnscope.model.tools.patching import Patch
    from attnscope.model.tools.qk import Component, QKAttribution

    BUNDLED: Path


def show(what: Any, tokenizer: Any = None, text: str | None = None, *, lang: str = "en", height: int = 780) -> Any:
    """The explorer in a notebook's output cell: ``show(model, tokenizer, text)`` for a model you hold,
    ``show(scope, text=...)``, or ``show(run)`` for a run's text. Returns the widget (an anywidget);
    outside a Jupyter kernel it says in one line what to do instead and returns None."""
    import logging

    from attnscope.model.services.scope import Run, Scope

    if isinstance(what, Run):
        scope, text = what.scope, text or what.text
    elif isinstance(what, Scope):
        scope = what
    else:
        if tokenizer is None:
            raise TypeError("show(model, tokenizer, text): a model needs its tokenizer")
        scope = Scope(what, tokenizer)
    try:
        from IPython import get_ipython

        in_kernel = getattr(get_ipython(), "kernel", None) is not None
    except ImportError:
        in_kernel = False
    if not in_kernel:
        logging.getLogger("attnscope").warning(
            "attnscope.show draws in a Jupyter notebook; here, run `attnscope serve` and open the URL it prints "
            "(or read the numbers from scope.run(text) directly)")
        return None
    try:
        from attnscope.app.notebook import Explorer
    except ImportError as exc:
        raise ImportError("the notebook widget needs anywidget: pip install 'attnscope[notebook]'") from exc
    return Explorer(scope, text=text, lang=lang, height=height)


def save_html(run: Run, path: str | Path, *, heads: str | None = None, lang: str = "en") -> Path:
    """The run as one self-contained HTML file at ``path`` (``run.save_html``): the explorer on it,
    opened from disk with no server and no network. Every head's exact cells while they fit (a
    64-token run of the bundled model: under 2 MB with plotly.js), else every head's thumbnail and
    the exact cells of ``heads`` (``"4.0,2.3"``; default the first). ``lang``: ``"en"`` or ``"zh"``."""
    from attnscope.app.html_file import save_html as write

    return write(run, path, heads=heads, lang=lang)


def load(path: str | Path) -> RunFile | Survey:
    """A run file (``run.save``, the explorer's "Download run", format=attnscope) read without a model: its
    text, tokens, predictions, head scores and any head's exact attention. ``scope.load(path)`` reads it
    onto a model, with its tools. A survey file (``attnscope survey``, ``scope.survey(out=...)``) is read as
    its ``Survey``."""
    from attnscope.model.services.files import RunFile
    from attnscope.model.survey.file import is_survey, load_survey

    with open(path, "rb") as f:
        head = f.read(1 << 20)
    if is_survey(head):
        return load_survey(path)
    return RunFile.read(path)


def _provide_doors() -> None:
    from attnscope.model.services import doors

    doors.provide("show", show)
    doors.provide("save_html", save_html)


_provide_doors()


def __getattr__(name: str) -> Any:
    import importlib

    if name == "BUNDLED":  # the bundled model's folder: AutoModelForCausalLM.from_pretrained(attnscope.BUNDLED)
        from attnscope.model.load.sources import BUNDLED_DIR

        return BUNDLED_DIR / "attnscope-tiny"
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
