"""Capture activations for one forward: the attention through ``model.capture``,
the residual stream with temporary forward hooks.

Hooks are global state on the model (TransformerLens' lesson): they are registered
for one forward and always removed in ``finally``, so nothing piles up between
requests. Names follow TransformerLens and are built by ``model.names.act_name``; the
table of names and shapes is there.

Every captured tensor is float32 (a copy when the model runs in another dtype, or
when the model later writes into the tensor in place), detached, on the device of
the layer that produced it. ``attn_out`` / ``mlp_out`` are the contributions as
``model/families/table.py`` defines them per family (normed for sandwich blocks, scaled for
Granite).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscope.model import compat
from attnscope.model.capture import interface as capture
from attnscope.model.capture.hooks import Registration, temporary_hooks
from attnscope.model.capture.interface import AttentionCall, LazyMask
from attnscope.model.capture.names import KINDS, LOGITS, act_name, kind_of
from attnscope.model.errors import AttentionUnavailable
from attnscope.model.families import qk as module_qk
from attnscope.model.families.qk import ModuleQK
from attnscope.model.load.models import LoadedModel
from attnscope.model.runs import attention
from attnscope.model.runs.attention import LayerAttention
from attnscope.model.scores import pairs as pair_scores
from attnscope.model.scores.analysis import HeadScore, ScoreAccumulator

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


class Captures(dict[str, torch.Tensor]):
    """Activations by name, plus each layer's attention record (``records``), filled during forwards.

    With ``scores`` set (ids given), a full forward through the capture point also accumulates
    every head's scores (``accumulators``): from each block of weights as it passes, or, where the
    fused kernel computed the layer, from Q, K and lse (``model.pair_scores``), leaving entropy and
    peak to ``finish``. ``timing_ms`` splits the time of ``run_with_cache``.
    """

    def __init__(self, wanted: Filter, ids: torch.Tensor | None = None) -> None:
        super().__init__()
        self.wanted = wanted
        self.records: dict[int, LayerRecord] = {}
        self.calls: dict[int, AttentionCall] = {}
        self.ids = ids
        self.accumulators: dict[int, ScoreAccumulator] = {}
        self._pairs: pair_scores.InductionPairs | None = None
        self.timing_ms: dict[str, float] = {}
        self.layers: list[LayerAttention] = []  # filled by run_with_cache / finish
        self.head_scores: list[HeadScore] | None = None
        # layers whose scores were left for later (``finish(..., pending=...)``): the fields owed
        self.pending: dict[int, frozenset[str]] = {}
        # leave a fused layer's previous-token, first-token and induction to that later sweep too
        self.defer_pairs = False

    def _scored(self, call: AttentionCall) -> bool:
        """Does this layer's attention feed the head scores (a forward over the whole run from 0)?"""
        mask = call.mask
        return (self.ids is not None and isinstance(mask, LazyMask) and mask.q_offset == 0 and mask.kv_offset == 0
                and mask.kv_length == mask.q_length == self.ids.shape[0])

    def attention_block(self, layer: int, q0: int, k0: int, weights: torch.Tensor, allowed: torch.Tensor,
                        call: AttentionCall) -> None:
        """The capture point's callback for rows [q0, q0 + r) over keys [k0, k0 + w): weights (H, r, w)."""
        if self.ids is not None and self._scored(call):
            if layer not in self.accumulators:
                self.accumulators[layer] = ScoreAccumulator(weights.shape[0], self.ids)
            self.accumulators[layer].add(q0, weights, k0)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, call: AttentionCall,
                  blocks: bool) -> None:
        """The capture point's callback after a layer: q (H, r, dh), k (Hkv, kv, dh), lse (H, r).

        After the block path the layer's scores are complete; after the fused kernel (every causal
        pair visible, no soft-cap) previous-token, first-token and induction are summed here from
        single dot products, and entropy and peak are left to ``finish`` -- or, with ``defer_pairs``,
        every field is left (the analyse answers first; ``model.late_scores`` computes them)."""
        self.calls[layer] = call
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
        if blocks and layer in self.accumulators:
            self.accumulators[layer].todo.clear()  # every row's weights went through add()
        elif not blocks and self.ids is not None and self._scored(call):
            acc = ScoreAccumulator(q.shape[0], self.ids)  # with defer_pairs, every field is owed
            if not self.defer_pairs:
                if self._pairs is None:
                    self._pairs = pair_scores.InductionPairs.of(self.ids)
                scaling, softcap = call.scaling, call.softcap
                prev, first = pair_scores.prev_first_sums(q, k, lse, scaling=scaling, softcap=softcap)
                induction = pair_scores.induction_sums(q, k, lse, self._pairs, scaling=scaling, softcap=softcap)
                acc.add_sums(prev=prev, first=first, induction=induction)
            self.accumulators[layer] = acc
        self.records[layer] = LayerRecord(q=q.float(), k=added, lse=lse, scaling=call.scaling,
                                          softcap=call.softcap, groups=call.groups, bias=call.bias, mask=mask)

    def module_attention(self, layer: int, qk: ModuleQK) -> None:
        """A module-read family's Q and K (model.module_qk), from the attention module's input."""
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
        q = torch.cat([r.q for r in recs], dim=1)  # (H, n, dh)
        k = torch.cat([r.k for r in recs], dim=1)  # (Hkv, n, dh)
        n = q.shape[1]
        lse = None if any(r.lse is None for r in recs) else torch.cat([r.lse for r in recs if r.lse is not None], 1)
        bias = recs[-1].bias
        if bias is not None and bias.shape[-1] != n:
            raise ValueError(f"layer {i}: an ALiBi bias over {bias.shape[-1]} keys for {n} positions")
        first = recs[0]
        layers.append(attention.build(q, k, scaling=first.scaling, softcap=first.softcap, groups=first.groups,
                                      bias=bias, mask=first.mask.whole(n), lse=lse,
                                      scores=scores(i) if scores is not None else None))
    return layers


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
        reader = module_qk.READERS[lm.model.config.model_type]

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
           ids: torch.Tensor | None = None) -> Iterator[Captures]:
    """Hooks live only inside the ``with``: every forward run there fills the dict and ``records``.

    With the KV cache a step's forward sees one new query: its record then holds one query
    and one new key per layer, and its residual tensors are (1, d_model). ``ids`` (n,) asks a
    full forward through the capture point to accumulate head scores as it goes.
    """
    store = Captures(_filter(names), ids)
    attention_modules = [block.get_submodule(lm.spec.attn) for block in lm.blocks]
    with temporary_hooks(_registrations(lm, store)):
        try:
            if lm.spec.capture == "interface":
                capture.activate(attention_modules, store)
            yield store
        finally:
            capture.deactivate(attention_modules)


def publish(store: Captures, n_layers: int) -> None:
    """Put what was asked for by name from the kept layers: dense patterns (small runs), Q and K."""
    for i, layer in enumerate(store.layers[:n_layers]):
        if store.wanted(name := act_name("pattern", i)):
            store[name] = layer.dense()  # (H, n, n)
        if store.wanted(name := act_name("rot_q", i)):
            store[name] = layer.q
        if store.wanted(name := act_name("rot_k", i)):
            store[name] = layer.k


def complete(acc: ScoreAccumulator, kept: LayerAttention, pairs: pair_scores.InductionPairs | None = None) -> None:
    """The scores a fused forward left, exactly: on a fused causal layer from Q, K and lse
    (``model.pair_scores``: previous-token, first-token and induction from single dot products, entropy
    and peak with one more pass of the fused kernel), else with one more pass over the visible cells.
    ``pairs``: the run's induction pairs, if the caller has them (one run's layers share them)."""
    if not acc.todo:
        return
    if kept.fused_causal and kept.lse is not None:
        q, k, lse, todo = kept.q, kept.k, kept.lse, acc.todo
        sums: dict[str, torch.Tensor] = {}
        if todo & {"prev", "first"}:
            sums["prev"], sums["first"] = pair_scores.prev_first_sums(q, k, lse, scaling=kept.scaling, softcap=None)
        if "induction" in todo:
            pairs = pairs if pairs is not None else pair_scores.InductionPairs.of(acc.ids)
            sums["induction"] = pair_scores.induction_sums(q, k, lse, pairs, scaling=kept.scaling, softcap=None)
        if todo & {"entropy", "peak"}:
            sums["entropy"], sums["peak"] = pair_scores.entropy_and_peak(q, k, lse, kept.scaling)
        acc.add_sums(**{field: value for field, value in sums.items() if field in todo})
        return
    for q0, _q1, weights, _visible in kept.blocks():
        acc.add(q0, weights)
    acc.todo.clear()


def finish(lm: LoadedModel, forwards: list[Captures], ids: torch.Tensor | None,
           timing: dict[str, float] | None = None,
           pending: dict[int, frozenset[str]] | None = None) -> tuple[list[LayerAttention], list[HeadScore] | None]:
    """The kept attention of these forwards and, when ``ids`` are given, every head's scores
    (exact over all rows: from the forward's own blocks or Q, K and lse where it had them, then the
    fields left by a fused forward, else from one sweep). ``timing`` gets "exact_scores": the ms of
    that sweep (fields left by the fused kernel, or every field of a recorded generation).

    With ``pending`` (a dict to fill), the fields a fused forward left (entropy and peak; every field
    where the forward deferred its pair scores too: ``Captures.defer_pairs``) are not computed here:
    their heads' fields are None and ``pending[layer]`` names them, for ``model.late_scores`` to compute
    exactly from the kept layer after the caller has answered."""
    n_layers = lm.info.n_layers
    missing = [i for i in range(n_layers) if any(i not in f.records for f in forwards)]
    if missing:
        raise AttentionUnavailable(
            f"{act_name('pattern', missing[0])}: the attention never reached attnscope's capture point (the "
            f"model runs {compat.attention_implementation(lm.model)!r} attention); attnscope needs "
            f"attn_implementation={lm.spec.attn_implementation!r}",
            params={"layer": missing[0], "implementation": str(compat.attention_implementation(lm.model)),
                    "needs": lm.spec.attn_implementation})
    inline = forwards[0].accumulators if len(forwards) == 1 else {}
    swept: dict[int, ScoreAccumulator] = {}

    def feed(layer: int) -> Callable[[int, torch.Tensor], None] | None:
        if ids is None or layer in inline:
            return None
        swept[layer] = ScoreAccumulator(lm.info.n_heads, ids)
        return swept[layer].add

    t0 = time.perf_counter()
    layers = assemble(forwards, n_layers, feed)
    t1 = time.perf_counter()
    if ids is None:
        return layers, None
    for i, acc in inline.items():
        if pending is not None and acc.todo:
            pending[i] = frozenset(acc.todo)
        else:
            complete(acc, layers[i])
    if timing is not None:
        timing["exact_scores"] = 1e3 * (time.perf_counter() - t1 + (t1 - t0 if swept else 0.0))
    left = pending if pending is not None else {}
    return layers, [s for i in range(n_layers)
                    for s in (inline[i] if i in inline else swept[i]).finish(i, left.get(i, frozenset()))]


def last_logits_only(lm: LoadedModel) -> dict[str, int]:
    """``logits_to_keep=1`` where the model takes it: the (n, vocab) logits are never built whole."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(lm.model.forward).parameters else {}


def run_with_cache(
    lm: LoadedModel,
    input_ids: torch.Tensor,  # (n,)
    names: Iterable[str] | Filter | None = None,
    scores: bool = False,
    defer: bool = False,
) -> Captures:
    """One forward over all positions; returns the captured activations by name, each layer's
    kept attention (``layers``) and, with ``scores``, every head's scores (``head_scores``);
    ``timing_ms``: "forward" (the model's forward with everything the capture computes on the way)
    and "exact_scores" (the sweep after it for the scores that need every cell again).
    With ``defer``, that sweep is left out, and so are the fused layers' previous-token, first-token and
    induction sums (about a third of the capture's own cost at 1k tokens): the fields owed are None in
    ``head_scores`` and named by layer in ``pending`` (``model.late_scores`` computes them later, exactly,
    from the kept layers).

    ``names`` keeps only what was asked for (a list of names or a predicate), like
    TransformerLens' ``names_filter``; a pattern asked for by name is rebuilt whole from the
    kept Q and K (small runs only: it is n x n). The caller holds ``lm.lock``.
    """
    wanted = _filter(names)
    ids = input_ids.to(lm.input_device)
    extra = {} if wanted(LOGITS) else last_logits_only(lm)
    with hooked(lm, wanted, ids if scores else None) as store, torch.inference_mode():
        store.defer_pairs = defer
        t0 = time.perf_counter()
        out = lm.model(input_ids=ids[None, :], use_cache=False, **extra)
        store.layers, store.head_scores = finish(lm, [store], ids if scores else None, store.timing_ms,
                                                 store.pending if defer else None)
        store.timing_ms["forward"] = 1e3 * (time.perf_counter() - t0) - store.timing_ms.get("exact_scores", 0.0)
        publish(store, lm.info.n_layers)
    logits = getattr(out, "logits", None)
    if logits is not None and wanted(LOGITS):
        store[LOGITS] = logits[0].float()  # (n, vocab)
    return store
