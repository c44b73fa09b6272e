"""Direct logit attribution: which component wrote the logit of a token.

The final residual at position P is a sum: the embeddings, every head's own output (its
``z`` through its slice of ``W_O``), each attention projection's bias and every MLP's
output. With the final norm's scale at P *frozen* (TransformerLens' convention) the norm
is affine, so the logit of T — or the difference T - U — splits into one term per
component, plus one for the norm's shift and the LM head's bias; the terms sum to the
logit up to float error, which is reported, never hidden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import nn

from attnscope.model.errors import BadInput
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import token_map
from attnscope.model.results import TokenRef
from attnscope.model.runs.record import RunRecord
from attnscope.model.tools.intervene import capture_z, head_weights, require_decoder

TermKind = Literal["embed", "head", "mlp", "bias"]


@dataclass(frozen=True, slots=True)
class Term:
    kind: TermKind
    layer: Annotated[int | None, Field(description="the block; null for the embeddings and for the final bias")]
    head: Annotated[int | None, Field(description="the head, for kind 'head'; otherwise null")]
    value: Annotated[float, Field(description="this component's share of the logit (or of the difference)")]


@dataclass(frozen=True, slots=True)
class Attribution:
    """The logit of ``token`` (minus ``token_b``'s) at ``position``, split into ``terms`` that sum to it
    up to ``error``."""

    position: int
    token: TokenRef
    token_b: Annotated[TokenRef | None, Field(
        description="the token subtracted, when a difference is attributed")]
    logit: Annotated[float, Field(description=(
        "the model's logit of token (minus token_b's) at position, before any final transform"))]
    terms: Annotated[list[Term], Field(description=(
        "embeddings, every head's own output through its slice of W_O, each attention projection's bias "
        "(kind 'bias' with a layer), every MLP, and the final norm's shift plus the LM head's bias (kind "
        "'bias', layer null); the final norm's scale at position is frozen, so the terms sum to logit"))]
    error: Annotated[float, Field(description="logit minus the sum of the terms: the float residue")]
    final_transform: Annotated[str | None, Field(description=(
        "what the model applies to its logits after the LM head (soft-capping), if anything; the attributed "
        "logit is the one before it"))]
    final_steps: Annotated[list[FinalStep], Field(description=(
        "the same transform step by step, in order (empty when the model applies none), for a client that "
        "says it in another language"))]


@dataclass(frozen=True)
class FrozenNorm:
    """A norm with its scale fixed at one position: y = center(x) * scale + shift."""

    center: bool
    scale: torch.Tensor  # (d,) float64: the weight over that position's sigma
    shift: torch.Tensor  # (d,) float64

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., d): the norm's linear part, the same for every summand (float64, on the CPU
        where attribution adds its terms, whatever device the run's activations are on)."""
        x = x.double().cpu()
        if self.center:
            x = x - x.mean(-1, keepdim=True)
        return x * self.scale


def norm_eps(norm: nn.Module) -> float:
    """The epsilon a norm adds under its square root (the families name it three ways)."""
    for name in ("eps", "variance_epsilon", "epsilon"):
        value = getattr(norm, name, None)
        if isinstance(value, float | int):
            return float(value)
    return 1e-5


def norm_affine(norm: nn.Module, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d,) float64 each: a norm's weight and bias (ones and zeros where it has none)."""
    weight = getattr(norm, "weight", None)
    w = weight.detach().double().cpu() if isinstance(weight, torch.Tensor) else torch.ones(d, dtype=torch.float64)
    bias = getattr(norm, "bias", None)
    b = bias.detach().double().cpu() if isinstance(bias, torch.Tensor) else torch.zeros(d, dtype=torch.float64)
    return w, b


def freeze_norm(norm: nn.Module | None, x: torch.Tensor) -> FrozenNorm:
    """Which affine map ``norm`` applies at the residual ``x`` (d,), checked against its output.

    Candidates, in the order families use them: LayerNorm (centre, weight, bias), RMSNorm with
    ``weight`` (Llama) or ``1 + weight`` (Gemma). The first whose prediction equals the
    module's own output is kept; none matching is an error, not a silent approximation.
    """
    d = x.shape[-1]
    xd = x.double().cpu()  # (d,) the maths below is float64 on the CPU
    if norm is None:
        return FrozenNorm(False, torch.ones(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64))
    with torch.inference_mode():
        # run the norm in float32 whatever the model's dtype, so its output is checked at float32 precision
        params = {name: t.float() for name, t in [*norm.named_parameters(), *norm.named_buffers()]}
        dev = next((t.device for t in params.values()), x.device)  # where the norm's weights are (a GPU)
        y = torch.func.functional_call(norm, params, (x[None].float().to(dev),))[0].double().cpu()  # (d,)
    eps = norm_eps(norm)
    w, b = norm_affine(norm, d)
    centred = xd - xd.mean()
    ln_sigma = math.sqrt(float(centred.pow(2).mean()) + eps)
    rms = math.sqrt(float(xd.pow(2).mean()) + eps)
    candidates = [FrozenNorm(True, w / ln_sigma, b), FrozenNorm(False, w / rms, b),
                  FrozenNorm(False, (1 + w) / rms, b)]
    if not isinstance(norm, nn.LayerNorm):
        candidates = candidates[1:] + candidates[:1]
    rel = 1e-4  # the norm ran in float32 above
    tol = rel * max(1.0, float(y.abs().max()))
    for frozen in candidates:
        if torch.allclose(frozen.linear(xd) + frozen.shift, y, rtol=rel, atol=tol):
            return frozen
    raise BadInput(f"the norm {type(norm).__name__} is neither a LayerNorm nor an RMSNorm that "
                   "attnscope can freeze; direct logit attribution is not available for this model",
                   code="norm_unsupported", params={"norm": type(norm).__name__})


@dataclass(frozen=True, slots=True)
class FinalStep:
    """One thing a family does to its logits after the LM head, in order."""

    op: Annotated[Literal["multiply", "divide", "softcap"], Field(description=(
        "multiply: x * value; divide: x / value; softcap: tanh(x / value) * value"))]
    value: float
    setting: Annotated[str, Field(description="the model config's attribute the value comes from")]


def final_steps(lm: LoadedModel) -> list[FinalStep]:
    """What the family does to its logits after the LM head, step by step (empty when nothing)."""
    spec, cfg = lm.spec, lm.model.config
    steps = []
    if spec.logit_scale is not None:
        steps.append(FinalStep("multiply", float(getattr(cfg, spec.logit_scale)), spec.logit_scale))
    if spec.logit_divide is not None:
        steps.append(FinalStep("divide", float(getattr(cfg, spec.logit_divide)), spec.logit_divide))
    cap = getattr(cfg, spec.logit_softcap, None) if spec.logit_softcap is not None else None
    if cap:
        steps.append(FinalStep("softcap", float(cap), str(spec.logit_softcap)))
    return steps


_SAID = {"multiply": "multiplies them by {v} ({s})", "divide": "divides them by {v} ({s})",
         "softcap": "soft-caps them (tanh(x / {v}) * {v})"}


def final_transform(steps: list[FinalStep]) -> str | None:
    """``final_steps`` in English words; None when there are none."""
    said = [_SAID[st.op].format(v=f"{st.value:g}", s=st.setting) for st in steps]
    if not said:
        return None
    return f"after the LM head the model {' and '.join(said)}; the attributed logit is the one before that"


def _linear_map(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, in) float64 weight and bias of a Linear (OPT's project_out, an LM head)."""
    weight = module.get_parameter("weight").detach().double().cpu()
    try:
        bias: torch.Tensor | None = module.get_parameter("bias").detach().double().cpu()
    except AttributeError:
        bias = None
    return weight, bias


def _direction(lm: LoadedModel, token: int) -> tuple[torch.Tensor, float]:
    """(d,) float64 direction in the final norm's output space whose dot product gives the logit
    of ``token`` before any final transform, and the constant the LM head (and a projection
    between it and the norm) adds."""
    unembed = lm.unembed
    if unembed is None:
        raise BadInput(f"model {lm.info.name!r} has no LM head", code="no_lm_head", params={"model": lm.info.name})
    weight, bias = _linear_map(unembed)
    u = weight[token]
    constant = float(bias[token]) if bias is not None else 0.0
    after = lm.after_final_norm
    if after is not None:  # logit = u . (P h + b_P) + b_U
        p_weight, p_bias = _linear_map(after)
        if p_bias is not None:
            constant += float(p_bias @ u)
        u = p_weight.T @ u
    return u, constant


def check_token(lm: LoadedModel, token: int, name: str) -> None:
    if not 0 <= token < lm.info.vocab_size:
        raise BadInput(f"{name} {token} is out of range: this model's vocabulary has ids 0..{lm.info.vocab_size - 1}",
                       code="token_out_of_range", params={"name": name, "token": token, "max": lm.info.vocab_size - 1})


def attention_terms(lm: LoadedModel, layer: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What each head, and the projection's bias, add to the residual stream at one position.

    z (H, d_head) -> ((H, d) float64, (d,) float64 or None). Sandwich families normalise the
    attention's output before adding it: that norm's scale at this position is frozen too
    (its shift joins the bias). Granite scales the contribution by residual_multiplier.
    """
    weights = head_weights(lm, layer)
    heads = torch.einsum("hk,hkd->hd", z.double(), weights.w_o.detach().double().cpu())  # (H, d)
    bias = weights.b_o.detach().double().cpu() if weights.b_o is not None else None
    if lm.spec.residual == "sandwich":
        post = lm.blocks[layer].get_submodule(lm.spec.attn_out)
        total = heads.sum(0) + (bias if bias is not None else 0.0)  # the projection's output, (d,)
        frozen = freeze_norm(post, total.float())
        heads = frozen.linear(heads)
        bias = (frozen.linear(bias) if bias is not None else 0.0) + frozen.shift
    if lm.spec.residual_scale is not None:
        scale = float(getattr(lm.model.config, lm.spec.residual_scale))
        heads = heads * scale
        bias = bias * scale if bias is not None else None
    return heads, bias


def attribute(lm: LoadedModel, record: RunRecord, position: int, token: int,
              token_b: int | None = None) -> Attribution:
    """The logit of ``token`` (minus ``token_b``'s) at ``position``, split into components."""
    require_decoder(lm, "direct logit attribution")
    if not 0 <= position < record.n:
        raise BadInput(f"position {position} is out of range: this run has positions 0..{record.n - 1}",
                       code="position_out_of_range", params={"position": position, "max": record.n - 1})
    check_token(lm, token, "token")
    if token_b is not None:
        check_token(lm, token_b, "token_b")
    n_layers, n_heads = lm.info.n_layers, lm.info.n_heads
    # the heads' z is not kept with the run: one forward over the prefix (causal) recomputes it
    zs, _ = capture_z(lm, record.input_ids[: position + 1])  # L x (P+1, H, d_head)
    x = record.resid[-1][position]  # (d,)
    frozen = freeze_norm(lm.final_norm, x)
    head = lm.lm_head()
    if head is None:  # require_decoder checked it; the type says so here
        raise BadInput(f"model {lm.info.name!r} has no LM head", code="no_lm_head", params={"model": lm.info.name})
    with torch.inference_mode():
        full = head.logits(x[None], transform=False)[0]  # (V,) before the family's final transform
    u, bias = _direction(lm, token)
    logit = float(full[token])
    if token_b is not None:
        u_b, bias_b = _direction(lm, token_b)
        u, bias, logit = u - u_b, bias - bias_b, logit - float(full[token_b])
    terms = [Term("embed", None, None, float(frozen.linear(record.resid[0][position]) @ u))]
    for layer in range(n_layers):
        heads, layer_bias = attention_terms(lm, layer, zs[layer][position].cpu())
        values = frozen.linear(heads) @ u  # (H,)
        terms.extend(Term("head", layer, h, float(values[h])) for h in range(n_heads))
        if layer_bias is not None:
            terms.append(Term("bias", layer, None, float(frozen.linear(layer_bias) @ u)))
        terms.append(Term("mlp", layer, None, float(frozen.linear(record.mlp_out[layer][position]) @ u)))
    terms.append(Term("bias", None, None, float(frozen.shift @ u) + bias))
    error = logit - math.fsum(t.value for t in terms)
    steps = final_steps(lm)
    named = token_map(lm.tokenizer, [token] + ([] if token_b is None else [token_b]))
    return Attribution(position=position, token=TokenRef(token, named[token]),
                       token_b=None if token_b is None else TokenRef(token_b, named[token_b]), logit=logit,
                       terms=terms, error=error, final_transform=final_transform(steps), final_steps=steps)
