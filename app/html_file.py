"""``run.save_html(path)`` (``attnscope.save_html``): a run of the Python door as one standalone HTML file,
built by the app's own routes in-process (``app.standalone``) and written whole or not at all."""

from __future__ import annotations

import logging
from pathlib import Path

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.app.standalone import build_sync
from attnscope.model.runs.disk import write_whole
from attnscope.model.services.scope import Run

log = logging.getLogger(__name__)


def save_html(run: Run, path: str | Path, *, heads: str | None = None, lang: str = "en") -> Path:
    """The run's standalone HTML file at ``path``: every head's exact cells while they fit, else every
    head's thumbnail and the exact cells of ``heads``."""
    scope = run.scope
    app = create_app(Settings(models={}, default_model=scope.model.info.name), scope.engine)
    with scope.borrowed():
        built = build_sync(app, run.run_id, heads=heads, lang=lang)
    target = write_whole(Path(path), built.html)
    log.info("saved %s (%s bytes; exact cells of %s heads)", target, f"{len(built.html):,}", built.exact_heads)
    return target
