"""Capture activations for one forward: the attention through ``model.capture``,
the residual stream with temporary forward hooks.

Hooks are global state on the model (TransformerLens' lesson): they are registered
for one forward and always removed in ``finally``, so nothing piles up between
requests. Names follow TransformerLens and are built by ``model.names.act_name``; the
table of names and shapes is there.

Every captured tensor is float32 (a copy when the model runs in another dtype, or
when the model later writes into the tensor in place), detached, on the device of
the layer that produced it. ``attn_out`` / ``mlp_out`` are the contributions as
``model/arch.py`` defines them per family (normed for sandwich blocks, scaled for
Granite).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from model import capture
from model.capture import AttentionCall, LazyMask
from model.errors import AttentionUnavailable
from model.loading import LoadedModel
from model.names import KINDS, LOGITS, act_name, kind_of

Filter = Callable[[str], bool]


class Captures(dict[str, torch.Tensor]):
    """Activations by name, plus what each layer's attention saw (``calls``), filled during forwards."""

    def __init__(self, wanted: Filter) -> None:
        super().__init__()
        self.wanted = wanted
        self.calls: dict[int, AttentionCall] = {}

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, pattern: torch.Tensor,
                  call: AttentionCall) -> None:
        """The capture point's callback (model.capture): q (H, r, dh), k (Hkv, kv, dh), pattern (H, r, kv)."""
        self.calls[layer] = call
        offset = int(call.mask.kwargs.get("kv_offset", 0)) if isinstance(call.mask, LazyMask) else 0
        if self.wanted(name := act_name("pattern", layer)):
            if offset:  # a sliding-window cache kept only the last keys: put them at their positions
                pattern = torch.nn.functional.pad(pattern, (offset, 0))
            self[name] = pattern
        if self.wanted(name := act_name("rot_q", layer)):
            self[name] = q.float()
        if self.wanted(name := act_name("rot_k", layer)):
            self[name] = k.float()


def _first(output: Any) -> torch.Tensor:
    value = output[0] if isinstance(output, tuple) else output
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor (or a tuple starting with one), got {type(value).__name__}")
    return value


def _rows(t: torch.Tensor, copy: bool) -> torch.Tensor:
    """(1, n, d) or (n, d) -> (n, d) float32, detached (a batch of one)."""
    t = t.detach()
    t = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    return t.to(torch.float32, copy=copy)


def _add_hooks(lm: LoadedModel, store: Captures) -> list[RemovableHandle]:
    handles: list[RemovableHandle] = []
    wanted = store.wanted
    spec = lm.spec
    scale = float(getattr(lm.model.config, spec.residual_scale)) if spec.residual_scale else None

    def save_output(name: str, copy: bool = False, factor: float | None = None) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            value = _rows(_first(output), copy)
            store[name] = value * factor if factor is not None else value

        return hook

    def save_pattern(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise AttentionUnavailable(
                    f"{name}: the attention module returned no weights; attnscope needs the eager "
                    "attention implementation (attn_implementation='eager')"
                )
            store[name] = weights[0].detach().float()  # (H, q, kv)

        return hook

    def save_input(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            store[name] = _rows(hidden, copy=True)

        return hook

    for i, block in enumerate(lm.blocks):
        if wanted(name := act_name("resid_pre", i)):
            handles.append(block.register_forward_pre_hook(save_input(name), with_kwargs=True))
        if spec.capture == "module" and wanted(name := act_name("pattern", i)):
            handles.append(block.get_submodule(spec.attn).register_forward_hook(save_pattern(name)))
        if wanted(name := act_name("attn_out", i)):
            handles.append(block.get_submodule(spec.attn_out).register_forward_hook(
                save_output(name, factor=scale)))
        if wanted(name := act_name("mlp_out", i)):
            handles.append(block.get_submodule(spec.mlp_out).register_forward_hook(
                save_output(name, copy=spec.mutates_mlp_out, factor=scale)))
        if wanted(name := act_name("resid_post", i)):
            handles.append(block.register_forward_hook(save_output(name, copy=True)))
    return handles


def _filter(names: Iterable[str] | Filter | None) -> Filter:
    if names is None:
        return lambda name: name == LOGITS or kind_of(name) in KINDS
    if callable(names):
        return names
    chosen = set(names)
    return chosen.__contains__


@contextmanager
def hooked(lm: LoadedModel, names: Iterable[str] | Filter | None = None) -> Iterator[Captures]:
    """Hooks live only inside the ``with``: every forward run there fills the dict.

    With the KV cache a step's forward sees one new query: its pattern is then
    (heads, 1, keys) and its residual tensors (1, d_model).
    """
    store = Captures(_filter(names))
    attention_modules = [block.get_submodule(lm.spec.attn) for block in lm.blocks]
    handles: list[RemovableHandle] = []
    try:
        handles = _add_hooks(lm, store)
        if lm.spec.capture == "interface":
            capture.activate(attention_modules, store)
        yield store
    finally:
        capture.deactivate(attention_modules)
        for handle in handles:
            handle.remove()


def run_with_cache(
    lm: LoadedModel,
    input_ids: torch.Tensor,  # (n,)
    names: Iterable[str] | Filter | None = None,
) -> Captures:
    """One forward over all positions; returns the captured activations by name.

    ``names`` keeps only what was asked for (a list of names or a predicate), like
    TransformerLens' ``names_filter``. The caller holds ``lm.lock``.
    """
    wanted = _filter(names)
    with hooked(lm, wanted) as store, torch.inference_mode():
        out = lm.model(input_ids=input_ids[None, :].to(lm.input_device), use_cache=False)
    missing = [name for i in range(lm.info.n_layers) if wanted(name := act_name("pattern", i))
               and name not in store]
    if missing:
        raise AttentionUnavailable(
            f"{missing[0]}: the attention never reached attnscope's capture point (the model runs "
            f"{lm.model.config._attn_implementation!r} attention); attnscope needs attn_implementation="
            f"{lm.spec.attn_implementation!r}"
        )
    logits = getattr(out, "logits", None)
    if logits is not None and wanted(LOGITS):
        store[LOGITS] = logits[0].float()  # (n, vocab)
    return store
