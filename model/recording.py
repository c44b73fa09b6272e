"""Record every step of a KV-cache generation and assemble it into one ordinary run.

Each forward of a generation sees only the tokens the cache has not seen: the
prefill sees the prompt (its patterns are (H, n, n)), each later step one token
(patterns (H, 1, t + 1)). Stacking those rows gives exactly the (H, N, N) pattern a
fresh forward over the whole text would give; the tests check it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model.names import LOGITS, act_name, kind_of


@dataclass
class Recorder:
    chunks: list[dict[str, torch.Tensor]] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # (rows, V) per forward

    def add(self, acts: dict[str, torch.Tensor], logits: torch.Tensor | None) -> None:
        self.chunks.append(dict(acts))
        if logits is not None:
            self.logits.append(logits.float())

    @property
    def n(self) -> int:
        return sum(c[act_name("resid_pre", 0)].shape[0] for c in self.chunks)

    def new_rows(self, layer: int, head: int) -> list[list[float]]:
        """The rows of one head computed by the latest forward (visible keys only)."""
        pattern = self.chunks[-1][act_name("pattern", layer)][head]  # (rows, keys)
        keys = pattern.shape[-1]
        first = keys - pattern.shape[0]
        return [pattern[r, : first + r + 1].tolist() for r in range(pattern.shape[0])]

    def assemble(self) -> dict[str, torch.Tensor]:
        """The activations under run_with_cache's names, over all N recorded positions."""
        n = self.n
        out: dict[str, torch.Tensor] = {}
        for name in self.chunks[0]:
            parts = [c[name] for c in self.chunks]
            if kind_of(name) == "pattern":
                heads = parts[0].shape[0]
                full = torch.zeros(heads, n, n, device=parts[0].device)
                row = 0
                for p in parts:  # (H, rows, keys): keys = every position up to the last row
                    full[:, row : row + p.shape[1], : p.shape[2]] = p
                    row += p.shape[1]
                out[name] = full
            else:
                out[name] = torch.cat(parts, dim=0)  # (N, d)
        if self.logits:
            out[LOGITS] = torch.cat(self.logits, dim=0)  # (N, V)
        return out
