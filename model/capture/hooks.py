"""The one hook mechanism: hooks that live only inside a ``with``.

A forward hook is global state on a model that may be shared (the server's, or a user's own in a
notebook): every capture, edit and probe registers its hooks through ``temporary_hooks``, which
removes each one in ``finally`` — also when registering a later one, or the forward inside, fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn
from torch.utils.hooks import RemovableHandle

Hook = Callable[..., Any]
# pre: fn(module, args); pre_kwargs: fn(module, args, kwargs); post: fn(module, args, output)
HookKind = Literal["pre", "pre_kwargs", "post"]


@dataclass(frozen=True)
class Registration:
    """One hook to register: on which module, when, and what it calls."""

    module: nn.Module
    kind: HookKind
    fn: Hook


@contextmanager
def temporary_hooks(registrations: list[Registration]) -> Iterator[None]:
    """Register the hooks for the ``with`` only; every one is removed in ``finally``."""
    handles: list[RemovableHandle] = []
    try:
        for reg in registrations:
            if reg.kind == "pre":
                handles.append(reg.module.register_forward_pre_hook(reg.fn))
            elif reg.kind == "pre_kwargs":
                handles.append(reg.module.register_forward_pre_hook(reg.fn, with_kwargs=True))
            else:
                handles.append(reg.module.register_forward_hook(reg.fn))
        yield
    finally:
        for handle in handles:
            handle.remove()
