"""One capture point for every attention: a function registered with transformers'
``AttentionInterface``.

Transformers v5 routes the attention of most families through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``: the attention module
projects and rotates the queries and keys, then calls that function with the
post-rotary Q, K, V, the mask, ``scaling``, ``softcap`` and ``sliding_window``. A model
loaded with ``attn_implementation="attnscope"`` calls :func:`attnscope_attention`
instead, which

* where the mask is causal over the whole sequence (a prefill from position 0, or the last
  query of a decode step), the logits plain q.k x scaling and everything float32 on the CPU,
  runs torch's fused flash kernel (the one SDPA runs; ``model.compat`` says why it is called
  directly and how it is gated), which returns the layer's output and each row's log-sum-exp and
  never a weight; the capture's listener scores the heads from Q, K and lse (``model.scores.live``);
* otherwise (sliding windows, soft-capping, padding, custom mask functions, other dtypes or
  devices, or ``output_attentions``) computes the attention exactly as the families' own
  eager code does (scale, then soft-cap, then mask, softmax in float32; grouped K/V heads
  expanded with ``repeat_interleave``, never tiled), a block of query rows at a time, never
  the whole H x n x n weights of a layer, handing each block's weights to the capture; and
* hands the layer's post-rotary Q and K and each row's log-sum-exp to the capture that is
  active for that attention module, if any (``activate`` / ``deactivate``, used by
  ``model.capture.forward``).

The mask is registered too (``AttentionMaskInterface``): :class:`LazyMask` keeps what
transformers would build a mask from (its mask function, offsets, padding) and
materialises only the rows asked for, with transformers' own ``sdpa_mask``. A layer
therefore never needs its n x n mask at once, and a kept :class:`AttentionCall`
can rebuild any rows of any head later (``model.attention.kept``).

A model that builds on the mask tensor itself (ALiBi Falcon adds its position bias into it) is
loaded as ``attnscope_dense_mask``: the same attention function, with transformers' boolean mask
tensor. The additive mask it then passes is added to the logits as its eager code adds it, and
read back as the causal :class:`LazyMask` plus a per-key bias (every row's visible cells hold
the same bias per key; checked block by block).

Families whose attention does not go through the interface (gpt_neo, bloom)
are loaded with eager attention and captured from their attention module's output
instead (``ArchSpec.capture == "module"``): their Q and K are read from the module's own
projections (``model.families.qk``) and the weights recomputed after the forward.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask

from attnscope.model import compat

IMPLEMENTATION = "attnscope"
DENSE_MASK_IMPLEMENTATION = "attnscope_dense_mask"  # the same attention, transformers' mask tensor
BLOCK_CELLS = 1 << 21  # heads x rows x keys of one block of attention weights (8 MiB of float32)


@dataclass(frozen=True)
class LazyMask:
    """A mask that transformers asked for, materialised a block of query rows at a time.

    ``rows(q0, q1)`` -> bool (B or 1, q1 - q0, kv_length), True where the query may attend.
    """

    kwargs: dict[str, Any]  # what the mask interface received (mask_function, offsets, padding)
    q_length: int
    kv_length: int
    q_offset: int

    def rows(self, q0: int, q1: int) -> torch.Tensor:
        """(B or 1, q1 - q0, kv_length) bool."""
        args = {**self.kwargs, "q_length": q1 - q0, "q_offset": self.q_offset + q0,
                "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False}
        mask = sdpa_mask(**args)
        if mask is None:  # full attention: transformers says no mask is needed
            return torch.ones(1, q1 - q0, self.kv_length, dtype=torch.bool, device=args["device"])
        rows: torch.Tensor = mask[:, 0]  # (B, 1, rows, kv) -> (B, rows, kv)
        return rows

    @property
    def kv_offset(self) -> int:
        return int(self.kwargs.get("kv_offset", 0))

    def fused_causal(self) -> bool | None:
        """How a fused kernel can apply this mask: True for the causal square of a prefill (key j visible
        to query i iff j <= i: SDPA's ``is_causal``), False for the last query of a causal sequence (it
        sees every key), None for anything else (sliding windows, chunks, padding, custom mask functions,
        a chunk after a KV cache): those are built with ``sdpa_mask``, a block of rows at a time."""
        if self.kwargs.get("mask_function") is not causal_mask_function or self.kv_offset != 0:
            return None
        padding = self.kwargs.get("attention_mask")
        if isinstance(padding, torch.Tensor) and not bool(padding[..., : self.kv_length].all()):
            return None
        if self.q_offset == 0 and self.q_length == self.kv_length:
            return True
        if self.q_length == 1 and self.q_offset + 1 == self.kv_length:
            return False
        return None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors it holds (a padding mask, if any)."""
        return sum(v.numel() * v.element_size() for v in self.kwargs.values() if isinstance(v, torch.Tensor))

    def whole(self, n: int) -> LazyMask:
        """The same mask function over a whole sequence of n positions (queries and keys from 0).

        What a recorded generation keeps: its steps saw the sequence a row at a time, with only
        the cached keys; the assembled run sees all of it. A padding mask cannot be extended and
        is refused (captures are a batch of one, never padded).
        """
        padding = self.kwargs.get("attention_mask")
        if isinstance(padding, torch.Tensor) and not bool(padding.all()):
            raise ValueError("a padded sequence cannot be kept as one run")
        kwargs = {**self.kwargs, "q_length": n, "kv_length": n, "kv_offset": 0, "attention_mask": None}
        return LazyMask(kwargs=kwargs, q_length=n, kv_length=n, q_offset=0)

    @staticmethod
    def over(n: int, mask_function: Callable[..., bool], device: torch.device, queries: int | None = None
             ) -> LazyMask:
        """A mask over n positions from a transformers mask function, for the last ``queries`` of them
        (all n by default): families read from their module, a model's own additive mask."""
        q = n if queries is None else queries
        kwargs: dict[str, Any] = {"batch_size": 1, "q_length": q, "kv_length": n, "kv_offset": 0,
                                  "mask_function": mask_function, "attention_mask": None, "device": device}
        return LazyMask(kwargs=kwargs, q_length=q, kv_length=n, q_offset=n - q)


def _lazy_mask(**kwargs: Any) -> LazyMask:
    kwargs.pop("dtype", None)  # a boolean mask: the dtype of an additive one does not apply
    kwargs.pop("config", None)
    q_offset = kwargs.pop("q_offset", 0)
    return LazyMask(kwargs=kwargs, q_length=int(kwargs["q_length"]), kv_length=int(kwargs["kv_length"]),
                    q_offset=int(q_offset))


def mask_rows(mask: Any, q0: int, q1: int, kv: int, device: torch.device) -> torch.Tensor | None:
    """Rows [q0, q1) of whatever mask the model passed: bool (B or 1, rows, kv), or None (no mask).

    Models may pass our LazyMask, a boolean 4-D mask (True = attend) or an additive float
    4-D mask (0 = attend, a very negative number = masked), built by themselves.
    """
    if mask is None:
        return None
    if isinstance(mask, LazyMask):
        return mask.rows(q0, q1)[..., :kv]
    full: torch.Tensor = mask[:, 0] if mask.dim() == 4 else mask  # (B, q, kv): heads broadcast
    m = full[..., q0:q1, :kv]
    if m.dtype != torch.bool:
        m = m > torch.finfo(m.dtype).min / 2  # additive: the masked cells hold ~finfo.min
    return m.to(device)


@dataclass(frozen=True)
class AttentionCall:
    """How one layer's attention turns Q and K into weights: enough to recompute any head exactly."""

    scaling: float
    softcap: float | None
    sliding_window: int | None
    groups: int  # query heads per K/V head
    mask: LazyMask
    bias: torch.Tensor | None = None  # (H, kv) float32 per-key logit bias read from a model's additive mask


def visible_span(allowed: torch.Tensor) -> tuple[int, int]:
    """(..., r, kv) bool -> [lo, hi): the keys any of these rows may see (a causal block skips its
    future, a sliding window its distant past)."""
    cols = allowed.reshape(-1, allowed.shape[-1]).any(0).nonzero()
    if len(cols) == 0:
        return 0, allowed.shape[-1]
    return int(cols[0]), int(cols[-1]) + 1


def block_rows(batch: int, n_heads: int, kv: int, cells: int = BLOCK_CELLS) -> int:
    """Query rows per block so that a block's weights hold about ``cells`` numbers."""
    return max(1, cells // max(1, batch * n_heads * kv))


class CaptureSink(Protocol):
    """Receives one layer's attention during a captured forward."""

    def attention_block(self, layer: int, q0: int, k0: int, weights: torch.Tensor, allowed: torch.Tensor,
                        call: AttentionCall) -> None:
        """Rows [q0, q0 + r) of the forward's queries over keys [k0, k0 + w) (every key they see):
        weights (H, r, w), allowed (r, w). Not called when the fused kernel computed the layer."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, call: AttentionCall,
                  blocks: bool) -> None:
        """After the layer: q (H, q_len, dh), k (Hkv, kv_len, dh) post-rotary, lse (H, q_len) float32;
        ``blocks``: whether ``attention_block`` saw every row's weights (False: the fused kernel)."""


# attention module -> (sink, layer) while a capture is active; weak keys: a module is never kept alive by it
_ACTIVE: weakref.WeakKeyDictionary[nn.Module, tuple[CaptureSink, int]] = weakref.WeakKeyDictionary()
_ACTIVE_LOCK = threading.Lock()


def activate(modules: list[nn.Module], sink: CaptureSink) -> None:
    """Send the attention of these modules (one per layer, in order) to ``sink`` until deactivated."""
    with _ACTIVE_LOCK:
        for layer, module in enumerate(modules):
            _ACTIVE[module] = (sink, layer)


def deactivate(modules: list[nn.Module]) -> None:
    with _ACTIVE_LOCK:
        for module in modules:
            _ACTIVE.pop(module, None)


def active_count() -> int:
    with _ACTIVE_LOCK:
        return len(_ACTIVE)


# What each forward in progress (innermost last) was asked for ``output_attentions``: pushed by a pre-hook
# on every PreTrainedModel of a watched model, popped after its forward (even one that raised). A context
# variable: each thread and task sees only its own forwards.
_OUTPUT_ATTENTIONS: contextvars.ContextVar[tuple[bool, ...]] = contextvars.ContextVar(
    "attnscope_output_attentions", default=())
_WATCHED: weakref.WeakKeyDictionary[nn.Module, list[RemovableHandle]] = weakref.WeakKeyDictionary()
_WATCHED_LOCK = threading.Lock()


def _requested(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """``output_attentions`` as transformers resolves it: the forward's keyword, else the config's."""
    flag = kwargs.get("output_attentions")
    if flag is None:
        flag = getattr(getattr(module, "config", None), "output_attentions", False)
    return bool(flag)


def _push_flag(module: nn.Module, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _OUTPUT_ATTENTIONS.set((*_OUTPUT_ATTENTIONS.get(), _requested(module, kwargs)))


def _pop_flag(_module: nn.Module, _args: tuple[Any, ...], _output: Any) -> None:
    _OUTPUT_ATTENTIONS.set(_OUTPUT_ATTENTIONS.get()[:-1])


def watch_output_flag(model: nn.Module) -> Callable[[], None]:
    """Hook every PreTrainedModel inside ``model`` (itself included) so that the attention function knows
    whether this forward asked for ``output_attentions`` (some families pass the keyword down to it,
    others pop it and record the weights from the module's output). Public module hooks only; idempotent.
    Returns what removes the hooks this call added (nothing, if the model was already watched)."""
    added: list[nn.Module] = []
    with _WATCHED_LOCK:
        for sub in model.modules():
            if isinstance(sub, PreTrainedModel) and sub not in _WATCHED:
                _WATCHED[sub] = [sub.register_forward_pre_hook(_push_flag, with_kwargs=True),
                                 sub.register_forward_hook(_pop_flag, always_call=True)]
                added.append(sub)

    def unwatch() -> None:
        with _WATCHED_LOCK:
            for sub in added:
                for handle in _WATCHED.pop(sub, []):
                    handle.remove()

    return unwatch


def wants_weights(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """Did the caller ask the model for ``output_attentions``? The innermost watched forward in progress
    says (``watch_output_flag``); an attention called outside one (a model nobody watched, a module
    called on its own) reads its own keyword, then its config."""
    stack = _OUTPUT_ATTENTIONS.get()
    return stack[-1] if stack else _requested(module, kwargs)


def fused_causal(attention_mask: Any) -> bool | None:
    """``is_causal`` for the fused kernel from whatever mask the model passed (None: not fusable)."""
    if attention_mask is None:
        return False  # no mask: every key visible
    return attention_mask.fused_causal() if isinstance(attention_mask, LazyMask) else None


def flash_attention(
    query: torch.Tensor,  # (B, H, q, dh)
    key: torch.Tensor,  # (B, Hkv, kv, dh)
    value: torch.Tensor,  # (B, Hkv, kv, dv)
    scaling: float,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, H, q, dv), lse (B, H, q) float32) of plain dot-product attention, never the weights.

    Head h reads K/V head h // (H / Hkv), as ``repeat_interleave`` groups them; ``is_causal``: key j
    visible to query i iff j <= i. The fused kernel where this torch build has one for the device and dtype
    and the head sizes match (``model.compat``: the CPU's, CUDA's memory-efficient one), else
    :func:`blocked_attention`: the same numbers from public ops."""
    if (value.shape[-1] == query.shape[-1] and query.dtype == key.dtype == value.dtype
            and compat.fused_on(query.device, query.dtype)):
        try:  # the kernel passed its check on a small input; a shape it still refuses takes the block path
            return compat.fused_attention(query, key, value, scaling, is_causal)
        except RuntimeError as err:
            compat.refused(query, err)
    return blocked_attention(query, key, value, scaling, is_causal)


def blocked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                      is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attention`'s result (its shapes) from public operators, a block of query rows at a time (a
    block's weights hold about ``BLOCK_CELLS`` numbers, float32): output in the value's dtype."""
    batch, n_heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    groups = n_heads // key.shape[1]
    k = key.float().repeat_interleave(groups, dim=1)  # (B, H, kv, dh)
    v = value.float().repeat_interleave(groups, dim=1)  # (B, H, kv, dv)
    out = torch.empty(batch, n_heads, q_len, value.shape[-1], dtype=value.dtype, device=value.device)
    lse = torch.empty(batch, n_heads, q_len, dtype=torch.float32, device=query.device)
    step = block_rows(batch, n_heads, kv_len)
    for q0 in range(0, q_len, step):
        q1 = min(q_len, q0 + step)
        hi = min(kv_len, q1) if is_causal else kv_len  # keys any of these rows sees
        logits = torch.matmul(query[:, :, q0:q1].float(), k[:, :, :hi].transpose(-1, -2)).mul_(scaling)
        if is_causal:  # (r, hi): key j > query i is masked
            rows = torch.arange(q0, q1, device=query.device)[:, None]
            logits.masked_fill_(torch.arange(hi, device=query.device)[None, :] > rows, float("-inf"))
        part = logits.logsumexp(-1)  # (B, H, r)
        weights = logits.sub_(part.unsqueeze(-1)).exp_().nan_to_num_(0.0)  # a row with no key: zeros
        out[:, :, q0:q1] = torch.matmul(weights, v[:, :, :hi]).to(value.dtype)
        lse[:, :, q0:q1] = part
    return out, lse


class AdditiveMask:
    """A model's additive float mask (B, H or 1, q, kv) read as the causal mask plus a per-key bias.

    ALiBi Falcon's: its bias (slope_h x key position, scaled) where a key is visible, finfo.min where
    not. ``bias`` is the last query's row (it sees every key of a causal mask); each block of rows is
    checked against the causal mask and that bias as it passes, and ``exact`` says whether all matched."""

    def __init__(self, mask: torch.Tensor, n_heads: int) -> None:
        self.mask = mask
        q_len, kv_len = mask.shape[-2], mask.shape[-1]
        self.causal = LazyMask.over(kv_len, causal_mask_function, mask.device, queries=q_len)
        last = mask[0, :, -1].float()  # (H or 1, kv)
        self.bias: torch.Tensor | None = last.expand(n_heads, -1).contiguous() if bool(last.any()) else None
        self.exact = True

    def rows(self, q0: int, q1: int, lo: int, hi: int) -> torch.Tensor:
        """(B, H or 1, r, w) float32: what the model adds to the logits of rows [q0, q1) over keys [lo, hi)."""
        return self.mask[:, :, q0:q1, lo:hi].float()

    def check(self, q0: int, q1: int, allowed: torch.Tensor, lo: int, added: torch.Tensor) -> None:
        """Rows [q0, q1): visible keys ``allowed`` (B, r, kv) and the values ``added`` (B, H or 1, r, w)
        over keys [lo, lo + w): are they the causal mask's, and the bias on every visible key?"""
        if not self.exact:
            return
        if not torch.equal(self.causal.rows(q0, q1), allowed[:1]):
            self.exact = False
            return
        hi = lo + added.shape[-1]
        bias = (self.bias[None, :, None, lo:hi] if self.bias is not None
                else torch.zeros((), dtype=added.dtype, device=added.device))
        self.exact = bool(torch.where(allowed[:1, None, :, lo:hi], added[:1], bias).eq(bias).all())


class Grabbed(Exception):
    """Raised inside :func:`attnscope_attention` once a :func:`grab_qk` reader has the call's Q and K: the
    attention itself (and the rest of the module) is skipped."""


# (module, reader): the attention module whose next call hands its post-rotary Q, K to reader and stops
_GRAB: contextvars.ContextVar[tuple[nn.Module, Callable[[torch.Tensor, torch.Tensor], None]] | None] = (
    contextvars.ContextVar("attnscope_grab_qk", default=None))


@contextmanager
def grab_qk(module: nn.Module, reader: Callable[[torch.Tensor, torch.Tensor], None]) -> Iterator[None]:
    """Inside the ``with`` (this thread or task only), a call of ``module`` gives ``reader`` the post-rotary
    query (B, H, q, dh) and key (B, Hkv, kv, dh) the capture point receives, then raises :class:`Grabbed`:
    how the QK attribution (``model.tools.qk``) runs a layer's own projections, norms and rotary on inputs
    of its choosing, whatever the family, without its attention."""
    token = _GRAB.set((module, reader))
    try:
        yield
    finally:
        _GRAB.reset(token)


def can_fuse(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, softcap: float | None) -> bool:
    """The fused kernel computes this layer as the eager code does: on the CPU in float32, bfloat16 or
    float16 where this build's kernel takes that dtype (``model.compat.fused_dtypes``; its products
    accumulate in float32, as the eager code's float32 softmax does), on CUDA where the memory-efficient
    kernel passed its check on that device and dtype (``model.compat.cuda_fused_ok``), no soft-cap, values
    as wide as the keys (a soft-capped family, another device runs the block path), and this torch build
    has it (``model.compat.fused_on``: else the block path, public ops only)."""
    return (softcap is None and value.shape[-1] == query.shape[-1]
            and query.dtype == key.dtype == value.dtype and compat.fused_on(query.device, query.dtype))


def attnscope_attention(
    module: nn.Module,
    query: torch.Tensor,  # (B, H, q, dh)
    key: torch.Tensor,  # (B, Hkv, kv, dh)
    value: torch.Tensor,  # (B, Hkv, kv, dv)
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The eager attention of every interface family, a block of query rows at a time.

    Each block's weights are computed exactly as the families' eager code does (scale, then
    soft-cap, then mask, softmax in float32; grouped K/V heads expanded with
    ``repeat_interleave``, never tiled), multiplied into the values, handed to the active
    capture (if any) with their log-sum-exp, and dropped: the layer never holds its H x n x n
    weights at once. A model's own additive mask is added after the scale (and soft-cap), as its
    eager code adds it, and kept as the causal mask plus a per-key bias (``AdditiveMask``).
    Returns (output (B, q, H, dv) in the value's dtype, None): like SDPA, it
    returns no weights — a kept run rebuilds them from Q and K (``model.attention``) — unless
    the caller asked the model for ``output_attentions``: then (B, H, q, kv) in the query's dtype,
    as eager attention returns them.
    """
    grab = _GRAB.get()
    if grab is not None and grab[0] is module:
        grab[1](query, key)
        raise Grabbed
    batch, n_heads, q_len, d_head = query.shape
    kv_len = key.shape[2]
    additive = None  # a model's own additive mask (ALiBi Falcon's), read as causal + per-key bias
    if isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point():
        additive = AdditiveMask(attention_mask, n_heads)
    call = AttentionCall(
        scaling=float(d_head**-0.5 if scaling is None else scaling),
        softcap=float(softcap) if softcap else None,
        sliding_window=sliding_window,
        groups=n_heads // key.shape[1],
        mask=attention_mask if additive is None else additive.causal,
        bias=None if additive is None else additive.bias,
    )
    target = _ACTIVE.get(module)  # a dict read (writes hold _ACTIVE_LOCK)
    if target is not None and batch != 1:
        raise ValueError("attnscope captures one sequence at a time (a batch of 1)")
    causal = fused_causal(attention_mask) if can_fuse(query, key, value, call.softcap) else None
    wanted = wants_weights(module, kwargs)
    if causal is not None and not wanted:
        # the fused kernel: the layer's output and each row's lse, never a block of weights; the
        # capture's listener scores the heads from Q, K and lse (model.scores.live)
        out, lse = flash_attention(query, key, value, call.scaling, causal)  # (B, H, q, dv), (B, H, q)
        if target is not None:
            sink, layer = target
            sink.attention(layer, query[0].detach(), key[0].detach(), lse[0], call, blocks=False)
        return out.transpose(1, 2), None
    k = key.float().repeat_interleave(call.groups, dim=1)  # (B, H, kv, dh): head h reads K/V head h // groups
    v = value.repeat_interleave(call.groups, dim=1)  # (B, H, kv, dv)
    output = torch.empty(batch, n_heads, q_len, value.shape[-1], dtype=value.dtype, device=value.device)
    every = None  # the whole weights, only when the caller asked for them
    if wanted:
        every = torch.empty(batch, n_heads, q_len, kv_len, dtype=query.dtype, device=query.device)
    step = block_rows(batch, n_heads, kv_len)
    parts = []  # each block's lse (B, H, r)
    for q0 in range(0, q_len, step):
        q1 = min(q_len, q0 + step)
        allowed = mask_rows(attention_mask, q0, q1, kv_len, query.device)  # (B or 1, r, kv)
        lo, hi = (0, kv_len) if allowed is None else visible_span(allowed)  # keys any of these rows sees
        logits = torch.matmul(query[:, :, q0:q1].float(), k[:, :, lo:hi].transpose(-1, -2))  # (B, H, r, w)
        logits.mul_(call.scaling)
        if call.softcap is not None:
            logits = torch.tanh(logits.div_(call.softcap)).mul_(call.softcap)
        if additive is not None:
            added = additive.rows(q0, q1, lo, hi)  # (B, H or 1, r, w)
            logits.add_(added)
            if target is not None and allowed is not None:
                additive.check(q0, q1, allowed, lo, added)
        if allowed is not None:
            allowed = allowed[..., lo:hi]
            logits.masked_fill_(~allowed.unsqueeze(1), float("-inf"))
        lse = logits.logsumexp(-1)  # (B, H, r)
        parts.append(lse)
        weights = logits.sub_(lse.unsqueeze(-1)).exp_()  # (B, H, r, w) float32, in place
        if not bool(torch.isfinite(lse).all()):
            weights.nan_to_num_(0.0)  # a row with no visible key (cannot happen for a causal row): zeros
        output[:, :, q0:q1] = torch.matmul(weights.to(value.dtype), v[:, :, lo:hi])
        if every is not None:
            every[:, :, q0:q1].zero_()
            every[:, :, q0:q1, lo:hi] = weights
        if target is not None:
            sink, layer = target
            seen = allowed[0] if allowed is not None else torch.ones(q1 - q0, hi - lo, dtype=torch.bool,
                                                                      device=query.device)
            sink.attention_block(layer, q0, lo, weights[0], seen, call)
    if target is not None:
        sink, layer = target
        lse_all = torch.cat(parts, dim=-1) if parts else torch.empty(batch, n_heads, 0)  # (B, H, q)
        if additive is not None and not additive.exact:  # not causal + a per-key bias: the sink refuses it
            call = dataclasses.replace(call, mask=attention_mask, bias=None)
        sink.attention(layer, query[0].detach(), key[0].detach(), lse_all[0], call, blocks=True)
    return output.transpose(1, 2), every


_REGISTER_LOCK = threading.Lock()


def register() -> None:
    """Make ``attn_implementation="attnscope"`` (and ``"attnscope_dense_mask"``) available (idempotent)."""
    with _REGISTER_LOCK:
        registered = AttentionInterface()  # a view of the library-wide mapping (public: a MutableMapping)
        if IMPLEMENTATION not in registered:
            AttentionInterface.register(IMPLEMENTATION, attnscope_attention)
            AttentionMaskInterface.register(IMPLEMENTATION, _lazy_mask)
        if DENSE_MASK_IMPLEMENTATION not in registered:
            AttentionInterface.register(DENSE_MASK_IMPLEMENTATION, attnscope_attention)
            AttentionMaskInterface.register(DENSE_MASK_IMPLEMENTATION, sdpa_mask)


