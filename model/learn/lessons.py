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

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnscope.model.errors import BadInput
from attnscope.model.families.table import PositionEncoding
from attnscope.model.load.models import LoadedModel, input_embeddings, output_embeddings, position_embeddings
from attnscope.model.runs.attention import LayerAttention

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


def contribution_gaps(lm: LoadedModel, ids: torch.Tensor, layers: list[LayerAttention], position: int,
                      causal: bool) -> list[dict[str, Any]]:
    """Per head at one query: the total-variation distance between the attention weights and
    each source's share of what the head adds (weight x ‖v W_O‖, normalised). 0 means the
    weights already tell the whole story; larger means weight and contribution disagree.
    layers: a run's kept attention, one row of each head rebuilt. Caller holds the lock."""
    visible = position + 1 if causal else ids.shape[0]
    out: list[dict[str, Any]] = []
    for layer, kept in enumerate(layers):
        norms = value_contributions(lm, ids, layer)[:, :visible]  # (H, visible)
        weights = kept.weights(position, position + 1)[0][:, 0, :visible].float()  # (H, visible)
        added = weights * norms
        share = added / added.sum(-1, keepdim=True).clamp_min(1e-12)
        gap = 0.5 * (weights - share).abs().sum(-1)  # (H,)
        out.extend({"layer": layer, "head": head, "gap": float(gap[head]),
                    "top_weight": int(weights[head].argmax()), "top_share": int(share[head].argmax())}
                   for head in range(weights.shape[0]))
    return out


# ---- 3-4. token ids and embeddings ------------------------------------------------------------

TWIN_COS = 0.95  # two rows this parallel are the same direction, for a trained embedding never
MIN_TWINS = 3  # a row with this many such twins belongs to a block of untouched rows
TWIN_BLOCK = 1024  # rows per side of one block of cosines: (1024, 1024) float32, 4 MiB
_untrained: dict[tuple[int, int], torch.Tensor] = {}
_untrained_busy: dict[tuple[int, int], threading.Event] = {}  # computations in flight, by model
_untrained_lock = threading.Lock()


class Stopped(Exception):
    """A background computation was asked to stop (the server is shutting down)."""


def untrained_rows(lm: LoadedModel, stop: threading.Event | None = None) -> torch.Tensor:
    """(V,) bool: rows of E that training never moved apart.

    A token the training text never contains gets no gradient of its own; with a tied LM head
    every such row only ever receives the same "predict me less" push, so those rows drift
    together and end up nearly parallel (cosine ~1 to each other), while trained rows spread
    out. A row with at least MIN_TWINS other rows at cosine >= TWIN_COS is flagged. Computed
    once per model (V x V cosines, half of them, in blocks: seconds for a 30k vocabulary), by
    ``warm`` in the background when the server starts; a request that comes while it runs
    waits for it rather than computing it again. ``stop`` set: Stopped, between two blocks."""
    E = input_embeddings(lm.model)
    key = (id(lm.model), E.data_ptr())
    while True:
        with _untrained_lock:
            if key in _untrained:
                return _untrained[key]
            busy = _untrained_busy.get(key)
            if busy is None:
                busy = _untrained_busy[key] = threading.Event()
                break
        busy.wait()  # another thread computes it; if it failed, the loop computes it here
    try:
        flags = twin_counts(E.detach(), stop) >= MIN_TWINS
        with _untrained_lock:
            _untrained[key] = flags
    finally:
        with _untrained_lock:
            del _untrained_busy[key]
        busy.set()
    return flags


def twin_counts(E: torch.Tensor, stop: threading.Event | None = None) -> torch.Tensor:
    """(V, d) -> (V,) long: how many *other* rows each row has at cosine >= TWIN_COS. Each pair of
    blocks is compared once and counted for both sides (the cosine matrix is symmetric)."""
    unit = torch.nn.functional.normalize(E.float(), dim=-1)  # (V, d)
    V, step = unit.shape[0], TWIN_BLOCK
    twins = torch.zeros(V, dtype=torch.long, device=unit.device)  # beside the rows (a GPU model's on the GPU)
    with torch.inference_mode():
        for a in range(0, V, step):
            if stop is not None and stop.is_set():
                raise Stopped
            near = (unit[a : a + step] @ unit[a:].T) >= TWIN_COS  # (block, V - a): this block and the rest
            twins[a : a + step] += near.sum(-1)
            twins[a + step :] += near[:, step:].sum(0)  # the later rows' pairs with this block
    return (twins - 1).cpu()  # each row is its own twin once


# the largest untrained-rows sweep (V x V x d multiply-adds, half of them twice) worth running at every
# start-up: both bundled models (attnscope-tiny 1.1e11, minilm-l6 3.6e11) are seconds; GPT-2's 50k x 768
# (1.9e12) or a 128k x 4096 vocabulary (6.9e13) would be minutes to hours of CPU beside every request,
# for a view that may never be opened, and is left to the first request that asks for it
WARM_FLOPS = 10**12


def sweep_flops(lm: LoadedModel) -> int:
    """What ``untrained_rows`` costs for this model's embedding: V x V x d (V x V/2 dot products of 2d)."""
    vocab, d = input_embeddings(lm.model).shape
    return int(vocab) * int(vocab) * int(d)


def warm(lm: LoadedModel, stop: threading.Event | None = None) -> bool:
    """What the Learn views compute once per model, computed now (``Engine.warm_up`` calls it in a
    background thread at start-up, so the first embedding request answers as fast as the next).
    False: the sweep costs more than WARM_FLOPS and is left to the first request."""
    if sweep_flops(lm) > WARM_FLOPS:
        return False
    untrained_rows(lm, stop)
    return True


def embedding_neighbours(lm: LoadedModel, token_id: int, top: int) -> dict[str, Any]:
    E = input_embeddings(lm.model).detach().float()  # (V, d)
    V = E.shape[0]
    if not 0 <= token_id < V:
        raise BadInput(f"token id {token_id} is out of range: the vocabulary has ids 0..{V - 1}", code="bad_id",
                       params={"token_id": token_id, "max": V - 1})
    untrained = untrained_rows(lm)
    unit = torch.nn.functional.normalize(E, dim=-1)
    cos = unit @ unit[token_id]  # (V,)
    cos_others = cos.clone()
    cos_others[token_id] = -2
    best = cos_others.topk(top)
    # the baseline: random pairs of *trained* rows (untouched rows are near-copies of each
    # other and would make any pair look close)
    trained = (~untrained).nonzero().flatten()
    pool = trained if trained.numel() >= 2 else torch.arange(V)
    gen = torch.Generator().manual_seed(0)
    a = pool[torch.randint(0, pool.numel(), (4000,), generator=gen)]
    b = pool[torch.randint(0, pool.numel(), (4000,), generator=gen)]
    keep = a != b
    random_cos = (unit[a[keep]] * unit[b[keep]]).sum(-1)

    def row(i: int) -> tuple[int, float, bool]:
        return (i, float(cos[i]), bool(untrained[i]))

    return {
        "id": token_id,
        "vector": E[token_id].tolist(),
        "norm": float(E[token_id].norm()),
        "untrained": bool(untrained[token_id]),
        "untrained_count": int(untrained.sum()),
        "neighbours": [row(i) for i in best.indices.tolist()],
        "adjacent": [row(i) for i in (token_id - 1, token_id + 1) if 0 <= i < V],
        "double": [row(2 * token_id)] if 0 < 2 * token_id < V else [],
        "random_mean": float(random_cos.mean()),
        "random_std": float(random_cos.std()),
    }


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

HANDOFF_S = 0.05  # how long the model's lock is left free for a request waiting on it...
HANDOFF_AFTER_S = 0.2  # ...each time a timing has held it this long


def let_others_in(lock: threading.Lock, patience: float) -> None:
    """Right after releasing ``lock``: wait (at most ``patience`` seconds) for a thread blocked on it
    to take it. A plain release-and-acquire would usually win the lock straight back, and a request
    waiting for the model would wait for the whole timing."""
    deadline = time.monotonic() + patience
    while not lock.locked() and time.monotonic() < deadline:
        time.sleep(0.001)


class Turns:
    """A model's lock held across many forwards, given up between two of them for a request that
    waits, once it has been held HANDOFF_AFTER_S: no single forward is interrupted, and no request
    waits longer than that plus one forward."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.since = 0.0

    def __enter__(self) -> Turns:
        self.lock.acquire()
        self.since = time.perf_counter()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.lock.release()

    def between(self) -> None:
        """Call between two forwards (outside what is timed)."""
        if time.perf_counter() - self.since < HANDOFF_AFTER_S:
            return
        self.lock.release()
        try:
            let_others_in(self.lock, HANDOFF_S)
        finally:
            self.lock.acquire()
            self.since = time.perf_counter()


def parallel_vs_serial(lm: LoadedModel, ids: torch.Tensor, repeats: int = 5) -> dict[str, Any]:
    """Time one forward over n tokens, n serial steps with the KV cache, and n serial steps
    that recompute the prefix, ``repeats`` times each, interleaved (so that a slow moment of a
    shared machine hits all three alike) after one untimed warm-up of each. Returns the
    per-step medians and every repeat's total.

    Takes the model's lock itself and lets a waiting request in between two forwards every
    HANDOFF_AFTER_S (``Turns``): at its largest (64 tokens, 9 repeats) a timing runs for tens of
    seconds on a loaded machine, but holds the model for a fraction of a second at a time. Each
    step is timed on its own, so what runs in between is not counted. The caller must not hold
    the lock."""
    n = ids.shape[0]
    model = lm.model
    ids = ids.to(lm.input_device)
    turns = Turns(lm.lock)

    def timed(fn: Callable[[], object]) -> float:
        turns.between()
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)

    def cached() -> list[float]:
        cache, steps = None, []
        for t in range(n):
            turns.between()  # the KV cache waits meanwhile: it is this request's own
            t0 = time.perf_counter()
            out = model(input_ids=ids[None, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(1e3 * (time.perf_counter() - t0))
        return steps

    def prefix(t: int) -> Callable[[], object]:
        return lambda: model(input_ids=ids[None, : t + 1], use_cache=False)

    def uncached() -> list[float]:
        return [timed(prefix(t)) for t in range(n)]

    def parallel() -> object:
        return model(input_ids=ids[None], use_cache=False)

    parallel_runs: list[float] = []
    cache_runs: list[list[float]] = []
    no_cache_runs: list[list[float]] = []
    with turns, torch.inference_mode():
        timed(parallel), cached(), uncached()  # warm-up, not timed
        for _ in range(repeats):
            parallel_runs.append(timed(parallel))
            cache_runs.append(cached())
            no_cache_runs.append(uncached())

    def per_step(runs: list[list[float]]) -> list[float]:
        return [statistics.median(run[t] for run in runs) for t in range(n)]

    return {"n": n, "repeats": repeats, "parallel_ms": statistics.median(parallel_runs),
            "serial_cache_ms": per_step(cache_runs), "serial_no_cache_ms": per_step(no_cache_runs),
            "parallel_runs_ms": parallel_runs, "cache_totals_ms": [sum(r) for r in cache_runs],
            "no_cache_totals_ms": [sum(r) for r in no_cache_runs]}


# ---- 6. order: same tokens, another order ------------------------------------------------------

def hidden_similarity(a_ids: list[int], a_resid: list[torch.Tensor], b_ids: list[int],
                      b_resid: list[torch.Tensor]) -> list[dict[str, Any]]:
    """For each token of prompt A, the same token (same id) in prompt B, matched in order of
    occurrence, and the cosine of its hidden states at every stage (embedding + position,
    then after each block). ``dog`` and `` dog`` are different ids and are not matched.
    a_resid, b_resid: per stage (n, d)."""
    used: set[int] = set()
    out = []
    for i, tid in enumerate(a_ids):
        j = next((j for j, u in enumerate(b_ids) if u == tid and j not in used), None)
        stages: list[float] = []
        if j is not None:
            used.add(j)
            stages = [float(torch.nn.functional.cosine_similarity(ha[i].float(), hb[j].float(), dim=0))
                      for ha, hb in zip(a_resid, b_resid, strict=True)]
        out.append({"a": i, "b": j, "cos": stages[-1] if stages else None, "cos_by_stage": stages})
    return out


def attention_differences(a_layers: list[LayerAttention], b_layers: list[LayerAttention]) -> list[dict[str, Any]]:
    """Per head: the mean |A - B| of two runs' attention, position by position, over the query
    rows both runs have (cells past a row's end are zero in both). Rebuilt a block of rows at a
    time from each run's kept Q and K: never a whole n x n."""
    out: list[dict[str, Any]] = []
    for layer, (la, lb) in enumerate(zip(a_layers, b_layers, strict=True)):
        n = min(la.n, lb.n)
        total = torch.zeros(la.n_heads, dtype=torch.float64)
        step = min(la.block_rows(), lb.block_rows())
        for q0 in range(0, n, step):
            q1 = min(n, q0 + step)
            wa, wb = la.weights(q0, q1)[0][..., :n], lb.weights(q0, q1)[0][..., :n]  # (H, r, n)
            total += (wa - wb).abs().sum(-1).sum(-1).double().cpu()
        rows = total / max(n, 1) / 2  # (H,): total-variation distance per row, averaged
        out.extend({"layer": layer, "head": h, "diff": float(rows[h])} for h in range(rows.shape[0]))
    return out
