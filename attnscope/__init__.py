"""attnscope: see inside a transformer language model.

One import name for everything installed: ``attnscope.app`` (the HTTP door: FastAPI routes, schemas,
the ``attnscope`` command) and ``attnscope.model`` (loading, capture, runs, scores, tools, lessons),
with the browser's ``static/`` and ``templates/`` and the bundled model inside the package. In the
repository these are the top-level folders ``app/``, ``model/``, ``static/`` and ``templates/``;
``attnscope/`` links to them, so that the source tree and an installed wheel import the same names
(and a user's own ``model.py`` or ``app.py`` shadows nothing).

The Python door: ``attnscope.Scope(model, tokenizer)`` (``model.services.scope``), imported on first
use so that ``attnscope --help`` loads no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Run", "Scope", "__version__"]

if TYPE_CHECKING:
    from attnscope.model.services.scope import Run, Scope


def __getattr__(name: str) -> Any:
    if name in ("Scope", "Run"):
        from attnscope.model.services import scope

        return getattr(scope, name)
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
