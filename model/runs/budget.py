"""Admission control: what a run will keep and what its forward will need, known before it runs.

A kept run (``model.runs.record.RunRecord``) holds, for n tokens, L layers, H heads, Hkv K/V
heads, dh = d_head, d = d_model and top-k candidates per position:

    tensors  4 n [L (H + Hkv) dh + L H (+ L H with ALiBi) + (3L + 1) d] + 8 n
    summary  500 n + 300 n (k + 1) + 600 L H            (the estimate the engine counts)

which ``estimate`` returns exactly (``tests/test_admission.py`` checks it against a kept run).
The forward's peak adds, on top of what it keeps, the model's own activations for n tokens
(a few (n, d) and (n, d_mlp) tensors), one block of attention weights (``BLOCK_CELLS`` per
tensor, a handful alive at once), the last position's logits, and — for families read from
their module in eager mode (gpt_neo, bloom) — their own (H, n, n) weights of one layer — and for
a model that builds its own additive mask (ALiBi Falcon, ``ArchSpec.mask == "dense"``) that
(1, H, n, n) mask with the boolean masks it is made from, alive for the whole forward.

``MemoryBudget`` holds the bytes of every forward in flight (its peak): a request whose peak
alone exceeds the budget is refused (413), one that fits later waits until enough of the
others are done. It sits beside the model locks, so two long prompts on two models do not
run at once when together they would overrun the memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from attnscope.model.attention.interface import BLOCK_CELLS
from attnscope.model.errors import TooLarge
from attnscope.model.load.models import LoadedModel
from attnscope.model.scores.analysis import BLOCK_BYTES, SLICE_BYTES, block_rows

MIB = 1 << 20


def mib(nbytes: int) -> str:
    return f"{max(1, round(nbytes / MIB)):,} MiB"


def mib_over(nbytes: int, limit: int) -> tuple[str, str]:
    """``nbytes`` and the ``limit`` it exceeds, in MiB with as many decimals as it takes for the two
    figures to differ ("would keep 32.01 MiB ... holds at most 32 MiB", never "32 MiB ... at most
    32 MiB"; a whole number of MiB stays whole); in bytes when three decimals cannot tell them apart."""
    if mib(nbytes) != mib(limit):
        return mib(nbytes), mib(limit)
    for decimals in (1, 2, 3):
        over, cap = (f"{x / MIB:,.{decimals}f}" for x in (nbytes, limit))
        if over != cap:
            return (mib(nbytes) if nbytes % MIB == 0 else f"{over} MiB",
                    mib(limit) if limit % MIB == 0 else f"{cap} MiB")
    return f"{nbytes:,} bytes", f"{limit:,} bytes"


def summary_bytes(n: int, predictions: int, top_k: int, heads: int) -> int:
    """The summary's Python objects, estimated: ~0.5 kB a token, ~0.3 kB a predicted candidate
    (``predictions`` positions with top-k and the actual next token each), ~0.6 kB a head."""
    return 500 * n + 300 * predictions * (top_k + 1) + 600 * heads


@dataclass(frozen=True)
class Estimate:
    n: int
    keep: int  # bytes the stored run will hold (its nbytes)
    peak: int  # bytes the forward needs at its peak, what it keeps included


def estimate(lm: LoadedModel, n: int, top_k: int) -> Estimate:
    info = lm.info
    layers, heads, kv, dh, d = info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model
    alibi = heads if info.position_encoding == "alibi" else 0
    tensors = 4 * n * (layers * (heads + kv) * dh + layers * (heads + alibi) + (3 * layers + 1) * d) + 8 * n
    k = min(top_k, info.vocab_size)
    keep = tensors + summary_bytes(n, n if info.has_lm_head else 0, k, layers * heads)
    activations = 4 * n * (8 * d + 3 * info.d_mlp + 3 * (heads + kv) * dh)  # one block's live tensors
    attention = 6 * 4 * BLOCK_CELLS
    if lm.spec.capture == "module":
        attention += 3 * 4 * heads * n * n  # the family's own eager weights, one layer at a time
    if lm.spec.mask == "dense":
        attention += 4 * (heads + 1) * n * n + 2 * n * n  # the model's additive mask and what it is built from
    # predictions: one block of logits, and a slice's temporaries (model.scores.analysis)
    logits = 4 * info.vocab_size * min(n, block_rows(info.vocab_size, BLOCK_BYTES)) + 3 * SLICE_BYTES
    return Estimate(n=n, keep=keep, peak=keep + activations + attention + logits)


class MemoryBudget:
    """Bytes that forwards in flight may hold at once; requests wait for room (a condition variable)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._used = 0
        self._cond = threading.Condition()

    @property
    def used(self) -> int:
        with self._cond:
            return self._used

    @contextmanager
    def reserve(self, nbytes: int, timeout: float | None = None) -> Iterator[None]:
        """Hold ``nbytes`` for the duration of the ``with``; wait while others hold too much."""
        if nbytes > self.total:
            need, total = mib_over(nbytes, self.total)
            raise TooLarge(f"this prompt's forward would need {need} at its peak; forwards in flight may "
                           f"use at most {total} (ATTNSCOPE_FORWARD_BYTES)", code="forward_too_big",
                           params={"need": need, "limit": total})
        with self._cond:
            if not self._cond.wait_for(lambda: self._used + nbytes <= self.total, timeout=timeout):
                raise TooLarge(f"this prompt's forward would need {mib(nbytes)}; the server is busy with other "
                               f"long prompts, try again shortly", code="forward_busy", params={"need": mib(nbytes)})
            self._used += nbytes
        try:
            yield
        finally:
            with self._cond:
                self._used -= nbytes
                self._cond.notify_all()


def admit(est: Estimate, cache_cap: int) -> None:
    """Refuse a run that could never be kept (413), before its forward."""
    if est.keep > cache_cap:
        keep, cap = mib_over(est.keep, cache_cap)
        raise TooLarge(f"this prompt's run would keep {keep} ({est.n:,} tokens; its forward peaks "
                       f"near {mib(est.peak)}); the run store holds at most {cap} "
                       "(ATTNSCOPE_RUN_STORE_BYTES)", code="run_too_big",
                       params={"keep": keep, "tokens": est.n, "peak": mib(est.peak), "cap": cap})
