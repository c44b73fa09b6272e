"""The induction cells of a repeated text: from each token of the second copy to the token after its first
occurrence (where an induction head looks), and a head's QK attribution summed over them."""

from __future__ import annotations

import torch

from attnscope.model.services.scope import Run
from attnscope.model.tools.qk import Component


def key_side_over_induction_cells(run: Run, layer: int, head: int) -> tuple[torch.Tensor, list[Component], int]:
    """(the key side summed over the cells (C,), the components, how many cells); every cell's terms checked
    against the model's logit on the way."""
    ids = run.record.input_ids.tolist()
    total: torch.Tensor | None = None
    components: list[Component] = []
    cells = 0
    for i in range(len(ids) // 2 + 2, len(ids)):
        earlier = [p for p in range(i - 1) if ids[p] == ids[i] and p + 1 < i]
        if not earlier:
            continue
        cell = run.qk_attribution(layer, head, i, key=earlier[0] + 1)
        assert abs(float(cell.error[0])) < 1e-4 * (1 + abs(float(cell.logit[0])))
        total = cell.key_side[0] if total is None else total + cell.key_side[0]
        components = cell.components
        cells += 1
    assert total is not None
    return total, components, cells
