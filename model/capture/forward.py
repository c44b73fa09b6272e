"""Capture activations for one forward: the attention through ``model.capture``,
the residual stream with temporary forward hooks.

Hooks are global state on the model (TransformerLens' lesson): they are registered
for one forward and always removed in ``finally``, so nothing piles up between
requests. Names follow TransformerLens and are built by ``model.capture.names.act_name``; the
table of names and shapes is there.

Every captured tensor is float32 (a copy when the model runs in another dtype, or
when the model later writes into the tensor in place), detached, on the device of
the layer that produced it. ``attn_out`` / ``mlp_out`` are the contributions as
``model/families/table.py`` defines them per family (normed for sandwich blocks, scaled for
Granite).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from attnscope.model import compat
from attnscope.model.attention import interface, kept
from attnscope.model.attention.interface import AttentionCall, LazyMask
from attnscope.model.attention.kept import LayerAttention
from attnscope.model.capture.hooks import Registration, temporary_hooks
from attnscope.model.capture.names import KINDS, LOGITS, act_name, kind_of
from attnscope.model.errors import AttentionUnavailable
from attnscope.model.families.qk import READERS, ModuleQK
from attnscope.model.load.models import LoadedModel

log = logging.getLogger(__name__)
_SAID_LOCK = threading.Lock()  # say_path's check-and-set of a model's "said" mark

Filter = Callable[[str], bool]


def RESIDUAL(name: str) -> bool:
    """The residual stream's names (what a run keeps by name; its attention is kept as Q and K)."""
    return kind_of(name) in ("resid_pre", "attn_out", "mlp_out", "resid_post")


@dataclass(frozen=True)
class LayerRecord:
    """One forward's attention of one layer: its queries, the keys it added, and how it scores them."""

    q: torch.Tensor  # (H, r, dh) float32 post-rotary, the forward's r queries
    k: torch.Tensor  # (Hkv, r, dh) float32 post-rotary, the r keys this forward added
    lse: torch.Tensor | None  # (H, r) row normalisers, when the forward computed them
    scaling: float
    softcap: float | None
    groups: int
    bias: torch.Tensor | None  # (H, keys so far) per-key logit bias (ALiBi)
    mask: LazyMask  # the forward's own mask (its shape is not kept: LazyMask.whole rebuilds it)


class LayerListener(Protocol):
    """What the capture point tells a listener (the live head scores, ``model.scores.live``) as a forward
    runs, and what it asks of it when the forwards' layers are assembled."""

    def attention_block(self, layer: int, q0: int, k0: int, weights: torch.Tensor, allowed: torch.Tensor,
                        call: AttentionCall) -> None:
        """Rows [q0, q0 + r) over keys [k0, k0 + w) of one layer's weights (H, r, w), on the block path."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, call: AttentionCall,
                  blocks: bool) -> None:
        """One layer done: q (H, r, dh), k (Hkv, kv, dh), lse (H, r); ``blocks``: it went through the blocks."""

    def sweep(self, layer: int) -> Callable[[int, torch.Tensor], None] | None:
        """A callback for the rows of this layer's weights, if the assembly has to sweep them (no lse)."""


class Captures(dict[str, torch.Tensor]):
    """Activations by name, plus each layer's attention record (``records``), filled during forwards.

    A ``listener`` hears each layer's attention as it passes the capture point: the blocks of weights
    where the block path computed them, then the layer's Q, K and normalisers (the live head scores
    listen so). ``timing_ms`` splits the time of ``run_with_cache``.
    """

    def __init__(self, wanted: Filter, listener: LayerListener | None = None) -> None:
        super().__init__()
        self.wanted = wanted
        self.listener = listener
        self.records: dict[int, LayerRecord] = {}
        self.calls: dict[int, AttentionCall] = {}
        self.fused: set[int] = set()  # the layers the fused kernel computed (no block of weights)
        self.timing_ms: dict[str, float] = {}
        self.layers: list[LayerAttention] = []  # filled by run_with_cache / assemble

    def attention_block(self, layer: int, q0: int, k0: int, weights: torch.Tensor, allowed: torch.Tensor,
                        call: AttentionCall) -> None:
        """The capture point's callback for rows [q0, q0 + r) over keys [k0, k0 + w): weights (H, r, w)."""
        if self.listener is not None:
            self.listener.attention_block(layer, q0, k0, weights, allowed, call)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, call: AttentionCall,
                  blocks: bool) -> None:
        """The capture point's callback after a layer: q (H, r, dh), k (Hkv, kv, dh), lse (H, r)."""
        self.calls[layer] = call
        if not blocks:
            self.fused.add(layer)
        r = q.shape[1]
        mask = call.mask if isinstance(call.mask, LazyMask) else None
        if mask is None:
            raise AttentionUnavailable(f"layer {layer}: the model built its own attention mask "
                                       f"({type(call.mask).__name__}); attnscope needs transformers' mask interface",
                                       params={"layer": layer, "mask": type(call.mask).__name__})
        added = k[:, k.shape[1] - r :].float()  # the keys this forward added (a KV cache holds the rest)
        if r < k.shape[1]:
            added = added.clone()  # not a view that would keep the whole cache's keys alive
        lse = lse.float()
        if self.listener is not None:
            self.listener.attention(layer, q, k, lse, call, blocks)
        self.records[layer] = LayerRecord(q=q.float(), k=added, lse=lse, scaling=call.scaling,
                                          softcap=call.softcap, groups=call.groups, bias=call.bias, mask=mask)

    def module_attention(self, layer: int, qk: ModuleQK) -> None:
        """A module-read family's Q and K (``model.families.qk``), from the attention module's input."""
        self.records[layer] = LayerRecord(q=qk.q.detach(), k=qk.k.detach(), lse=None, scaling=qk.scaling,
                                          softcap=None, groups=qk.groups, bias=qk.bias,
                                          mask=LazyMask.over(qk.q.shape[1], qk.mask_function, qk.q.device))


def assemble(forwards: list[Captures], n_layers: int,
             scores: Callable[[int], Callable[[int, torch.Tensor], None] | None] | None = None
             ) -> list[LayerAttention]:
    """Each layer's kept attention over all the positions these forwards saw, in order.

    One forward over a prompt, or a recorded generation's prefill and steps: queries and new
    keys are concatenated, the mask is the forward's own over the whole sequence, the ALiBi
    bias the last forward's (it covers every key). Row normalisers come from the forwards when
    each computed them, else from one sweep (that also feeds ``scores(layer)``, if given).
    """
    layers = []
    for i in range(n_layers):
        recs = [f.records[i] for f in forwards]
        q = _joined([r.q for r in recs])  # (H, n, dh)
        k = _joined([r.k for r in recs])  # (Hkv, n, dh)
        n = q.shape[1]
        lse = None if any(r.lse is None for r in recs) else _joined([r.lse for r in recs if r.lse is not None])
        bias = recs[-1].bias
        if bias is not None and bias.shape[-1] != n:
            raise ValueError(f"layer {i}: an ALiBi bias over {bias.shape[-1]} keys for {n} positions")
        first = recs[0]
        layers.append(kept.build(q, k, scaling=first.scaling, softcap=first.softcap, groups=first.groups,
                                      bias=bias, mask=first.mask.whole(n), lse=lse,
                                      scores=scores(i) if scores is not None else None))
    return layers


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """Forwards' tensors joined along positions (dim 1). One forward's is kept as it is where it is compact
    (``torch.cat`` would copy it: 90 copies for a 30-layer analyse, 38 ms at 1,024 tokens on SmolLM2), and
    copied where it is a view into more (GPT-2's Q is a slice of its fused QKV projection: kept, the view
    would hold all three)."""
    if len(parts) > 1:
        return torch.cat(parts, dim=1)
    t = parts[0]
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()


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


def _registrations(lm: LoadedModel, store: Captures) -> list[Registration]:
    """The hooks that fill ``store`` (registered by ``temporary_hooks``)."""
    regs: list[Registration] = []
    wanted = store.wanted
    spec = lm.spec
    scale = float(getattr(lm.model.config, spec.residual_scale)) if spec.residual_scale else None

    def save_output(name: str, copy: bool = False, factor: float | None = None) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            value = _rows(_first(output), copy)
            store[name] = value * factor if factor is not None else value

        return hook

    def read_qk(layer: int) -> Callable[..., None]:
        reader = READERS[lm.model.config.model_type]

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            store.module_attention(layer, reader(module, args, kwargs))

        return hook

    def save_input(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            store[name] = _rows(hidden, copy=True)

        return hook

    for i, block in enumerate(lm.blocks):
        if wanted(name := act_name("resid_pre", i)):
            regs.append(Registration(block, "pre_kwargs", save_input(name)))
        if spec.capture == "module":
            regs.append(Registration(block.get_submodule(spec.attn), "pre_kwargs", read_qk(i)))
        if wanted(name := act_name("attn_out", i)):
            regs.append(Registration(block.get_submodule(spec.attn_out), "post", save_output(name, factor=scale)))
        if wanted(name := act_name("mlp_out", i)):
            regs.append(Registration(block.get_submodule(spec.mlp_out), "post",
                                     save_output(name, copy=spec.mutates_mlp_out, factor=scale)))
        if wanted(name := act_name("resid_post", i)):
            regs.append(Registration(block, "post", save_output(name, copy=True)))
    return regs


def _filter(names: Iterable[str] | Filter | None) -> Filter:
    if names is None:
        return lambda name: name == LOGITS or kind_of(name) in KINDS
    if callable(names):
        return names
    chosen = set(names)
    return chosen.__contains__


@contextmanager
def hooked(lm: LoadedModel, names: Iterable[str] | Filter | None = None,
           listener: LayerListener | None = None) -> Iterator[Captures]:
    """Hooks live only inside the ``with``: every forward run there fills the dict and ``records``.

    With the KV cache a step's forward sees one new query: its record then holds one query
    and one new key per layer, and its residual tensors are (1, d_model). ``listener`` hears each
    layer's attention as it passes the capture point.
    """
    store = Captures(_filter(names), listener)
    attention_modules = [block.get_submodule(lm.spec.attn) for block in lm.blocks]
    with temporary_hooks(_registrations(lm, store)):
        try:
            if lm.spec.capture == "interface":
                interface.activate(attention_modules, store)
            yield store
        finally:
            interface.deactivate(attention_modules)


def publish(store: Captures, n_layers: int) -> None:
    """Put what was asked for by name from the kept layers: dense patterns (small runs), Q and K."""
    for i, layer in enumerate(store.layers[:n_layers]):
        if store.wanted(name := act_name("pattern", i)):
            store[name] = layer.dense()  # (H, n, n)
        if store.wanted(name := act_name("rot_q", i)):
            store[name] = layer.q
        if store.wanted(name := act_name("rot_k", i)):
            store[name] = layer.k


def layers_of(lm: LoadedModel, forwards: list[Captures],
              sweep: Callable[[int], Callable[[int, torch.Tensor], None] | None] | None = None
              ) -> list[LayerAttention]:
    """The kept attention of these forwards (``assemble``), or AttentionUnavailable naming the first layer
    whose attention never reached the capture point (the model runs another attention implementation)."""
    n_layers = lm.info.n_layers
    missing = [i for i in range(n_layers) if any(i not in f.records for f in forwards)]
    if missing:
        raise AttentionUnavailable(
            f"{act_name('pattern', missing[0])}: the attention never reached attnscope's capture point (the "
            f"model runs {compat.attention_implementation(lm.model)!r} attention); attnscope needs "
            f"attn_implementation={lm.spec.attn_implementation!r}",
            params={"layer": missing[0], "implementation": str(compat.attention_implementation(lm.model)),
                    "needs": lm.spec.attn_implementation})
    return assemble(forwards, n_layers, sweep)


def last_logits_only(lm: LoadedModel) -> dict[str, int]:
    """``logits_to_keep=1`` where the model takes it: the (n, vocab) logits are never built whole."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(lm.model.forward).parameters else {}


def say_path(lm: LoadedModel, store: Captures, ids: torch.Tensor) -> None:
    """Log, once per model, which path its attention took: the fused kernel (output and log-sum-exp in one
    call) on how many layers, or the block path, with the device and dtype."""
    memo = lm.probes
    if memo.path_said is lm.model or not store.calls:
        return
    with _SAID_LOCK:  # not memo.lock: a probe holds it around its forward (check_attention)
        if memo.path_said is lm.model:
            return
        memo.path_said = lm.model
    fused, n_layers = len(store.fused), len(store.calls)
    where = f"{ids.device.type}, {lm.info.dtype}"
    if fused:
        log.info("%s: attention through the fused kernel on %d of %d layers (%s)", lm.info.name, fused, n_layers,
                 where)
    else:
        log.info("%s: attention through the block path on every layer (%s: no fused kernel serves it)",
                 lm.info.name, where)


def run_with_cache(
    lm: LoadedModel,
    input_ids: torch.Tensor,  # (n,)
    names: Iterable[str] | Filter | None = None,
    listener: LayerListener | None = None,
) -> Captures:
    """One forward over all positions; returns the captured activations by name and each layer's
    kept attention (``layers``); ``timing_ms["forward"]``: the model's forward with everything the
    capture computes on the way, and the layers' assembly. A ``listener`` hears every layer's
    attention as it passes (the live head scores: ``model.scores.live.scored_run``).

    ``names`` keeps only what was asked for (a list of names or a predicate), like
    TransformerLens' ``names_filter``; a pattern asked for by name is rebuilt whole from the
    kept Q and K (small runs only: it is n x n). The caller holds ``lm.lock``.
    """
    wanted = _filter(names)
    ids = input_ids.to(lm.input_device)
    extra = {} if wanted(LOGITS) else last_logits_only(lm)
    with hooked(lm, wanted, listener) as store, torch.inference_mode():
        t0 = time.perf_counter()
        out = lm.model(input_ids=ids[None, :], use_cache=False, **extra)
        t1 = time.perf_counter()
        store.layers = layers_of(lm, [store], listener.sweep if listener is not None else None)
        store.timing_ms["forward"] = 1e3 * (t1 - t0)
        store.timing_ms["assemble"] = 1e3 * (time.perf_counter() - t1)
        publish(store, lm.info.n_layers)
    say_path(lm, store, ids)
    logits = getattr(out, "logits", None)
    if logits is not None and wanted(LOGITS):
        store[LOGITS] = logits[0].float()  # (n, vocab)
    return store
