"""Helpers that turn model/'s typed results (dataclasses) into response schemas."""

from __future__ import annotations

import dataclasses
from typing import Any


def fields_of(result: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, one level deep and without copies (unlike
    ``dataclasses.asdict``, which deep-copies every list: a 1,024 x 1,024 table would cost
    more than computing it). Nested dataclasses stay objects: validate with
    ``from_attributes=True``."""
    if not dataclasses.is_dataclass(result) or isinstance(result, type):
        raise TypeError(f"expected a dataclass instance, got {type(result).__name__}")
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
