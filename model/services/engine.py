"""The inspection engine: configured models, one forward per prompt, runs kept by id.

The engine is created in the app's lifespan and shared by all requests. Each model
has a lock: one forward at a time per model. Handlers call the engine from a
thread pool, never on the event loop.

It holds the models (looked up, loaded on first use, fingerprinted for run files), the run store and
the memory budget, and hands each job to its own module: the token limits to ``model.load.limits``, the
analyse itself to ``model.services.analyse`` (``Analyser``), the views of a stored run to
``model.services.runs``. An analyse answers right after its forward and predictions: the head scores a
fused forward left (entropy, peak) are computed afterwards by ``scores`` (``model.runs.late.ScoreWorker``,
one background thread), and ``wait_scores`` waits for them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from attnscope.model.errors import RunDetached, UnknownModel
from attnscope.model.learn import embedding
from attnscope.model.load import limits
from attnscope.model.load.fingerprint import model_fingerprint, tokenizer_fingerprint
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import (
    Token,
    first_tokens,
)
from attnscope.model.runs.budget import Estimate, MemoryBudget
from attnscope.model.runs.late import ScoreWorker
from attnscope.model.runs.persist import Origin, RunFiles
from attnscope.model.runs.record import RunRecord, RunStore
from attnscope.model.scores import probes
from attnscope.model.services.analyse import Analyser, RunResult

log = logging.getLogger(__name__)
DEFAULT_FORWARD_BYTES = 4 << 30


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
        self.analyser = Analyser(store, self.budget, self.scores)  # analyse: one forward, kept in the store
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
        """ATTNSCOPE_MAX_TOKENS, bounded only by the model's positions (``model.load.limits``)."""
        return limits.token_limit(lm, self.max_tokens)

    def tokenize(self, lm: LoadedModel, text: str) -> list[Token]:
        """A prompt's tokens within this server's limit for ``lm``."""
        return limits.prompt_tokens(lm, text, self.token_limit(lm))

    def chat_tokens(self, lm: LoadedModel, messages: list[dict[str, str]]) -> tuple[str, list[Token]]:
        """A chat's text and tokens within this server's limit for ``lm``."""
        return limits.chat_tokens(lm, messages, self.token_limit(lm))

    # ---- analyse ------------------------------------------------------------------
    def analyse_chat(self, messages: list[dict[str, str]], model: str | None = None, top_k: int = 10) -> RunResult:
        """Like ``analyse``, over a chat rendered with the model's chat template."""
        lm = self.model(model)
        t0 = time.perf_counter()
        text, tokens = self.chat_tokens(lm, messages)
        return self.analyser.analyse(lm, text, tokens, top_k, t0)

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
        return self.analyser.analyse(lm, text, tokens, top_k, t0)

    def admit(self, lm: LoadedModel, n: int, top_k: int) -> Estimate:
        """What a run of n tokens will keep and need; 413 (TooLarge) when it could never be kept."""
        return self.analyser.admit(lm, n, top_k)

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
        record.check_layer_head(layer, head)

