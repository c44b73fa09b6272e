"""attnscope: see inside a transformer language model.

One import name for everything installed: ``attnscope.app`` (the HTTP door: FastAPI routes, schemas,
the ``attnscope`` command) and ``attnscope.model`` (loading, capture, runs, scores, tools, lessons),
with the browser's ``static/`` and ``templates/`` and the bundled model inside the package. In the
repository these are the top-level folders ``app/``, ``model/``, ``static/`` and ``templates/``;
``attnscope/`` links to them, so that the source tree and an installed wheel import the same names
(and a user's own ``model.py`` or ``app.py`` shadows nothing).
"""

from __future__ import annotations

__version__ = "0.1.0"
