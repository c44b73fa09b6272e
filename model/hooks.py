"""Capture activations with temporary forward hooks.

Hooks are global state on the model (TransformerLens' lesson): they are registered
for one forward and always removed in ``finally``, so nothing piles up between
requests. Names follow TransformerLens:

============================  ==================  =====================================
name                          shape               what
============================  ==================  =====================================
blocks.{i}.hook_resid_pre     (n, d_model)        residual stream entering block i
blocks.{i}.attn.hook_pattern  (heads, n, n)       post-softmax attention, query x key
blocks.{i}.hook_attn_out      (n, d_model)        attention sublayer's output
blocks.{i}.hook_mlp_out       (n, d_model)        MLP sublayer's output
blocks.{i}.hook_resid_post    (n, d_model)        residual stream leaving block i
logits                        (n, vocab)          the LM head's output (decoders)
============================  ==================  =====================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from model.errors import AttentionUnavailable
from model.loading import LoadedModel

HOOK_KINDS = ("hook_resid_pre", "attn.hook_pattern", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
Filter = Callable[[str], bool]


def hook_names(n_layers: int) -> list[str]:
    return [f"blocks.{i}.{kind}" for i in range(n_layers) for kind in HOOK_KINDS]


def _first(output: Any) -> torch.Tensor:
    value = output[0] if isinstance(output, tuple) else output
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor (or a tuple starting with one), got {type(value).__name__}")
    return value


def _squeeze(t: torch.Tensor) -> torch.Tensor:
    return t[0].detach()  # drop the batch of one: (1, ...) -> (...)


def _add_hooks(lm: LoadedModel, store: dict[str, torch.Tensor], wanted: Filter) -> list[RemovableHandle]:
    handles: list[RemovableHandle] = []

    def save_output(name: str, pick: Callable[[Any], torch.Tensor | None]) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            value = pick(output)
            if value is None:
                raise AttentionUnavailable(
                    f"{name}: the attention module returned no weights; attnscope needs the eager "
                    "attention implementation (attn_implementation='eager')"
                )
            store[name] = _squeeze(value)

        return hook

    def save_input(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            store[name] = _squeeze(hidden)

        return hook

    spec = lm.spec
    for i, block in enumerate(lm.blocks):
        prefix = f"blocks.{i}"
        if wanted(f"{prefix}.hook_resid_pre"):
            handles.append(block.register_forward_pre_hook(save_input(f"{prefix}.hook_resid_pre"), with_kwargs=True))
        if wanted(f"{prefix}.attn.hook_pattern"):
            handles.append(block.get_submodule(spec.pattern).register_forward_hook(
                save_output(f"{prefix}.attn.hook_pattern", lambda out: out[1])))
        if wanted(f"{prefix}.hook_attn_out"):
            handles.append(block.get_submodule(spec.attn_out).register_forward_hook(
                save_output(f"{prefix}.hook_attn_out", _first)))
        if wanted(f"{prefix}.hook_mlp_out"):
            handles.append(block.get_submodule(spec.mlp_out).register_forward_hook(
                save_output(f"{prefix}.hook_mlp_out", _first)))
        if wanted(f"{prefix}.hook_resid_post"):
            handles.append(block.register_forward_hook(save_output(f"{prefix}.hook_resid_post", _first)))
    return handles


def _filter(names: Iterable[str] | Filter | None) -> Filter:
    if names is None:
        return lambda _name: True
    if callable(names):
        return names
    chosen = set(names)
    return chosen.__contains__


@contextmanager
def hooked(lm: LoadedModel, names: Iterable[str] | Filter | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks live only inside the ``with``: every forward run there fills the dict.

    With the KV cache a step's forward sees one new query: its pattern is then
    (heads, 1, keys) and its residual tensors (1, d_model).
    """
    store: dict[str, torch.Tensor] = {}
    handles = _add_hooks(lm, store, _filter(names))
    try:
        yield store
    finally:
        for handle in handles:
            handle.remove()


def run_with_cache(
    lm: LoadedModel,
    input_ids: torch.Tensor,  # (n,)
    names: Iterable[str] | Filter | None = None,
) -> dict[str, torch.Tensor]:
    """One forward over all positions; returns the captured activations by name.

    ``names`` keeps only what was asked for (a list of names or a predicate), like
    TransformerLens' ``names_filter``. The caller holds ``lm.lock``.
    """
    wanted = _filter(names)
    with hooked(lm, wanted) as store, torch.inference_mode():
        out = lm.model(input_ids=input_ids[None, :], use_cache=False)
    logits = getattr(out, "logits", None)
    if logits is not None and wanted("logits"):
        store["logits"] = logits[0].float()  # (n, vocab)
    return store
