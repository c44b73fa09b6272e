"""Measurements on synthetic input, once per model.

The induction score follows Olsson et al. (2022): a random token sequence repeated
twice; an induction head attends from a token in the second copy to the token that
followed its earlier occurrence. Per layer x head. Measured when first asked for
(``induction``), not when an engine is built: ``attnscope serve`` asks before it binds,
tests only when they read it. ``check_attention`` is the cheap start-up check: one
forward over two tokens.
"""

from __future__ import annotations

import torch

from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.names import act_name, kind_of
from attnscope.model.load.models import LoadedModel


def repeated_random_tokens(vocab_size: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    low = min(100, vocab_size // 4)  # skip the first ids: special and byte tokens
    half = torch.randint(low, vocab_size, (length,), generator=gen)
    return torch.cat([half, half])  # (2 * length,)


def induction_scores(lm: LoadedModel, length: int = 50, seeds: int = 4) -> list[list[float]]:
    """(layers x heads) mean attention from i to i - length + 1 in the second copy. Caller holds the lock."""
    length = min(length, (lm.info.max_positions or 2 * length) // 2)
    totals = torch.zeros(lm.info.n_layers, lm.info.n_heads)
    for seed in range(seeds):
        ids = repeated_random_tokens(lm.info.vocab_size, length, seed)
        acts = run_with_cache(lm, ids, lambda name: kind_of(name) == "pattern")
        for layer in range(lm.info.n_layers):
            pattern = acts[act_name("pattern", layer)]  # (H, 2L, 2L)
            q = torch.arange(length, 2 * length, device=pattern.device)
            totals[layer] += pattern[:, q, q - length + 1].mean(-1).cpu()
    return (totals / seeds).tolist()


def induction(lm: LoadedModel) -> list[list[float]]:
    """The model's induction scores, measured on the first call and kept with the model."""
    memo = lm.probes
    with memo.lock:
        if memo.induction is None or memo.induction[0] is not lm.model:
            with lm.lock:
                memo.induction = (lm.model, induction_scores(lm))
        return memo.induction[1]


def check_attention(lm: LoadedModel) -> None:
    """Raise AttentionUnavailable unless the model's attention returns its weights (one
    forward over two tokens, block 0's pattern kept); once per model."""
    memo = lm.probes
    with memo.lock:
        if memo.attention_checked is lm.model:
            return
        ids = repeated_random_tokens(lm.info.vocab_size, 1)  # (2,)
        first = act_name("pattern", 0)
        with lm.lock:
            run_with_cache(lm, ids, [first])
        memo.attention_checked = lm.model
