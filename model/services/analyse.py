"""Analyse: one forward over a prompt's tokens, its predictions and head scores, kept in the run store.

The engine tokenizes within its limits and hands the tokens here; a recorded generation is kept the same
way. Nothing here knows of HTTP; the caller holds no lock (each forward takes the model's).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from attnscope.model.capture.forward import RESIDUAL, Captures
from attnscope.model.capture.names import act_name
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import Token, ids_tensor, token_map, tokens_of
from attnscope.model.results import ActualNext, PositionPrediction, RunSummary, TokenProb
from attnscope.model.runs.budget import Estimate, MemoryBudget, admit, estimate, mib, summary_bytes
from attnscope.model.runs.late import ScoreWorker
from attnscope.model.runs.record import PendingScores, RunRecord, RunStore
from attnscope.model.scores import analysis, live
from attnscope.model.scores.analysis import HeadScore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """A run just kept: its id in the store and its record."""

    run_id: str
    record: RunRecord


class Analyser:
    """Runs the forward of an analyse and keeps the run: ``store`` holds it, ``budget`` bounds the memory
    the forward needs, ``scores`` computes the head scores a fused forward leaves for later."""

    def __init__(self, store: RunStore, budget: MemoryBudget, scores: ScoreWorker) -> None:
        self.store = store
        self.budget = budget
        self.scores = scores

    def admit(self, lm: LoadedModel, n: int, top_k: int) -> Estimate:
        """What a run of n tokens will keep and need; 413 (TooLarge) when it could never be kept."""
        est = estimate(lm, n, top_k)
        admit(est, self.store.max_bytes)
        return est

    def analyse(self, lm: LoadedModel, text: str, tokens: list[Token], top_k: int, t0: float) -> RunResult:
        """One forward over ``tokens`` (of ``text``, tokenized from ``t0`` on) under the model's lock and
        the memory budget: the run's activations, head scores (some left to the worker) and predictions,
        kept in the store."""
        ids = ids_tensor(tokens)  # (n,)
        est = self.admit(lm, len(tokens), top_k)
        t1 = time.perf_counter()
        with self.budget.reserve(est.peak), lm.lock:
            acts, scores, heads = live.scored_run(lm, ids, RESIDUAL, defer=True)
            t2 = time.perf_counter()
            preds = self.predictions(lm, acts[act_name("resid_post", lm.info.n_layers - 1)], ids, top_k)
            if scores.pending:  # entropy and peak follow from the worker: "exact_scores" comes with them
                timing = {"tokenize": 1e3 * (t1 - t0), "forward": 1e3 * (t2 - t1)}
                return self.store_run(lm, text, tokens, acts, heads, preds, top_k, timing, t0,
                                      PendingScores(fields=dict(scores.pending), started=t0))
            exact = acts.timing_ms.get("exact_scores", 0.0)  # the block path's sweep, where it needed one
            return self.store_run(lm, text, tokens, acts, heads, preds, top_k,
                                  {"tokenize": 1e3 * (t1 - t0), "forward": 1e3 * (t2 - t1) - exact,
                                   "exact_scores": exact}, t0)

    def predictions(self, lm: LoadedModel, final_resid: torch.Tensor, ids: torch.Tensor,
                    top_k: int) -> list[PositionPrediction]:
        """Every position's next-token candidates: the LM head over the kept final residual, a block of
        rows at a time (the model's own logits, never all n x vocab at once). Caller holds ``lm.lock``."""
        head = lm.lm_head()
        if head is None:
            return []
        with torch.inference_mode():
            preds = analysis.predictions_by_block(lambda a, b: head.logits(final_resid[a:b]), final_resid.shape[0],
                                                  ids, top_k, lm.info.vocab_size)
        return named_predictions(lm, preds)

    def store_run(self, lm: LoadedModel, text: str, tokens: list[Token], acts: Captures, heads: list[HeadScore],
                  preds: list[PositionPrediction], top_k: int, timing: dict[str, float], t0: float,
                  pending: PendingScores | None = None) -> RunResult:
        """Keep one run's activations (from one forward, or a recorded generation) with its scores;
        the scores still ``pending`` are handed to the worker once the run is stored."""
        t2 = time.perf_counter()
        ids = ids_tensor(tokens)
        t3 = time.perf_counter()
        summary = RunSummary(model=lm.info.name, tokens=list(tokens), predictions=preds, heads=heads,
                             timing_ms={**timing, "analysis": 1e3 * (t3 - t2), "total": 1e3 * (t3 - t0)},
                             scores_pending=tuple(pending.names) if pending is not None else ())
        k = min(top_k, lm.info.vocab_size)
        # the pending heads are counted here as complete ones: their late scores replace them in place
        record = build_record(lm, ids, acts, summary, text, summary_bytes(len(tokens), len(preds), k, len(heads)))
        record.pending = pending
        run_id = self.store.add(record)
        if pending is not None:
            self.scores.submit(run_id, record)
        log.info("run %s: %s, %d tokens, %s kept, %.0f ms", run_id, lm.info.name, len(tokens), mib(record.nbytes),
                 1e3 * (t3 - t0))
        return RunResult(run_id=run_id, record=record)

    def store_generation(self, lm: LoadedModel, prompt: str, prompt_tokens: list[Token], new_ids: list[int],
                         acts: Captures, heads: list[HeadScore], top_k: int = 10) -> RunResult:
        """A recorded generation as a normal run over prompt + generated text."""
        t0 = time.perf_counter()
        new_text, new_tokens = tokens_of(lm.tokenizer, new_ids, len(prompt_tokens), len(prompt))
        tokens, text = [*prompt_tokens, *new_tokens], prompt + new_text
        self.admit(lm, len(tokens), top_k)
        with lm.lock:
            preds = self.predictions(lm, acts[act_name("resid_post", lm.info.n_layers - 1)], ids_tensor(tokens), top_k)
        return self.store_run(lm, text, tokens, acts, heads, preds, top_k, {"recorded_steps": float(len(new_ids))},
                              t0)



def build_record(lm: LoadedModel, ids: torch.Tensor, acts: Captures, summary: RunSummary,
                text: str, summary_bytes: int) -> RunRecord:
    """Keep references to the captured tensors: no copy, no dtype conversion."""
    n_layers = lm.info.n_layers
    return RunRecord(
        model=lm.info.name,
        causal=lm.info.causal,
        input_ids=ids,
        attention=acts.layers,
        resid=[acts[act_name("resid_pre", 0)]] + [acts[act_name("resid_post", i)] for i in range(n_layers)],
        attn_out=[acts[act_name("attn_out", i)] for i in range(n_layers)],
        mlp_out=[acts[act_name("mlp_out", i)] for i in range(n_layers)],
        summary=summary,
        text=text,
        summary_bytes=summary_bytes,
    )


def named_predictions(lm: LoadedModel, preds: list[analysis.Prediction]) -> list[PositionPrediction]:
    """Predictions with each candidate's display string (every id decoded once)."""
    strings = token_map(lm.tokenizer, [i for p in preds for i in p.top_ids]
                        + [p.next_id for p in preds if p.next_id is not None])
    out = []
    for p in preds:
        actual = None
        if p.next_id is not None and p.next_prob is not None and p.next_rank is not None:
            actual = ActualNext(id=p.next_id, token=strings[p.next_id], prob=p.next_prob, rank=p.next_rank)
        out.append(PositionPrediction(
            position=p.position,
            top=[TokenProb(id=i, token=strings[i], prob=q) for i, q in zip(p.top_ids, p.top_probs, strict=True)],
            actual_next=actual))
    return out
