"""Every head's scores while the forward runs: a listener on the capture point (``model.capture.forward``).

The capture knows nothing of scores; it tells its listener each layer's attention as it passes. On the
block path every block of weights feeds a ``ScoreAccumulator`` as it goes, and the layer is complete;
where the fused kernel computed the layer (every causal pair visible, no soft-cap), previous-token,
first-token and induction are summed from single dot products of Q, K and the row normalisers
(``model.scores.pairs``), and entropy and peak are left for ``complete`` -- or, with ``defer``, every field
is left (the analyse answers first; ``model.runs.late`` computes them from the kept layers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from attnscope.model.attention.interface import AttentionCall, LazyMask
from attnscope.model.attention.kept import LayerAttention
from attnscope.model.capture.forward import Captures, Filter, run_with_cache
from attnscope.model.capture.generation import GenerationSession
from attnscope.model.load.models import LoadedModel
from attnscope.model.scores import pairs
from attnscope.model.scores.analysis import HeadScore, ScoreAccumulator


class LiveScores:
    """The head scores of one run (token ids ``ids``, (n,)), heard from its forward or, for a recorded
    generation, swept from its assembled layers; ``LayerListener`` of ``model.capture.forward``."""

    def __init__(self, n_heads: int, ids: torch.Tensor, defer: bool = False) -> None:
        self.n_heads = n_heads
        self.ids = ids
        self.defer = defer  # leave a fused layer's previous-token, first-token and induction for later too
        self.inline: dict[int, ScoreAccumulator] = {}  # layers scored as the forward ran
        self.swept: dict[int, ScoreAccumulator] = {}  # layers scored by the assembly's sweep
        self._pairs: pairs.InductionPairs | None = None
        self.pending: dict[int, frozenset[str]] = {}  # layer -> the fields left for later (``finish(keep=...)``)

    def _scored(self, call: AttentionCall) -> bool:
        """Does this layer's attention feed the head scores (a forward over the whole run from 0)?"""
        mask = call.mask
        n = self.ids.shape[0]
        return (isinstance(mask, LazyMask) and mask.q_offset == 0 and mask.kv_offset == 0
                and mask.kv_length == mask.q_length == n)

    def attention_block(self, layer: int, q0: int, k0: int, weights: torch.Tensor, allowed: torch.Tensor,
                        call: AttentionCall) -> None:
        """Rows [q0, q0 + r) over keys [k0, k0 + w): weights (H, r, w)."""
        if self._scored(call):
            if layer not in self.inline:
                self.inline[layer] = ScoreAccumulator(weights.shape[0], self.ids)
            self.inline[layer].add(q0, weights, k0)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, call: AttentionCall,
                  blocks: bool) -> None:
        """A layer done: after the block path its scores are complete; after the fused kernel the pair
        scores are summed here (unless deferred), entropy and peak left."""
        if blocks and layer in self.inline:
            self.inline[layer].todo.clear()  # every row's weights went through add()
        elif not blocks and self._scored(call):
            acc = ScoreAccumulator(q.shape[0], self.ids)  # deferred: every field is owed
            if not self.defer:
                if self._pairs is None:
                    self._pairs = pairs.InductionPairs.of(self.ids)
                scaling, softcap = call.scaling, call.softcap
                prev, first = pairs.prev_first_sums(q, k, lse, scaling=scaling, softcap=softcap)
                induction = pairs.induction_sums(q, k, lse, self._pairs, scaling=scaling, softcap=softcap)
                acc.add_sums(prev=prev, first=first, induction=induction)
            self.inline[layer] = acc

    def sweep(self, layer: int) -> Callable[[int, torch.Tensor], None] | None:
        """The assembly's sweep of a layer the forward did not score (no normalisers: a module-read family,
        or a recorded generation's steps) feeds a fresh accumulator."""
        if layer in self.inline:
            return None
        self.swept[layer] = ScoreAccumulator(self.n_heads, self.ids)
        return self.swept[layer].add

    def finish(self, layers: list[LayerAttention], keep_pending: bool = False) -> list[HeadScore]:
        """Every head's scores, exact over all rows: the fields a fused forward left are computed from the
        kept layer now, or, with ``keep_pending``, left as None and named by layer in ``pending``."""
        for i, acc in self.inline.items():
            if keep_pending and acc.todo:
                self.pending[i] = frozenset(acc.todo)
            else:
                complete(acc, layers[i], self._pairs)
        # a swept layer is complete: the assembly's sweep passed every row's weights through add()
        return [s for i in range(len(layers))
                for s in (self.inline[i] if i in self.inline else self.swept[i]).finish(
                    i, self.pending.get(i, frozenset()))]


# A layer of at most this many weights (heads x n x n: 4 MiB of float32) is scored from its weights in one
# block: below it the pair sums' many small steps cost more than the block (SmolLM2, 9 heads: 118 -> 85 ms
# at 64 tokens, 265 -> 180 ms at 256 for its 30 layers; the pair sums win from 512 tokens on)
DENSE_CELLS = 1 << 20


def complete(acc: ScoreAccumulator, kept: LayerAttention, induction_pairs: pairs.InductionPairs | None = None,
             pause: Callable[[], None] | None = None) -> None:
    """The scores a fused forward left, exactly: on a fused causal layer from Q, K and lse
    (``model.scores.pairs``: previous-token, first-token and induction from single dot products, entropy
    and peak in one tiled pass over the visible cells), else -- or for a layer of at most ``DENSE_CELLS``
    weights -- with one more pass over the visible cells.
    ``induction_pairs``: the run's, if the caller has them (one run's layers share them). ``pause`` (a
    background sweep's) is called between the parts and blocks: a request waiting for the CPU (a tile a
    person asked for) waits for a part, not for a whole layer."""
    if not acc.todo:
        return
    wait = pause if pause is not None else (lambda: None)
    if kept.fused_causal and kept.lse is not None and kept.n_heads * kept.n * kept.n > DENSE_CELLS:
        q, k, lse, todo = kept.q, kept.k, kept.lse, acc.todo
        sums: dict[str, torch.Tensor] = {}
        if todo & {"prev", "first"}:
            sums["prev"], sums["first"] = pairs.prev_first_sums(q, k, lse, scaling=kept.scaling, softcap=None)
        if "induction" in todo:
            wait()
            found = induction_pairs if induction_pairs is not None else pairs.InductionPairs.of(acc.ids)
            sums["induction"] = pairs.induction_sums(q, k, lse, found, scaling=kept.scaling, softcap=None)
        if todo & {"entropy", "peak"}:
            wait()
            sums["entropy"], sums["peak"] = pairs.entropy_and_peak(q, k, lse, kept.scaling, pause=pause)
        acc.add_sums(**{field: value for field, value in sums.items() if field in todo})
        return
    for q0, _q1, weights, _visible in kept.blocks():
        wait()
        acc.add(q0, weights)
    acc.todo.clear()


def scored_run(lm: LoadedModel, input_ids: torch.Tensor, names: Iterable[str] | Filter | None = None,
               defer: bool = False) -> tuple[Captures, LiveScores, list[HeadScore]]:
    """``run_with_cache`` with every head's scores (``input_ids`` (n,)). ``timing_ms`` of the captures gains
    "exact_scores": the ms of the sweep for the fields the forward could not give on the way (and of the
    assembly, where it swept every row for the scores; otherwise the assembly counts in "forward"). With
    ``defer``, the fused layers' fields are all left (about a third of the capture's own cost at 1k tokens):
    None in the scores, named by layer in the listener's ``pending`` for ``model.runs.late``.
    The caller holds ``lm.lock``."""
    scores = LiveScores(lm.info.n_heads, input_ids.to(lm.input_device), defer=defer)
    acts = run_with_cache(lm, input_ids, names, scores)
    acts.timing_ms["exact_scores"] = 0.0
    t0 = time.perf_counter()
    with torch.inference_mode():
        heads = scores.finish(acts.layers, keep_pending=defer)
    # the assembly counts as scoring where it swept every row for the scores, else as part of the forward
    timing = acts.timing_ms
    timing["exact_scores" if scores.swept else "forward"] += timing["assemble"]
    timing["exact_scores"] += 1e3 * (time.perf_counter() - t0)
    return acts, scores, heads


def scored_recording(session: GenerationSession) -> tuple[Captures, list[HeadScore]]:
    """A recorded generation as one run: its activations, kept layers and every head's scores, swept once
    over each layer's rows as the assembly rebuilds its normalisers."""
    scores = LiveScores(session.lm.info.n_heads, session.ids)
    acts = session.finish_recording(scores)
    with torch.inference_mode():
        return acts, scores.finish(acts.layers)
