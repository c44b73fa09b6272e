"""Errors the engine raises; ``app/errors.py`` maps each to an HTTP status."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: the message is written for a person and is safe to show."""


class UnknownModel(EngineError):
    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"unknown model {name!r}; configured models: {', '.join(available)}")


class RunNotFound(EngineError):
    def __init__(self, run_id: str, expired: bool) -> None:
        self.expired = expired
        super().__init__("run expired, analyse again" if expired else f"unknown run {run_id!r}")


class BadInput(EngineError):
    """The request is well-formed but asks for something this model or run cannot give."""


class AttentionUnavailable(EngineError):
    """The model's attention implementation does not return weights."""


class ModelLoadError(EngineError):
    """A configured model could not be loaded."""


class TooLarge(EngineError):
    """What a request would keep or need is more than this server allows (413)."""
