"""QK attribution: why a head attends from a query to a key.

A head's pre-softmax logit is z(i, j) = scaling x q_i . k_j (+ a position bias such as ALiBi's, then an
optional soft-cap). Both q_i and k_j are read from the residual stream that every earlier component
wrote into: the embeddings, each earlier head's own output (its ``z`` through its slice of ``W_O``),
each output projection's bias and each earlier MLP. With the layer's input norm frozen at its scale on
this run (the convention of direct logit attribution, ``model.tools.attribution``), and any norm inside
the attention (Q/K norms) frozen the same way, the map from the residual at position p to q_p (or k_p)
is affine: x -> J_p x + c_p, rotary positions included, because the rotation of position p is a fixed
linear map. So

    z(i, j) - bias = sum over query-side components a and key-side components b of scaling x q_a . k_b

where q_a = J_i N_i(c_a,i), k_b = J_j N_j(c_b,j), and two constant entries on each side: the frozen norm's
shift (``norm_shift``) and the projection's own bias after rotation (``proj_bias``, the image of a zero
input). Grouped K/V heads are respected: head h reads K/V head h // (H / Hkv).

How it is computed, whatever the family: the layer's own attention module is called again on inputs of
our choosing with the kwargs the forward gave it (its rotary cos/sin, offsets), and
``model.attention.interface.grab_qk`` reads the post-rotary Q and K at the capture point and stops the
call there. J is read by autograd: one backward per query-head dimension for J_i (the query side), one
backward of sum_j q_i . k_j for a whole row's key side (its gradient at position j is J_j^T q_i), one per
key-head dimension for J_j when a single key's full matrix is asked for. No family's weight layout,
rotary convention or Q/K norm is re-implemented here; the terms are checked against the logit the model
computed (``error``), never adjusted to fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn

from attnscope.model.attention.interface import Grabbed, grab_qk
from attnscope.model.capture.hooks import Registration, temporary_hooks
from attnscope.model.errors import BadInput
from attnscope.model.load.models import LoadedModel
from attnscope.model.results import Matrix, Vector
from attnscope.model.runs.record import RunRecord
from attnscope.model.tools.attribution import attention_terms, norm_affine, norm_eps
from attnscope.model.tools.intervene import (
    head_weights,
    hidden_arg,
    out_proj,
    require_decoder,
    split_heads,
    with_hidden,
)

ComponentKind = Literal["embed", "head", "out_bias", "mlp", "norm_shift", "proj_bias", "clip"]


@dataclass(frozen=True, slots=True)
class Component:
    """One thing that wrote into the residual stream before the layer (or one constant of the layer)."""

    kind: Annotated[ComponentKind, Field(description=(
        "embed: the embeddings (token and learned positions); head: one earlier head's own output; out_bias: an "
        "earlier attention output projection's bias; mlp: an earlier MLP; norm_shift: the frozen input norm's "
        "shift (LayerNorm's bias) carried through the projection; proj_bias: the Q or K projection's own bias "
        "after rotation (what a zero input gives); clip: what the family's clipping of Q and K (OLMo's clip_qkv) "
        "changed, the one step before the attention that is not affine"))]
    layer: Annotated[int | None, Field(description="the earlier block, for head, out_bias and mlp; else null")]
    head: Annotated[int | None, Field(description="the head, for kind head; else null")]

    @property
    def label(self) -> str:
        if self.kind == "head":
            return f"L{self.layer}H{self.head}"
        if self.kind in ("mlp", "out_bias"):
            return f"{self.kind}{self.layer}"
        return self.kind


@dataclass(frozen=True)
class QKAttribution:
    """One head's logits from ``query`` to ``keys``, split by upstream component on either side.

    Tensors, float64 on the CPU: ``query_side`` (K, C) is each query-side component against the whole key,
    ``key_side`` (K, C) the whole query against each key-side component; each row of either sums to
    ``logit - position_bias`` up to ``error``. ``matrix`` (C, C), for a single key only: query-side
    component x key-side component; it sums to the same."""

    layer: int
    head: int
    query: int
    keys: Annotated[Vector, Field(description="the key positions, ascending (one, or every key the query sees)")]
    components: Annotated[list[Component], Field(description=(
        "the upstream components, in this order on both sides: embed, then per earlier layer its heads, its "
        "out_bias (if the projection has one) and its mlp, then norm_shift and proj_bias (and clip where the family "
        "clips Q and K)"))]
    query_side: Annotated[Matrix, Field(description=(
        "[key][component]: scaling x (query-side component's q) . (the whole k of that key)"))]
    key_side: Annotated[Matrix, Field(description=(
        "[key][component]: scaling x (the whole q) . (key-side component's k at that key)"))]
    matrix: Annotated[Matrix | None, Field(description=(
        "[query-side component][key-side component] for a single key; null for a row of keys"))]
    logit: Annotated[Vector, Field(description=(
        "per key, the model's logit before any soft-cap: scaling x q.k (+ position bias) (kept Q, K)"))]
    position_bias: Annotated[Vector, Field(description="per key, ALiBi's per-key bias in logit units (0 without one)")]
    capped: Annotated[Vector, Field(description=(
        "per key, the logit the softmax saw: soft-capped (c x tanh(logit / c)) where the family caps, else logit"))]
    softcap: Annotated[float | None, Field(description="the attention logits' soft-cap c, if the family has one")]
    weight: Annotated[Vector, Field(description="per key, the head's attention weight from the query to it")]
    error: Annotated[Vector, Field(description=(
        "per key, logit minus (the terms + position bias): the largest residue over query side, key side and matrix"))]

    def top(self, count: int = 10, side: Literal["query", "key"] = "key", key: int | None = None
            ) -> list[tuple[Component, float]]:
        """The ``count`` largest terms (by size) of one side for one key (default: the first, or only, key)."""
        row = 0 if key is None else int((self.keys == key).nonzero()[0, 0]) if bool((self.keys == key).any()) else -1
        if row < 0:
            raise BadInput(f"key {key} is not among this attribution's keys", params={"key": key})
        values = (self.query_side if side == "query" else self.key_side)[row]
        order = values.abs().argsort(descending=True)[:count]
        return [(self.components[int(c)], float(values[c])) for c in order]


@dataclass
class _Trace:
    """What one forward over the prefix gave: each earlier layer's z, the layer's attention call and input."""

    z: list[torch.Tensor]  # per earlier layer (m, H, dh)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    hidden: torch.Tensor  # (1, m, d) the attention's input (the normed residual)
    norm: nn.Module | None  # the module whose output the attention read, if one
    inner: list[tuple[nn.Module, torch.Tensor, torch.Tensor]]  # norms inside the attention: (module, in, out)


class _Stop(Exception):
    pass


def _attention(lm: LoadedModel, layer: int) -> nn.Module:
    """The layer's attention module itself (``ArchSpec.attn``: what calls the capture point), not the module
    whose output the block adds (a sandwich family's post-attention norm)."""
    return lm.blocks[layer].get_submodule(lm.spec.attn)


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() and not any(True for _ in module.children())


def _trace(lm: LoadedModel, layer: int, ids: torch.Tensor) -> _Trace:
    """One forward over ``ids`` (m,), stopped after the attention of ``layer`` has run."""
    attn = _attention(lm, layer)
    block = lm.blocks[layer]
    inside = {id(m) for m in attn.modules()}
    z: dict[int, torch.Tensor] = {}
    outputs: list[tuple[nn.Module, torch.Tensor]] = []
    inner: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
    call: dict[str, Any] = {}

    def saver(i: int) -> Any:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            z[i] = split_heads(args[0][0].detach(), lm.info.n_heads)

        return hook

    def norm_out(module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor):
            outputs.append((module, output))

    def inner_out(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
            inner.append((module, args[0].detach(), output.detach()))

    def before(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call["args"], call["kwargs"] = args, kwargs

    def after(_module: nn.Module, _args: tuple[Any, ...], _output: Any) -> None:
        raise _Stop

    regs = [Registration(out_proj(lm, i), "pre", saver(i)) for i in range(layer)]
    regs += [Registration(m, "post", norm_out) for m in block.modules() if id(m) not in inside and _is_norm(m)]
    regs += [Registration(m, "post", inner_out) for m in attn.modules() if _is_norm(m)]
    regs += [Registration(attn, "pre_kwargs", before), Registration(attn, "post", after)]
    try:
        with temporary_hooks(regs), torch.no_grad():
            lm.model(input_ids=ids[None].to(lm.input_device), use_cache=False)
    except _Stop:
        pass
    given = hidden_arg(call["args"], call["kwargs"])  # the tensor itself: the norm that made it is found by identity
    norm = next((m for m, out in outputs if out is given), None)
    return _Trace([z[i] for i in range(layer)], call["args"], call["kwargs"], given.detach(), norm, inner)


@dataclass(frozen=True)
class RowNorm:
    """A norm frozen at each row's own scale: y = centre(x) * scale + shift, scale and shift shaped like x."""

    center: bool
    scale: torch.Tensor  # (..., d) float64
    shift: torch.Tensor  # (..., d) float64

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x shaped like the scale (or broadcast to it) -> the frozen norm's output, in x's dtype and device."""
        return self._centred(x) * self.scale.to(x) + self.shift.to(x)

    def transpose(self, g: torch.Tensor) -> torch.Tensor:
        """(m, d) covectors -> (m, d): through the linear part's transpose (centring is symmetric)."""
        return self._centred(g.double() * self.scale)

    def _centred(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True) if self.center else x


def freeze_rows(norm: nn.Module | None, x: torch.Tensor, y: torch.Tensor) -> RowNorm:
    """The affine map ``norm`` applied to each row of ``x`` (..., d), told by its output ``y``: LayerNorm (centre,
    weight, bias) or RMSNorm with ``weight`` (Llama) or ``1 + weight`` (Gemma), the one that reproduces ``y``."""
    xd, yd = x.double().cpu(), y.double().cpu()
    d = xd.shape[-1]
    if norm is None:
        return RowNorm(False, torch.ones_like(xd), torch.zeros_like(xd))
    eps = norm_eps(norm)
    w, b = norm_affine(norm, d)
    centred = xd - xd.mean(-1, keepdim=True)
    ln_sigma = (centred.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    rms = (xd.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    shift = b.expand_as(xd)
    candidates = [RowNorm(True, w / ln_sigma, shift), RowNorm(False, w / rms, shift),
                  RowNorm(False, (1 + w) / rms, shift)]
    misses = [float((c.apply(xd) - yd).abs().max()) if xd.numel() else 0.0 for c in candidates]
    best = min(range(len(candidates)), key=lambda c: misses[c])
    # the norm ran in the model's dtype: a bfloat16 RMSNorm rounds twice, about 2^-8 of each output
    rel = max(1e-3, 4 * torch.finfo(y.dtype).eps) if y.is_floating_point() else 1e-3
    if misses[best] > rel * max(1.0, float(yd.abs().max()) if yd.numel() else 1.0):
        raise BadInput(f"the norm {type(norm).__name__} is neither a LayerNorm nor an RMSNorm that attnscope can "
                       "freeze, so its QK attribution is not available", code="norm_unsupported",
                       params={"norm": type(norm).__name__})
    return candidates[best]


def _unsupported(lm: LoadedModel, reason: str) -> BadInput:
    return BadInput(f"QK attribution is not available for model {lm.info.name!r}: {reason}", code="qk_unsupported",
                    params={"model": lm.info.name, "reason": reason})


@dataclass
class _Layer:
    """The layer's projections as functions of its input, with every norm inside frozen at this run."""

    lm: LoadedModel
    layer: int
    trace: _Trace
    inner: list[tuple[nn.Module, RowNorm]]

    def project(self, hidden: torch.Tensor, at: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, m, d) attention inputs -> (q (B, H, m, dh), k (B, Hkv, m, dh)) post-rotary, from the layer's own
        module (gradients flow where ``hidden`` asks for them). ``at``: hidden is (B, 1, d), the input at that
        position alone, and every argument laid out by position (rotary cos/sin, position ids, the frozen
        norms' scales) is cut to it; the caller checks the result against the whole call's."""
        attn = _attention(self.lm, self.layer)
        got: dict[str, torch.Tensor] = {}

        def reader(q: torch.Tensor, k: torch.Tensor) -> None:
            got["q"], got["k"] = q, k

        def frozen(norm: RowNorm) -> Any:
            def hook(_module: nn.Module, args: tuple[Any, ...], _output: Any) -> torch.Tensor:
                return norm.apply(args[0])

            return hook

        m = self.trace.hidden.shape[1]
        base_args, base_kwargs = self.trace.args, self.trace.kwargs
        inner = self.inner
        if at is not None:
            base_args = tuple(_at(a, at, m) for a in base_args)
            base_kwargs = {k: _at(v, at, m) for k, v in base_kwargs.items()}
            inner = [(module, RowNorm(n.center, _at(n.scale, at, m), _at(n.shift, at, m))) for module, n in inner]
        args, kwargs = with_hidden(base_args, base_kwargs, hidden)
        regs = [Registration(module, "post", frozen(norm)) for module, norm in inner]
        try:
            with grab_qk(attn, reader), temporary_hooks(regs):
                attn(*args, **kwargs)
        except Grabbed:
            pass
        if "q" not in got:
            raise _unsupported(self.lm, "its attention does not go through attnscope's capture point")
        return got["q"], got["k"]


def _at(value: Any, at: int, m: int) -> Any:
    """``value`` cut to position ``at`` where it is laid out by position (axis 1 of length m, or a vector of m);
    tuples and lists element by element; anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.dim() >= 2 and value.shape[1] == m:
            return value[:, at: at + 1]
        if value.dim() == 1 and value.shape[0] == m:
            return value[at: at + 1]
        return value
    if isinstance(value, tuple | list):
        return type(value)(_at(v, at, m) for v in value)
    return value


def _jacobian_at(proj: _Layer, which: Literal["q", "k"], head: int, position: int, whole: torch.Tensor
                 ) -> torch.Tensor | None:
    """(dh, d) float64: d q (or k) of ``head`` at ``position`` / d the input there, from the layer called on that
    position alone (one backward a dimension over one row, not over the sequence); None where the cut call
    does not give what the whole call gave (``whole``: (dh,)), or fails — the caller reads J the long way."""
    try:
        one = proj.trace.hidden[:, position: position + 1].detach().clone().requires_grad_(True)  # (1, 1, d)
        q, k = proj.project(one, at=position)
        out = (q if which == "q" else k)[0, head, 0]  # (dh,)
        if out.shape != whole.shape or not torch.allclose(out.detach(), whole.detach(), rtol=1e-4, atol=1e-5):
            return None
        return _jacobian(out, one, 0)
    except (RuntimeError, ValueError, IndexError):
        return None


def _components(lm: LoadedModel, record: RunRecord, layer: int, trace: _Trace, positions: torch.Tensor
                ) -> Iterator[tuple[list[Component], torch.Tensor]]:
    """What each upstream component wrote at ``positions`` (P,): (components, (P, c, d) float32), a chunk at a
    time — the embeddings, then per earlier layer its heads, its output bias, its MLP. Float32 as the model
    computed them (the terms are sums of d products: float32 keeps them within 1e-6 of float64, at half the
    time); what is summed over components is summed in float64."""
    rows = positions.tolist()
    yield [Component("embed", None, None)], record.resid[0][rows].float().cpu()[:, None]
    for i in range(layer):
        z = trace.z[i][rows].cpu()  # (P, H, dh)
        if lm.spec.residual == "sandwich":  # the post-attention norm is frozen per position
            parts = [attention_terms(lm, i, z[p]) for p in range(len(rows))]
            heads = torch.stack([h for h, _ in parts]).float()
            bias = None if parts[0][1] is None else torch.stack([b for _, b in parts if b is not None]).float()
        else:
            weights = head_weights(lm, i)
            heads = torch.einsum("phk,hkd->phd", z.float(), weights.w_o.detach().float().cpu())
            bias = None if weights.b_o is None else weights.b_o.detach().float().cpu().expand(len(rows), -1)
            if lm.spec.residual_scale is not None:
                scale = float(getattr(lm.model.config, lm.spec.residual_scale))
                heads, bias = heads * scale, None if bias is None else bias * scale
        yield [Component("head", i, h) for h in range(lm.info.n_heads)], heads
        if bias is not None:
            yield [Component("out_bias", i, None)], bias[:, None]
        yield [Component("mlp", i, None)], record.mlp_out[i][rows].float().cpu()[:, None]


def _jacobian(out: torch.Tensor, wrt: torch.Tensor, position: int) -> torch.Tensor:
    """out (e,) a function of wrt (1, m, d) through position ``position`` only -> (e, d) float64 d out / d wrt[p]:
    one batched backward (a cotangent a row of the identity), a backward a row where this torch cannot batch it."""
    eye = torch.eye(out.shape[0], dtype=out.dtype, device=out.device)
    try:
        (grads,) = torch.autograd.grad(out, wrt, grad_outputs=eye, retain_graph=True, is_grads_batched=True)
        return grads[:, 0, position].double().cpu()  # (e, d)
    except RuntimeError:
        rows = []
        for e in range(out.shape[0]):
            (grad,) = torch.autograd.grad(out[e], wrt, retain_graph=True)
            rows.append(grad[0, position].double().cpu())
        return torch.stack(rows)


def qk_attribution(lm: LoadedModel, record: RunRecord, layer: int, head: int, query: int,
                   key: int | None = None) -> QKAttribution:
    """Head ``head`` of ``layer``: its logit from ``query`` to ``key`` (or to every key it sees) by component.

    Runs outside inference mode whatever its caller's (autograd reads J; the forward that feeds it keeps no
    inference tensors); the model's parameters are never changed."""
    with torch.inference_mode(False):
        return _qk_attribution(lm, record, layer, head, query, key)


def _qk_attribution(lm: LoadedModel, record: RunRecord, layer: int, head: int, query: int,
                    key: int | None) -> QKAttribution:
    require_decoder(lm, "QK attribution")
    if lm.spec.capture != "interface":
        raise _unsupported(lm, "its attention is read from the attention module's output, not through attnscope's "
                               "capture point")
    record.check_layer_head(layer, head)
    record.check_position(query, "query")
    if key is not None:
        record.check_position(key, "key")
    kept = record.attention[layer]
    seen = kept.visible(query, query + 1, 0, record.n)[0].cpu()  # (n,) bool
    if key is not None and not bool(seen[key]):
        raise BadInput(f"in layer {layer} the query at position {query} does not see the key at position {key}",
                       code="key_not_visible", params={"layer": layer, "query": query, "key": key})
    keys = torch.tensor([key]) if key is not None else seen.nonzero()[:, 0]  # (K,)
    m = max(query, int(keys.max())) + 1
    trace = _trace(lm, layer, record.input_ids[:m])
    x = record.resid[layer][:m]  # (m, d) the block's input
    if trace.norm is None and not torch.allclose(trace.hidden[0].float().cpu(), x.float().cpu(), atol=1e-5):
        raise _unsupported(lm, "the attention's input is not a norm of the residual stream")
    norm = freeze_rows(trace.norm, x, trace.hidden[0])  # (m, d) scales
    inner = [(module, freeze_rows(module, x_in, y_out)) for module, x_in, y_out in trace.inner]
    proj = _Layer(lm, layer, trace, inner)
    group = kept.groups
    kv_head = head // group
    scaling = kept.scaling
    q_kept = kept.q[head, query].double().cpu()  # (dh,)
    k_kept = kept.k[kv_head, keys].double().cpu()  # (K, dh)

    with torch.enable_grad():
        hidden = trace.hidden.detach().clone().requires_grad_(True)  # (1, m, d)
        q, k = proj.project(hidden)
        j_query = _jacobian_at(proj, "q", head, query, q[0, head, query])  # (dh, d)
        if j_query is None:
            j_query = _jacobian(q[0, head, query], hidden, query)
        # one backward for the whole row: d (q_i . k_j) / d input_j = J_j^T q_i at every key j at once
        (g,) = torch.autograd.grad((k[0, kv_head, keys] * q_kept.to(k)).sum(), hidden, retain_graph=key is not None)
        j_key = None
        if key is not None:  # (dh, d)
            j_key = _jacobian_at(proj, "k", kv_head, key, k[0, kv_head, key])
            if j_key is None:
                j_key = _jacobian(k[0, kv_head, key], hidden, key)
    with torch.no_grad():
        q0, k0 = proj.project(torch.zeros_like(trace.hidden))  # what a zero input gives: the biases, rotated
    g_keys = g[0, keys].double().cpu()  # (K, d)

    positions = torch.cat([keys, torch.tensor([query])])  # the keys' rows, then the query's
    rows = RowNorm(norm.center, norm.scale[positions], norm.shift[positions])
    # the frozen norm folded into what reads its output (N is symmetric per row: centre, then scale), so the
    # components are read as they are: q_a = (J_i N_i) c_a, and q_i . k_b = (N_j^T J_j^T q_i) . c_b
    def folded(j: torch.Tensor, row: int) -> torch.Tensor:  # (e, d) rows through N_row^T, float32
        one = RowNorm(rows.center, rows.scale[row].expand_as(j), rows.shift[row])
        return one.transpose(j).float()

    jq32 = folded(j_query, len(keys))
    g32 = RowNorm(rows.center, rows.scale[:-1], rows.shift[:-1]).transpose(g_keys).float()  # (K, d)
    jk32 = None if j_key is None else folded(j_key, 0)
    components: list[Component] = []
    q_terms: list[torch.Tensor] = []  # per chunk (c, dh): the query-side vectors q_a
    k_side: list[torch.Tensor] = []  # per chunk (K, c): q_i . k_b at every key
    k_terms: list[torch.Tensor] = []  # per chunk (c, dh): the key-side vectors k_b (one key only)
    for chunk, values in _components(lm, record, layer, trace, positions):
        components += chunk  # values (P, c, d) float32: the keys' rows, then the query's
        q_terms.append((values[-1] @ jq32.T).double())
        k_side.append(torch.einsum("kcd,kd->kc", values[:-1], g32).double())
        if jk32 is not None:
            k_terms.append((values[0] @ jk32.T).double())
    components += [Component("norm_shift", None, None), Component("proj_bias", None, None)]
    q_terms += [(j_query @ rows.shift[-1])[None], q0[0, head, query].double().cpu()[None]]
    k_side += [(g_keys * rows.shift[:-1]).sum(-1, keepdim=True),
               (k0[0, kv_head, keys].double().cpu() @ q_kept)[:, None]]
    y = trace.hidden[0].double().cpu()  # (m, d)
    clipped = bool(getattr(lm.model.config, "clip_qkv", None))
    if clipped:  # the part of q and k the affine map does not give: the clamp's doing
        components.append(Component("clip", None, None))
        q_terms.append((q_kept - j_query @ y[query] - q0[0, head, query].double().cpu())[None])
        # q_i . (k_j - J_j y_j - k0_j), with q_i . J_j y_j = g_j . y_j
        k_side.append((k_kept @ q_kept - (g_keys * y[keys]).sum(-1)
                       - k0[0, kv_head, keys].double().cpu() @ q_kept)[:, None])
    q_vectors = torch.cat(q_terms)  # (C, dh)
    query_side = scaling * (k_kept @ q_vectors.T)  # (K, C)
    key_side = scaling * torch.cat(k_side, dim=1)  # (K, C)
    matrix = None
    if j_key is not None and key is not None:
        k_terms += [(j_key @ rows.shift[0])[None], k0[0, kv_head, key].double().cpu()[None]]
        if clipped:
            k_terms.append((k_kept[0] - j_key @ y[key] - k0[0, kv_head, key].double().cpu())[None])
        matrix = scaling * (q_vectors @ torch.cat(k_terms).T)  # (C, C)

    bias = (kept.bias[head, keys].double().cpu() if kept.bias is not None
            else torch.zeros(len(keys), dtype=torch.float64))
    logit = scaling * (k_kept @ q_kept) + bias  # (K,)
    capped = torch.tanh(logit / kept.softcap) * kept.softcap if kept.softcap is not None else logit.clone()
    residues = [logit - bias - query_side.sum(-1), logit - bias - key_side.sum(-1)]
    if matrix is not None:
        residues.append((logit - bias - matrix.sum()).reshape(1))
    stacked = torch.stack(residues)  # (r, K)
    error = stacked.gather(0, stacked.abs().argmax(0, keepdim=True))[0]
    weights, _ = kept.rows(head, query, query + 1)
    return QKAttribution(layer=layer, head=head, query=query, keys=keys, components=components,
                         query_side=query_side, key_side=key_side, matrix=matrix, logit=logit, position_bias=bias,
                         capped=capped, softcap=kept.softcap, weight=weights[0, keys].double().cpu(), error=error)
