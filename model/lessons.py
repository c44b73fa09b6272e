"""Numbers for the Learn views, each computed from the running model's own weights.

* ``value_contributions`` — how much each source token *adds* to a head's output
  (attention weight x ‖v_j W_O^h‖), not only where the head looks;
* ``embedding_neighbours`` — a token's row of E, its nearest neighbours, and the ids next
  to it (k ± 1), which are no closer than any random pair;
* ``anatomy`` — parameter counts by part of the network;
* ``position_table`` — the learned position embeddings, or what a rotary model uses;
* ``parallel_vs_serial`` — one forward over n tokens vs n serial steps, with and without
  the KV cache, timed;
* ``hidden_similarity`` — per token, the cosine between the final hidden states of two
  prompts made of the same tokens in another order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from model.arch import PositionEncoding
from model.errors import BadInput
from model.loading import LoadedModel, input_embeddings, output_embeddings, position_embeddings

# ---- 1. attention aggregates context ----------------------------------------------------------

def _value_vectors(lm: LoadedModel, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (H, n, dh), W_O per head (H, dh, d)) of one layer, captured from a forward."""
    info, spec, block = lm.info, lm.spec, lm.blocks[layer]
    H, dh, d = info.n_heads, info.d_head, info.d_model
    out_w: torch.Tensor = block.get_submodule(spec.out_proj).get_parameter("weight")
    if spec.out_proj_transposed:
        out_w = out_w.T  # Conv1D stores (in, out): -> nn.Linear's (out, in)
    seen: dict[str, torch.Tensor] = {}

    def keep(_module: nn.Module, _args: object, out: torch.Tensor) -> None:
        seen["v"] = out[0].detach()

    handle = block.get_submodule(spec.values).register_forward_hook(keep)
    try:
        with torch.inference_mode():
            lm.model(input_ids=ids[None].to(lm.input_device), use_cache=False)
    finally:
        handle.remove()
    out = seen["v"]  # (n, ...)
    n = out.shape[0]
    if spec.value_layout == "fused_gpt2":  # [q | k | v]: the values are the last n_kv_heads * d_head features
        v = out[:, out.shape[-1] - info.n_kv_heads * dh :].reshape(n, info.n_kv_heads, dh)
        v = v.repeat_interleave(H // info.n_kv_heads, dim=1)
    elif spec.value_layout == "fused_neox":
        v = out.view(n, H, 3 * dh)[..., 2 * dh :]
    elif spec.value_layout == "fused_grouped":  # per K/V group: [q ... q k v]
        v = out.view(n, info.n_kv_heads, -1, dh)[:, :, -1].repeat_interleave(H // info.n_kv_heads, dim=1)
    else:  # grouped-query: each K/V head serves n_heads / n_kv_heads query heads
        v = out.view(n, info.n_kv_heads, dh).repeat_interleave(H // info.n_kv_heads, dim=1)
    w_o = out_w.T.reshape(H, dh, d)  # (H, dh, d): head h's slice of the output projection
    return v.transpose(0, 1), w_o


def value_contributions(lm: LoadedModel, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """(H, n): ‖v_j^h W_O^h‖ for every head h and source token j. Caller holds the lock."""
    v, w_o = _value_vectors(lm, layer, ids)
    with torch.inference_mode():
        projected: torch.Tensor = torch.einsum("hnk,hkd->hnd", v.float(), w_o.float())  # (H, n, d)
    norms: torch.Tensor = projected.norm(dim=-1)
    return norms


# ---- 3-4. token ids and embeddings ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Similar:
    id: int
    cos: float


@dataclass(frozen=True, slots=True)
class Neighbours:
    id: int
    vector: list[float]  # row id of E
    norm: float
    neighbours: list[Similar]  # the nearest rows by cosine, nearest first
    adjacent: list[Similar]  # ids k - 1 and k + 1
    random_mean: float  # cosine between random pairs of rows, for scale
    random_std: float


def embedding_neighbours(lm: LoadedModel, token_id: int, top: int) -> Neighbours:
    E = input_embeddings(lm.model).detach().float()  # (V, d)
    V = E.shape[0]
    if not 0 <= token_id < V:
        raise BadInput(f"token id {token_id} is out of range: the vocabulary has ids 0..{V - 1}")
    unit = torch.nn.functional.normalize(E, dim=-1)
    cos = unit @ unit[token_id]  # (V,)
    cos_others = cos.clone()
    cos_others[token_id] = -2
    best = cos_others.topk(top)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, V, (4000,), generator=gen), torch.randint(0, V, (4000,), generator=gen)
    keep = a != b
    random_cos = (unit[a[keep]] * unit[b[keep]]).sum(-1)
    adjacent = [i for i in (token_id - 1, token_id + 1) if 0 <= i < V]
    return Neighbours(
        id=token_id, vector=E[token_id].tolist(), norm=float(E[token_id].norm()),
        neighbours=[Similar(id=i, cos=c) for i, c in zip(best.indices.tolist(), best.values.tolist(), strict=True)],
        adjacent=[Similar(id=i, cos=float(cos[i])) for i in adjacent],
        random_mean=float(random_cos.mean()), random_std=float(random_cos.std()))


# ---- 5. d_model and heads ----------------------------------------------------------------------

@dataclass(slots=True)
class LayerParams:
    layer: int
    attention: int = 0
    mlp: int = 0
    norms: int = 0


@dataclass(frozen=True, slots=True)
class Anatomy:
    per_layer: list[LayerParams]
    token_embedding: int
    position_embedding: int
    final_norm_and_other: int
    lm_head: int  # 0 when the LM head shares the token embedding's weights
    lm_head_tied: bool
    total: int


def anatomy(lm: LoadedModel) -> Anatomy:
    """Parameter counts by part: token/position embeddings, attention and MLP per layer, norms, LM head."""
    model, spec = lm.model, lm.spec
    blocks = lm.blocks
    block_of = {id(p): i for i, b in enumerate(blocks) for p in b.parameters()}
    attn_root = spec.attn.split(".")[0] + "."
    mlp_prefixes = spec.mlp_params
    per_layer = [LayerParams(layer=i) for i in range(len(blocks))]
    wte = input_embeddings(model)
    head = output_embeddings(model)
    head_weight = head.get_parameter("weight") if head is not None else None
    tied = head_weight is not None and head_weight.data_ptr() == wte.data_ptr()
    pos_table = position_embeddings(lm)
    for block_idx, block in enumerate(blocks):
        row = per_layer[block_idx]
        for name, p in block.named_parameters():
            if name.startswith(attn_root):
                row.attention += p.numel()
            elif name.startswith(mlp_prefixes):
                row.mlp += p.numel()
            else:
                row.norms += p.numel()
    token = position = lm_head = other = 0
    for _name, p in model.named_parameters():
        if id(p) in block_of:
            continue
        if p is wte:
            token += p.numel()
        elif pos_table is not None and p is pos_table:
            position += p.numel()
        elif head_weight is not None and p is head_weight:
            lm_head += p.numel()
        else:
            other += p.numel()
    return Anatomy(per_layer=per_layer, token_embedding=token, position_embedding=position,
                   final_norm_and_other=other, lm_head=lm_head, lm_head_tied=tied,
                   total=sum(p.numel() for p in model.parameters()))


# ---- 6. position information ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PositionTable:
    kind: PositionEncoding
    count: int
    d_model: int | None = None
    matrix: list[list[float]] | None = None  # learned: the first `count` rows of the table
    similarity: list[list[float]] | None = None  # learned: cosine between those rows
    theta: float | None = None  # rotary: the base
    rotary_dims: int | None = None
    inv_freq: list[float] | None = None  # rotary: each pair of dimensions' frequency
    angles: list[list[float]] | None = None  # rotary: cos(position x frequency)


def position_table(lm: LoadedModel, count: int) -> PositionTable:
    spec, cfg = lm.spec, lm.model.config
    learned = position_embeddings(lm)
    if spec.position_encoding == "learned" and learned is not None:
        table = learned.detach().float()[:count]  # (P, d)
        unit = torch.nn.functional.normalize(table, dim=-1)
        return PositionTable(kind="learned", count=table.shape[0], d_model=table.shape[1], matrix=table.tolist(),
                             similarity=(unit @ unit.T).tolist())
    if spec.position_encoding == "rotary":
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        pct = float(params.get("partial_rotary_factor", getattr(cfg, "rotary_pct", 1.0)))
        rot = int(lm.info.d_head * pct) // 2 * 2
        inv_freq = 1.0 / theta ** (torch.arange(0, rot, 2).float() / rot)  # (rot/2,)
        angles = torch.arange(count).float()[:, None] * inv_freq[None]  # (P, rot/2)
        return PositionTable(kind="rotary", count=count, theta=theta, rotary_dims=rot, inv_freq=inv_freq.tolist(),
                             angles=angles.cos().tolist())
    return PositionTable(kind=spec.position_encoding, count=0)


# ---- 2. one parallel pass vs serial generation ------------------------------------------------

@dataclass(frozen=True, slots=True)
class Timing:
    n: int
    parallel_ms: float  # one forward over all n tokens
    serial_cache_ms: list[float]  # step t: one token in, earlier keys/values from the KV cache
    serial_no_cache_ms: list[float]  # step t: the whole prefix recomputed


def parallel_vs_serial(lm: LoadedModel, ids: torch.Tensor) -> Timing:
    """Time one forward over n tokens, n steps with the KV cache, n steps without. Caller holds the lock."""
    n = ids.shape[0]
    model = lm.model

    def timed(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)

    with torch.inference_mode():
        model(input_ids=ids[None], use_cache=False)  # warm-up
        parallel = min(timed(lambda: model(input_ids=ids[None], use_cache=False)) for _ in range(3))
        with_cache: list[float] = []
        cache = None
        for t in range(n):
            t0 = time.perf_counter()
            out = model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            with_cache.append(1e3 * (time.perf_counter() - t0))
        without = [timed(partial(model, input_ids=ids[None, : t + 1], use_cache=False)) for t in range(n)]
    return Timing(n=n, parallel_ms=parallel, serial_cache_ms=with_cache, serial_no_cache_ms=without)


# ---- 6. order: same tokens, another order ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TokenMatch:
    a: int  # position in prompt A
    b: int | None  # the same word's position in prompt B; None if B lacks it
    cos: float | None  # cosine of the two final hidden states


def hidden_similarity(a_tokens: list[str], a_final: torch.Tensor,
                      b_tokens: list[str], b_final: torch.Tensor) -> list[TokenMatch]:
    """For each token of prompt A, the same word in prompt B (matched in order of occurrence,
    ignoring the leading space BPE folds into a token: "dog" at the start and " dog" later
    are different ids for the same word) and the cosine of their final hidden states.
    a_final, b_final: (n, d)."""
    a_keys = [t.strip() for t in a_tokens]
    b_keys = [t.strip() for t in b_tokens]
    used: set[int] = set()
    out = []
    for i, tok in enumerate(a_keys):
        j = next((j for j, t in enumerate(b_keys) if t == tok and j not in used), None)
        cos = None
        if j is not None:
            used.add(j)
            cos = float(torch.nn.functional.cosine_similarity(a_final[i].float(), b_final[j].float(), dim=0))
        out.append(TokenMatch(a=i, b=j, cos=cos))
    return out
