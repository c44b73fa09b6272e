"""Activation names, built in one place (as TransformerLens' ``get_act_name``).

The names are the public vocabulary of captured activations, shared by the hooks, the
run store, the API docs and the tests:

============================  ==================  =====================================
act_name(kind, i)             shape               what
============================  ==================  =====================================
blocks.{i}.hook_resid_pre     (n, d_model)        "resid_pre": residual entering block i
blocks.{i}.attn.hook_pattern  (heads, n, n)       "pattern": post-softmax attention, query x key
blocks.{i}.hook_attn_out      (n, d_model)        "attn_out": attention sublayer's output
blocks.{i}.hook_mlp_out       (n, d_model)        "mlp_out": MLP sublayer's output
blocks.{i}.hook_resid_post    (n, d_model)        "resid_post": residual leaving block i
blocks.{i}.attn.hook_rot_q    (heads, n, d_head)  "rot_q": post-rotary queries (on request)
blocks.{i}.attn.hook_rot_k    (kv_heads, n, d_head) "rot_k": post-rotary keys, K/V heads not repeated (on request)
logits                        (n, vocab)          ``LOGITS``: the model's final logits (decoders)
============================  ==================  =====================================

A default capture fills the ``KINDS``; the ``ON_REQUEST`` kinds only when asked for by name.
"""

from __future__ import annotations

import re
from typing import Literal

ActKind = Literal["resid_pre", "pattern", "attn_out", "mlp_out", "resid_post", "rot_q", "rot_k"]

_SUFFIX: dict[ActKind, str] = {
    "resid_pre": "hook_resid_pre",
    "pattern": "attn.hook_pattern",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
    "rot_q": "attn.hook_rot_q",
    "rot_k": "attn.hook_rot_k",
}
_KIND_OF: dict[str, ActKind] = {suffix: kind for kind, suffix in _SUFFIX.items()}
_NAME = re.compile(r"blocks\.(\d+)\.(.+)")

KINDS: tuple[ActKind, ...] = ("resid_pre", "pattern", "attn_out", "mlp_out", "resid_post")
ON_REQUEST: tuple[ActKind, ...] = ("rot_q", "rot_k")
LOGITS = "logits"


def act_name(kind: ActKind, layer: int) -> str:
    """``act_name("pattern", 3)`` -> ``"blocks.3.attn.hook_pattern"``."""
    return f"blocks.{layer}.{_SUFFIX[kind]}"


def block_names(n_layers: int) -> list[str]:
    """The names a default capture fills for ``n_layers`` blocks, block by block (not the on-request ones)."""
    return [act_name(kind, layer) for layer in range(n_layers) for kind in KINDS]


def parse(name: str) -> tuple[ActKind, int]:
    """The inverse of ``act_name``; KeyError for anything else (``logits`` included)."""
    match = _NAME.fullmatch(name)
    if match is None or match.group(2) not in _KIND_OF:
        raise KeyError(name)
    return _KIND_OF[match.group(2)], int(match.group(1))


def kind_of(name: str) -> ActKind | None:
    """The kind of a per-block name, or None (``logits``, anything unknown)."""
    try:
        return parse(name)[0]
    except KeyError:
        return None
