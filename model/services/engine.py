"""The inspection engine: configured models, one forward per prompt, runs kept by id.

The engine is created in the app's lifespan and shared by all requests. Each model
has a lock: one forward at a time per model. Handlers call the engine from a
thread pool, never on the event loop.

An analyse answers right after its forward and predictions: the head scores a fused forward
left (entropy, peak) are computed afterwards by ``scores`` (``model.runs.late.ScoreWorker``,
one background thread), and ``wait_scores`` waits for them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from attnscope.model.capture.forward import RESIDUAL, Captures
from attnscope.model.capture.generation import tempered_logits
from attnscope.model.capture.names import act_name
from attnscope.model.errors import BadInput, Param, RunDetached, UnknownModel
from attnscope.model.learn import embedding
from attnscope.model.load.fingerprint import model_fingerprint, tokenizer_fingerprint
from attnscope.model.load.models import LMHead, LoadedModel
from attnscope.model.load.tokens import (
    TextAssembler,
    Token,
    TokenCount,
    count_tokens,
    first_tokens,
    ids_tensor,
    read_cap,
    token_map,
    tokenize,
)
from attnscope.model.results import (
    ActualNext,
    LensPosition,
    LensStage,
    LogitLens,
    NextDistribution,
    PositionPrediction,
    RunSummary,
    TokenProb,
)
from attnscope.model.runs.budget import Estimate, MemoryBudget, admit, estimate, mib, summary_bytes
from attnscope.model.runs.late import ScoreWorker
from attnscope.model.runs.persist import Origin, RunFiles
from attnscope.model.runs.record import PendingScores, RunRecord, RunStore
from attnscope.model.scores import analysis, live, probes
from attnscope.model.scores.analysis import HeadScore

log = logging.getLogger(__name__)
DEFAULT_FORWARD_BYTES = 4 << 30


@dataclass(frozen=True)
class RunResult:
    run_id: str
    record: RunRecord


class Engine:
    def __init__(self, models: dict[str, LoadedModel], default: str, store: RunStore, max_tokens: int,
                 forward_bytes: int = DEFAULT_FORWARD_BYTES) -> None:
        if default not in models:
            raise UnknownModel(default, list(models))
        # the configured name is the model's name everywhere (runs, API, logs)
        # (a renamed copy shares the model and its lock)
        self.models = {key: lm if lm.info.name == key else replace(lm, info=replace(lm.info, name=key))
                       for key, lm in models.items()}
        self.default = default
        self.store = store
        self.max_tokens = max_tokens
        self.budget = MemoryBudget(forward_bytes)
        self.scores = ScoreWorker(store, self.budget)  # the head scores runs still owe, after they answered
        self._warm_stop = threading.Event()
        self._warm_thread: threading.Thread | None = None
        self._origins: dict[str, Origin] = {}  # model name -> its fingerprints, computed once (run files)
        self._origins_lock = threading.Lock()
        # name -> what loads it: models offered but loaded on first use (an installed real model beside the
        # bundled default, which must start in seconds); ``model(name)`` loads one once, under this lock
        self.loadable: dict[str, tuple[str, Callable[[], LoadedModel]]] = {}  # name -> (about, loader)
        self._load_lock = threading.Lock()
        store.on_load = self.owe_scores  # a run read back from its file may still owe head scores
        for lm in self.models.values():
            probes.check_attention(lm)  # a model whose attention returns no weights never serves

    def warm_up(self) -> threading.Thread:
        """Compute, in one background thread, what the Learn views compute once per model (the
        embedding lesson's untrained rows: a V x V sweep, seconds for a 30k vocabulary), so that the
        first such request answers as fast as the next; one that comes meanwhile waits for it."""

        stop = self._warm_stop
        models = list(self.models.values())

        def run() -> None:
            for lm in models:
                t0 = time.perf_counter()
                try:
                    warmed = embedding.warm(lm, stop)
                except embedding.Stopped:
                    return
                except Exception:  # a request computes it again, and says what failed
                    log.exception("warming up %s failed", lm.info.name)
                    continue
                if warmed:
                    log.info("warmed up %s in %.1f s", lm.info.name, time.perf_counter() - t0)
                else:
                    log.info("%s: the embedding view's sweep (%.1e FLOP) is left to its first request",
                             lm.info.name, embedding.sweep_flops(lm))

        thread = self._warm_thread = threading.Thread(target=run, name="attnscope-warm-up", daemon=True)
        thread.start()

        def stop_and_join() -> None:  # torch aborts the process if a daemon thread is inside it at exit
            stop.set()
            thread.join(timeout=60)

        atexit.register(stop_and_join)
        return thread

    # ---- lookup -----------------------------------------------------------------
    def model(self, name: str | None) -> LoadedModel:
        key = self.default if name is None else name
        if key not in self.models:
            if key in self.loadable:
                return self._load(key)
            raise UnknownModel(key, list(self.models) + list(self.loadable))
        return self.models[key]

    def offer(self, name: str, about: str, loader: Callable[[], LoadedModel]) -> None:
        """Offer a model that ``model(name)`` loads on first use (``GET /api/models`` lists it as available)."""
        if name not in self.models:
            self.loadable = {**self.loadable, name: (about, loader)}

    def _load(self, name: str) -> LoadedModel:
        """Load an offered model once; requests for it meanwhile wait here (others go on). The dicts are
        replaced, never changed in place, so a reader iterating the old one is undisturbed."""
        with self._load_lock:
            if name in self.models:
                return self.models[name]
            _about, loader = self.loadable[name]
            t0 = time.perf_counter()
            log.info("loading %s on first use", name)
            lm = loader()
            lm = lm if lm.info.name == name else replace(lm, info=replace(lm.info, name=name))
            probes.check_attention(lm)
            self.models = {**self.models, name: lm}
            self.loadable = {k: v for k, v in self.loadable.items() if k != name}
            log.info("loaded %s on first use in %.1f s", name, time.perf_counter() - t0)
            return lm

    def model_of(self, record: RunRecord) -> LoadedModel:
        """The model that made this run, as it was: a run read back from its file whose model is not
        loaded here, or has changed since, is refused (409) by every tool that runs the model."""
        if record.model not in self.models and record.model in self.loadable:
            self._load(record.model)
        if record.model not in self.models:
            raise RunDetached(f"this run was made with the model {record.model!r}, which is not loaded here "
                              f"(loaded: {', '.join(sorted(self.models))}): its attention is read from the run, "
                              "but this needs the model", code="run_model_missing",
                              params={"model": record.model, "available": sorted(self.models)})
        # a run made here carries no fingerprint (its model is the one loaded); one read from a file does:
        # only that model is fingerprinted, once
        if record.model_fingerprint and self.origin_of(record.model).model_fingerprint != record.model_fingerprint:
            raise RunDetached(f"the model {record.model!r} has changed since this run was made (its weights or "
                              "configuration differ): its attention is read from the run, but this needs the "
                              "model as it was", code="run_model_changed", params={"model": record.model})
        return self.models[record.model]

    def origin_of(self, name: str) -> Origin:
        """A loaded model's fingerprints and dtype, computed once (O(parameters))."""
        with self._origins_lock:
            origin = self._origins.get(name)
            if origin is None:
                lm = self.models[name]
                origin = self._origins[name] = Origin(model_fingerprint(lm.model), tokenizer_fingerprint(lm.tokenizer),
                                                      lm.info.dtype)
            return origin

    def forget_origins(self) -> None:
        """The models may have changed (a Scope's model is the user's, edited at will): fingerprint again."""
        with self._origins_lock:
            self._origins.clear()

    def origin(self, record: RunRecord) -> Origin | None:
        """Who made a run, for its file: None when its model is not loaded here (a run read back)."""
        if record.model_fingerprint or record.model not in self.models:
            return None
        return self.origin_of(record.model)

    def owe_scores(self, run_id: str, record: RunRecord) -> None:
        """A stored run that still owes head scores (read from a file written before they came) gets them."""
        if record.pending is not None:
            self.scores.submit(run_id, record)

    def token_limit(self, lm: LoadedModel) -> int:
        """ATTNSCOPE_MAX_TOKENS, bounded only by the model's positions (ALiBi models have no bound)."""
        return self.max_tokens if lm.info.max_positions is None else min(self.max_tokens, lm.info.max_positions)

    def tokenize(self, lm: LoadedModel, text: str) -> list[Token]:
        if not text.strip():
            raise BadInput("text is empty or only whitespace; type a prompt to analyse", code="empty")
        limit = self.token_limit(lm)
        unread(lm, text, limit, "prompt")
        too_long(count_tokens(lm.tokenizer, text, limit), limit, "prompt", len(text))  # reads no more than it needs
        tokens = tokenize(lm.tokenizer, text)
        too_long(TokenCount(n=len(tokens), exact=True, chars=len(text)), limit, "prompt", len(text))
        return tokens

    def chat_tokens(self, lm: LoadedModel, messages: list[dict[str, str]]) -> tuple[str, list[Token]]:
        """A chat rendered with the model's chat template (and its generation prompt); the
        template's special tokens stay visible and are marked special."""
        if not getattr(lm.tokenizer, "chat_template", None):
            raise BadInput(f'model {lm.info.name!r} has no chat template: send "text" instead of "messages"',
                           code="chat_template_missing", params={"model": lm.info.name})
        try:
            text = lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template raises whatever its Jinja code raises; all are bad input
            raise BadInput(f"the model's chat template rejected these messages: {exc}", code="chat_template_rejected",
                           params={"reason": str(exc)}) from None
        if not isinstance(text, str) or not text:
            raise BadInput("the model's chat template rendered nothing for these messages", code="chat_template_empty")
        special = {int(i) for i in getattr(lm.tokenizer, "all_special_ids", [])}
        limit = self.token_limit(lm)
        unread(lm, text, limit, "chat")
        too_long(count_tokens(lm.tokenizer, text, limit, add_special_tokens=False), limit, "chat", len(text))
        tokens = [replace(t, special=True) if t.id in special else t
                  for t in tokenize(lm.tokenizer, text, add_special_tokens=False)]
        too_long(TokenCount(n=len(tokens), exact=True, chars=len(text)), limit, "chat", len(text))
        return text, tokens

    # ---- analyse ------------------------------------------------------------------
    def analyse_chat(self, messages: list[dict[str, str]], model: str | None = None, top_k: int = 10) -> RunResult:
        """Like ``analyse``, over a chat rendered with the model's chat template."""
        lm = self.model(model)
        t0 = time.perf_counter()
        text, tokens = self.chat_tokens(lm, messages)
        return self._analyse(lm, text, tokens, top_k, t0)

    def analyse(self, text: str, model: str | None = None, top_k: int = 10, truncate: bool = False) -> RunResult:
        """One forward over ``text``; ``truncate``: over its first token-limit tokens when it has more
        (the run's text is then the beginning they cover), where it would otherwise be refused."""
        lm = self.model(model)
        t0 = time.perf_counter()
        if truncate and text.strip():
            head = first_tokens(lm.tokenizer, text, self.token_limit(lm))  # reads no more than the limit needs
            text, tokens = head.text, head.tokens
        else:
            tokens = self.tokenize(lm, text)
        return self._analyse(lm, text, tokens, top_k, t0)

    def admit(self, lm: LoadedModel, n: int, top_k: int) -> Estimate:
        """What a run of n tokens will keep and need; 413 (TooLarge) when it could never be kept."""
        est = estimate(lm, n, top_k)
        admit(est, self.store.max_bytes)
        return est

    def _analyse(self, lm: LoadedModel, text: str, tokens: list[Token], top_k: int, t0: float) -> RunResult:
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
        """Every position's next-token candidates: the LM head over the kept final residual, 64 rows at
        a time (the model's own logits, never all n x vocab at once). Caller holds ``lm.lock``."""
        head = lm.lm_head()
        if head is None:
            return []
        with torch.inference_mode():
            preds = analysis.predictions_by_block(lambda a, b: head.logits(final_resid[a:b]), final_resid.shape[0],
                                                  ids, top_k)
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
        asm = TextAssembler(lm.tokenizer)
        tokens, text = list(prompt_tokens), prompt
        pieces = [asm.push(tid) for tid in new_ids]
        rest = asm.finish()  # bytes of a character left incomplete: shown as U+FFFD, on the last token
        for k, (tid, p) in enumerate(zip(new_ids, pieces, strict=True)):
            owned = p.text + (rest if k == len(new_ids) - 1 else "")
            tokens.append(Token(index=len(tokens), id=tid, text=p.display, start=len(text), end=len(text) + len(owned),
                                special=p.special, partial=p.partial))
            text += owned
        self.admit(lm, len(tokens), top_k)
        with lm.lock:
            preds = self.predictions(lm, acts[act_name("resid_post", lm.info.n_layers - 1)], ids_tensor(tokens), top_k)
        return self.store_run(lm, text, tokens, acts, heads, preds, top_k, {"recorded_steps": float(len(new_ids))},
                              t0)

    def run(self, run_id: str) -> RunRecord:
        return self.store.get(run_id)

    def wait_scores(self, run_id: str, timeout: float | None) -> RunRecord:
        """The run once its head scores are all computed, or as it is after ``timeout`` seconds (its
        ``summary.scores_pending`` then still names what is owed). RunNotFound (expired) if the run was
        evicted meanwhile."""
        record = self.store.get(run_id)
        if record.pending is not None and record.summary.scores_pending:
            record.pending.done.wait(timeout)
        return self.store.get(run_id)

    def close(self) -> None:
        """Stop the background work (the warm-up, the late head scores)."""
        self._warm_stop.set()
        if self._warm_thread is not None:
            self._warm_thread.join(timeout=60)
        self.scores.close()
        backing = self.store.backing
        if isinstance(backing, RunFiles):  # the runs still being written are written
            backing.close()

    def check_layer_head(self, record: RunRecord, layer: int, head: int | None) -> None:
        if not 0 <= layer < record.n_layers:
            raise BadInput(f"layer {layer} is out of range: this model has layers 0..{record.n_layers - 1}",
                           code="layer_out_of_range", params={"layer": layer, "max": record.n_layers - 1})
        if head is not None and not 0 <= head < record.n_heads:
            raise BadInput(f"head {head} is out of range: this model has heads 0..{record.n_heads - 1}",
                           code="head_out_of_range", params={"head": head, "max": record.n_heads - 1})

    # ---- views of a run -------------------------------------------------------------
    def _decoder(self, record: RunRecord, what: str) -> tuple[LoadedModel, LMHead]:
        lm = self.model_of(record)
        head = lm.lm_head()
        if head is None:
            raise BadInput(f"model {lm.info.name!r} is an encoder without an LM head: it has no {what}",
                           code="encoder_no_lm_head", params={"model": lm.info.name})
        return lm, head

    def next_distribution(self, record: RunRecord, position: int, temperature: float,
                          top_k: int) -> NextDistribution:
        """The exact next-token distribution at one position, from the stored final residual."""
        lm, head = self._decoder(record, "next-token distribution")
        if not 0 <= position < record.n:
            raise BadInput(f"position {position} is out of range: this run has positions 0..{record.n - 1}",
                           code="position_out_of_range", params={"position": position, "max": record.n - 1})
        with lm.lock, torch.inference_mode():
            logits = head.logits(record.resid[-1][position]).double()  # (V,)
        logp = tempered_logits(logits, temperature).log_softmax(-1)  # (V,) float64, any temperature > 0
        probs = logp.exp()
        # ranked by the logits, which every temperature keeps in order: where a tiny temperature leaves
        # all but one probability 0, the ties at 0 are not ranked by their ids
        top = logits.topk(min(top_k, logits.shape[-1]))
        ids: list[int] = top.indices.tolist()
        nxt = int(record.input_ids[position + 1]) if position + 1 < record.n else None
        strings = token_map(lm.tokenizer, ids if nxt is None else [*ids, nxt])
        actual = None
        if nxt is not None:
            actual = ActualNext(id=nxt, token=strings[nxt], prob=float(probs[nxt]),
                                rank=int((logits > logits[nxt]).sum()) + 1)
        entropy = -torch.where(probs > 0, probs * logp, torch.zeros_like(probs)).sum()  # 0 log 0 = 0
        return NextDistribution(
            position=position, temperature=temperature,
            top=[TokenProb(id=i, token=strings[i], prob=float(probs[i])) for i in ids],
            actual_next=actual, entropy=max(float(entropy), 0.0))

    def logit_lens(self, record: RunRecord, top_k: int) -> LogitLens:
        lm, head = self._decoder(record, "logit lens")
        with lm.lock:
            probs, ids = analysis.logit_lens(torch.stack(record.resid), head, top_k)  # (L+1, n, k)
        strings = token_map(lm.tokenizer, ids.flatten().tolist())
        id_rows, prob_rows = ids.tolist(), probs.tolist()  # [stage][position][k]
        layers = [
            LensStage(layer=stage - 1, label="embed" if stage == 0 else f"block {stage - 1}", positions=[
                LensPosition(position=pos, top=[TokenProb(id=i, token=strings[i], prob=p)
                                                for i, p in zip(id_rows[stage][pos], prob_rows[stage][pos],
                                                                strict=True)])
                for pos in range(record.n)])
            for stage in range(len(id_rows))
        ]
        return LogitLens(n_layers=lm.info.n_layers, n=record.n, top_k=top_k, layers=layers)

    def sparsity(self, run_id: str) -> list[analysis.HeadSparsity]:
        """How concentrated each head of a run is; computed once, then kept with the run (counted)."""
        record = self.store.get(run_id)
        if record.sparsity is not None:
            return record.sparsity
        heads = []
        for layer, kept in enumerate(record.attention):
            acc = analysis.SparsityAccumulator(kept.n_heads, kept.n)
            for _q0, _q1, weights, _visible in kept.blocks():
                acc.add(weights)  # (H, r, n): every row, exactly, never the whole n x n
            heads += acc.finish(layer)

        def attach() -> bool:
            if record.sparsity is not None:  # another request attached it meanwhile
                return False
            record.sparsity = heads
            return True

        # ~0.3 kB a head's scores, estimated as the summary's are
        self.store.grow(run_id, record, 300 * len(heads), attach)
        return heads


def unread(lm: LoadedModel, text: str, limit: int, what: str) -> None:
    """BadInput for a text longer than its tokenizer's ``read_cap`` (only tokenizers whose tokens
    have no bound on their characters, such as WordPiece's, have one)."""
    cap = read_cap(lm.tokenizer, limit)
    if cap is not None and len(text) > cap:
        raise BadInput(f"the {what} has {len(text):,} characters, more than this model reads for its limit of "
                       f"{limit} tokens ({cap:,}: {cap // limit} a token); send a shorter text",
                       code="too_long_chars", params={"what": what, "chars": len(text), "limit": limit})


def too_long(count: TokenCount, limit: int, what: str, total_chars: int) -> None:
    """BadInput naming the limit when ``count`` is over it; "at least" when only a beginning was counted."""
    if count.n <= limit:
        return
    if count.exact:
        raise BadInput(f"the {what} has {count.n} tokens, more than this model's limit of {limit}",
                       code="too_long", params={"what": what, "tokens": count.n, "limit": limit})
    read = (f"counted in its first {count.chars:,} of {total_chars:,} characters" if count.chars
            else f"from its length of {total_chars:,} characters alone")
    params: dict[str, Param] = {"what": what, "tokens": count.n, "limit": limit, "total_chars": total_chars}
    if count.chars:
        params["read_chars"] = count.chars
    raise BadInput(f"the {what} has at least {count.n} tokens, more than this model's limit of {limit} "
                   f"({read}; the rest was not read)",
                   code="too_long_at_least_read" if count.chars else "too_long_at_least_length", params=params)


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
