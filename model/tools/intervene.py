"""The shared machinery of the causal tools: per-head outputs, temporary edits, batched forwards.

A head's own output is its value-weighted sum ``z`` (what the attention module hands its
output projection, heads side by side: ``(B, n, H * d_head)``) pushed through its slice of
``W_O``. A forward *pre*-hook on the output projection sees ``z`` in every family that
projects with a module (GPT-2's ``Conv1D`` ``c_proj``, Llama's ``o_proj``, NeoX's ``dense``,
OPT's ``out_proj``), so reading, zeroing, averaging or patching one head is one hook.

Every edit here is a hook that lives only inside a ``with`` and is removed in ``finally``:
hooks are global state on a shared model. The causal tools run under ``lm.lock``, taken by their
caller (``model.services.tools``): one forward at a time per model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnscope.model.capture.hooks import Hook, Registration, temporary_hooks
from attnscope.model.errors import BadInput
from attnscope.model.families.weights import HeadWeights, head_out_weights
from attnscope.model.load.models import LoadedModel

# one budget for the batched forwards' largest tensors (attention scores, MLP hidden, logits)
BATCH_BYTES = 256 * 2**20

def require_decoder(lm: LoadedModel, what: str) -> None:
    if lm.unembed is None or not lm.info.causal:
        raise BadInput(f"model {lm.info.name!r} is an encoder without an LM head: {what} needs a decoder",
                       code="encoder_no_lm_head", params={"model": lm.info.name, "what": what})
    if lm.spec.residual == "post_norm":
        raise BadInput(f"model {lm.info.name!r} normalises after each block: its residual stream does not "
                       f"decompose into sublayer outputs, so {what} is not defined for it",
                       code="post_norm_unsupported", params={"model": lm.info.name, "what": what})


def attention_module(lm: LoadedModel, layer: int) -> nn.Module:
    return lm.blocks[layer].get_submodule(lm.spec.attn_out)


def mlp_module(lm: LoadedModel, layer: int) -> nn.Module:
    return lm.blocks[layer].get_submodule(lm.spec.mlp_out)


def out_proj(lm: LoadedModel, layer: int) -> nn.Module:
    """The attention's output projection (``ArchSpec.out_proj``), whose input is the heads' ``z`` side by side."""
    return lm.blocks[layer].get_submodule(lm.spec.out_proj)


def head_weights(lm: LoadedModel, layer: int) -> HeadWeights:
    """Each head's slice of the layer's W_O and the projection's bias (the family's layout:
    ``model.families.weights``)."""
    return head_out_weights(lm.spec, out_proj(lm, layer), lm.info.n_heads, layer)


def split_heads(z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(..., H * d_head) -> (..., H, d_head); a view."""
    return z.view(*z.shape[:-1], n_heads, z.shape[-1] // n_heads)


def first(output: Any) -> torch.Tensor:
    value = output[0] if isinstance(output, tuple) else output
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor (or a tuple starting with one), got {type(value).__name__}")
    return value


def replace_first(output: Any, value: torch.Tensor) -> Any:
    return (value, *output[1:]) if isinstance(output, tuple) else value


def hidden_arg(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    hidden: torch.Tensor = args[0] if args else kwargs["hidden_states"]
    return hidden


def with_hidden(args: tuple[Any, ...], kwargs: dict[str, Any],
                value: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def logits(lm: LoadedModel, ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """(B, n) ids -> (B, n or keep, V) float32 logits; ``keep`` > 0 keeps the last positions only."""
    ids = ids.to(lm.input_device)
    with torch.inference_mode():
        if keep:
            out = lm.model(input_ids=ids, use_cache=False, logits_to_keep=keep)
        else:
            out = lm.model(input_ids=ids, use_cache=False)
    result: torch.Tensor = out.logits
    return result.float().cpu()


def capture_z(lm: LoadedModel, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward over ``ids`` (n,): every layer's ``z`` (n, H, d_head) and the logits (n, V)."""
    store: dict[int, torch.Tensor] = {}

    def saver(layer: int) -> Hook:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            store[layer] = split_heads(args[0][0].detach(), lm.info.n_heads)

        return hook

    regs = [Registration(out_proj(lm, i), "pre", saver(i)) for i in range(lm.info.n_layers)]
    with temporary_hooks(regs):
        out = logits(lm, ids[None])[0]
    return [store[i] for i in range(lm.info.n_layers)], out


def sequence_bytes(lm: LoadedModel, n: int, logit_positions: int) -> int:
    """What one sequence of n tokens takes in a batched forward, at its peak."""
    info = lm.info
    return 4 * (3 * info.n_heads * n * n + 4 * n * max(info.d_mlp, info.d_model)
                + 2 * logit_positions * info.vocab_size)


def batch_size(lm: LoadedModel, n: int, logit_positions: int) -> int:
    """How many sequences of n tokens one batched forward may hold within BATCH_BYTES."""
    return max(1, BATCH_BYTES // sequence_bytes(lm, n, logit_positions))


def batch_bytes(lm: LoadedModel, n: int, logit_positions: int) -> int:
    """What the batched forwards of a tool over n tokens hold at once (the memory budget reserves it)."""
    return batch_size(lm, n, logit_positions) * sequence_bytes(lm, n, logit_positions)


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats over the last axis, from log-probabilities; (..., V) -> (...)."""
    return (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)
