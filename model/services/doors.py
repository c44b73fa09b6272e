"""The doors the engine opens but does not own: the notebook widget and the standalone HTML file are built
by the HTTP door (``attnscope.app``), which the engine never imports. The package's front
(``attnscope/__init__.py``, imported before any of its subpackages) hands them over once, here;
``Scope.show`` and ``Run.save_html`` call through."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_DOORS: dict[str, Callable[..., Any]] = {}


def provide(name: str, door: Callable[..., Any]) -> None:
    """Set a door once ("show", "save_html"); the same one again is a no-op (a reloaded package)."""
    with _LOCK:
        _DOORS.setdefault(name, door)


def open_door(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call a door; RuntimeError naming it when the package's front never provided it."""
    with _LOCK:
        door = _DOORS.get(name)
    if door is None:
        raise RuntimeError(f"attnscope.{name} is not available: import attnscope (the package) first")
    return door(*args, **kwargs)
