"""The Python door: inspect a model object you already hold (fine-tuned, edited, on a GPU, wrapped
in a PEFT adapter) with the same services, and so the same numbers, as the HTTP door.

    scope = Scope(model, tokenizer)            # or Scope.from_pretrained("bundled:attnscope-tiny")
    run = scope.run("The cat sat on the mat. The cat")
    run.attention(layer=4, head=0)             # (n, n) float32, exact
    run.heads()                                # every head's scores, complete
    run.ablate(heads=[(4, 0)], mode="zero")    # per position: kl, top, actual_next
    scope.patch(clean=..., corrupted=..., answer=..., wrong=...)

The user's model is never changed: each call switches it to the capture attention and eval mode
for its own length only (``model.load.models.borrowed``), so no hook stays after any call, even
one that raised, its parameters and ``requires_grad`` are untouched, and its own
``attn_implementation`` and training flags are restored. Calls on one Scope run one at a time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from attnscope.model.capture.generation import Step
from attnscope.model.errors import BadInput
from attnscope.model.learn.anatomy import Anatomy
from attnscope.model.learn.embedding import Neighbourhood
from attnscope.model.learn.positions import PositionTable
from attnscope.model.learn.values import Contributions
from attnscope.model.load.models import LoadedModel, Placement, borrowed, inspect_model, load_model
from attnscope.model.results import LogitLens, NextDistribution
from attnscope.model.runs.record import RunRecord, RunStore
from attnscope.model.scores.analysis import HeadScore, HeadSparsity
from attnscope.model.services import doors, files, learn, runs, tools
from attnscope.model.services import generate as generate_service
from attnscope.model.services import survey as survey_service
from attnscope.model.services.engine import Engine
from attnscope.model.services.learn import Comparison, ContributionGaps, Timing
from attnscope.model.services.runs import Heads, Residual
from attnscope.model.survey.stats import Survey
from attnscope.model.tools.ablation import Ablation, Scan
from attnscope.model.tools.attribution import Attribution
from attnscope.model.tools.patching import Patch
from attnscope.model.tools.qk import QKAttribution

T = TypeVar("T")
DEFAULT_KEEP_BYTES = 2 << 30  # runs a Scope keeps (least recently used first out)
DEFAULT_MAX_TOKENS = 32768


def base_model(model: nn.Module) -> PreTrainedModel:
    """The transformers model inside a PEFT wrapper (whose adapter layers live inside it, so its
    forward is the adapted model's), or the model itself."""
    unwrap = getattr(model, "get_base_model", None)
    inner = unwrap() if callable(unwrap) else model
    if not isinstance(inner, PreTrainedModel):
        raise BadInput(f"{type(model).__name__} is not a transformers model (PreTrainedModel), nor a PEFT "
                       "wrapper of one", code="architecture_unsupported",
                       params={"model": type(model).__name__, "reason": "not a PreTrainedModel"})
    return inner


class Scope:
    """A model to inspect, with the runs made on it (kept in memory, least recently used evicted)."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, *, name: str | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, keep_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        inner = base_model(model)
        where = str(getattr(inner.config, "name_or_path", "") or "")  # the public property
        label = name or (Path(where).name if where else "") or str(inner.config.model_type)  # a folder: its name
        self._lm = inspect_model(label, inner, tokenizer, source="python")
        self._lock = threading.RLock()
        with self.borrowed():  # the engine checks once that the attention returns its weights
            self._engine = Engine({label: self._lm}, label, RunStore(keep_bytes), max_tokens)
        # the late head scores' thread stops when the Scope goes, or at exit (torch aborts a process
        # that exits while a thread is inside it)
        self._close = weakref.finalize(self, self._engine.close)

    def close(self) -> None:
        """Stop the background work (late head scores); the Scope's runs stay readable."""
        self._close()

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @classmethod
    def from_pretrained(cls, source: str, *, device: str = "auto", dtype: str = "auto",
                        max_tokens: int = DEFAULT_MAX_TOKENS) -> Scope:
        """Load a model as the server does: ``bundled:NAME``, ``package:MODULE``, a GGUF file (de-quantized
        once into the cache), ``ollama:MODEL[:TAG]``, ``smollm2-135m``, a folder or a hub id."""
        lm = load_model(source, source, Placement(device=device, dtype=dtype))  # type: ignore[arg-type]
        return cls(lm.model, lm.tokenizer, name=source, max_tokens=max_tokens)

    @property
    def model(self) -> LoadedModel:
        """What attnscope knows of the model: ``.info`` (layers, heads, sizes, family), ``.model``."""
        return self._lm

    @property
    def engine(self) -> Engine:
        return self._engine

    @contextmanager
    def borrowed(self) -> Iterator[None]:
        """The model switched for inspection for the ``with`` only (one caller at a time)."""
        with self._lock, borrowed(self._lm):
            if hasattr(self, "_engine"):
                self._engine.forget_origins()  # the model is the user's: edited at will between calls
            yield


    def show(self, text: str | None = None, *, lang: str = "en", height: int = 780) -> Any:
        """The explorer on this model in a notebook's output cell (``attnscope.show``; needs the
        ``notebook`` extra); outside a notebook, says what to do instead and returns None."""
        return doors.open_door("show", self, text=text, lang=lang, height=height)

    def call(self, service: Callable[..., T], **kwargs: Any) -> T:
        """Any service of ``model.services`` on this Scope's engine, with the model borrowed."""
        with self.borrowed():
            return service(self._engine, **kwargs)

    def load(self, path: str | Path) -> Run:
        """A run file (``run.save``, the explorer's "Download run") as a run on this Scope. Made by this
        model as it is now (the same fingerprint, whatever its name was), its tools work; otherwise its
        attention and scores are read from the file and a tool refuses (``run_model_changed`` or
        ``run_model_missing``)."""
        data = Path(path).read_bytes()
        made = self.call(files.import_run, data=data, max_bytes=len(data), adopt=self._lm.info.name)
        return Run.of(self, made.run_id)

    def run(self, text: str, *, top_k: int = 10, truncate: bool = False) -> Run:
        """One forward over ``text``, everything captured: the run to read."""
        with self.borrowed():
            result = self._engine.analyse(text, top_k=top_k, truncate=truncate)
        return Run(self, result.run_id, result.record)

    def survey(self, texts: Iterable[str] | None = None, *, path: str | Path | None = None, max_tokens: int = 512,
               top_k: int = 5, out: str | Path | None = None, resume: bool = False,
               progress: Callable[[survey_service.Progress], None] | None = None) -> Survey:
        """Every head's statistics over a corpus (``texts``, or a corpus file ``path``: plain text or JSON
        Lines), streamed a window of ``max_tokens`` at a time: means and spreads of entropy, previous-token,
        first-token, peak, induction and self-attention, the synthetic induction probe, and each head's
        ``top_k`` strongest examples. With ``out`` the state is saved as it goes (``resume=True`` continues
        it); ``attnscope.load(out)`` reads it back."""
        return self.call(survey_service.survey, texts=texts, path=path, max_tokens=max_tokens, top_k=top_k,
                         out=out, resume=resume, progress=progress)

    def generate(self, text: str, *, max_new_tokens: int = 20, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop_at_eos: bool = True) -> Generated:
        """Generate with the KV cache, token by token, recording every step: the result holds each
        step (token, probability, the model's top alternatives) and the recording as an ordinary run
        over prompt + generated text. ``temperature`` 0 is greedy."""
        with self.borrowed():
            gen = generate_service.start(self._engine, text=text, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                         stop_at_eos=stop_at_eos, record=True, max_new_limit=max(max_new_tokens, 1))
            while not gen.done:
                gen.step()
            finished = gen.finish()
        if finished.run is None:  # recorded generations always end as a run
            raise RuntimeError("the generation was not recorded")
        return Generated(text=finished.text, stop=finished.stop, steps=list(gen.steps),
                         run=Run(self, finished.run.run_id, finished.run.record))

    def patch(self, *, clean: str, corrupted: str, answer: str, wrong: str, position: int | None = None) -> Patch:
        """Activation patching from ``clean`` into ``corrupted`` (same token count); the metric is
        logit(answer) - logit(wrong) at ``position`` (default: the last)."""
        return self.call(tools.patch, clean=clean, corrupted=corrupted, answer=answer, wrong=wrong,
                         position=position)

    # ---- the Learn views' numbers -----------------------------------------------------------
    def embedding(self, *, id: int, top: int = 10) -> Neighbourhood:
        """Row ``id`` of the token embedding E: its ``top`` nearest rows by cosine, the ids next to it
        (k ± 1, 2k), random pairs for scale, and which rows training never moved apart."""
        return self.call(learn.embedding, id=id, top=top)

    def anatomy(self) -> Anatomy:
        """The model's parameters counted by part: embeddings, attention, MLP and norms per layer, LM head."""
        return self.call(learn.anatomy)

    def positions(self, *, count: int = 64) -> PositionTable:
        """The first ``count`` positions of a learned position table (rows and their cosines), or a rotary
        model's frequencies and angles."""
        return self.call(learn.positions, count=count)

    def timing(self, *, text: str, repeats: int = 5, repeat_to: int | None = None) -> Timing:
        """One parallel forward over ``text`` (at most 64 tokens) against serial steps with and without
        the KV cache, each timed ``repeats`` times now; ``repeat_to`` repeats the tokens to that many."""
        return self.call(learn.timing, text=text, repeats=repeats, repeat_to=repeat_to)

    def compare(self, a: Run, b: Run) -> Comparison:
        """Two runs of this Scope (the same tokens in another order, say): per token of ``a``, the cosine
        of its hidden states with the same token in ``b`` at every stage; per head, how much the
        attention changes."""
        if a.scope is not self or b.scope is not self:
            raise BadInput("both runs must come from this Scope", code="different_models")
        for run in (a, b):
            self._engine.store.hold(run.run_id, run.held)
        return self.call(learn.compare, a=a.run_id, b=b.run_id)


@dataclass(frozen=True)
class Run(files.RecordView):
    """One analysed prompt: a value that owns what its forward kept (``Run.record``), so it never expires
    while you hold it (the Scope's store bounds only the runs nobody holds: one held after eviction is
    kept again when used). Its activations by name: ``run["resid_post", 3]``, ``run["pattern", 4]``."""

    scope: Scope
    run_id: str
    held: RunRecord = field(repr=False, compare=False)

    @staticmethod
    def of(scope: Scope, run_id: str) -> Run:
        return Run(scope, run_id, scope.engine.run(run_id))

    @property
    def record(self) -> RunRecord:
        return self.held

    def _call(self, service: Callable[..., T], **kwargs: Any) -> T:
        """A service on this run, the run first kept again under its id if the store had let it go."""
        self.scope.engine.store.hold(self.run_id, self.held)
        return self.scope.call(service, run_id=self.run_id, **kwargs)

    def attention(self, layer: int, head: int, *, q0: int | None = None, q1: int | None = None,
                  k0: int | None = None, k1: int | None = None, size: int | None = None,
                  pool: str = "max") -> torch.Tensor:
        """One head's attention, exact: (n, n) float32 (masked cells 0). With any tile parameter, a
        tile as the API gives it: queries [q0, q1) x keys [k0, k1) pooled into at most size x size
        bins (NaN: a bin with no visible cell)."""
        if all(v is None for v in (q0, q1, k0, k1, size)):
            return self._call(runs.attention, layer=layer, head=head)
        return self._call(runs.attention_tile, layer=layer, head=head, q0=q0, q1=q1,
                               k0=k0, k1=k1, size=size, pool=pool)

    def heads(self, *, wait: bool = True) -> list[HeadScore]:
        """Every head's scores (entropy, previous-token, first-token, max, induction), complete: waits
        for the ones still computed in the background unless ``wait=False``."""
        self.scope.engine.store.hold(self.run_id, self.held)
        result: Heads = runs.heads(self.scope.engine, run_id=self.run_id, wait=None if wait else 0.0)
        if result.error is not None:
            raise BadInput(f"the run's head scores could not be computed: {result.error}")
        return result.heads

    def save(self, path: str | Path) -> Path:
        """The run's file (``attnscope-run/1``, what the API's format=attnscope gives), written whole or not at
        all: ``scope.load(path)`` reads it back with its tools, ``attnscope.load(path)`` without a model,
        ``attnscope open FILE`` or the explorer's "Open run" on a server."""
        return self._call(files.save, path=path)

    def save_html(self, path: str | Path, *, heads: str | None = None, lang: str = "en") -> Path:
        """This run as one self-contained HTML file: the explorer on it, opened from disk with no server
        and no network (``attnscope.save_html``: what it keeps, ``heads``, ``lang``)."""
        path_out: Path = doors.open_door("save_html", self, path, heads=heads, lang=lang)
        return path_out

    def ablate(self, heads: list[tuple[int, int]], *, mode: str = "zero", top_k: int = 5) -> Ablation:
        """The prompt again with ``heads`` zeroed (or replaced by their mean): per position the KL
        divergence from the original, the new top tokens and the actual next token before and after."""
        return self._call(tools.ablate, heads=heads, mode=mode, top_k=top_k)

    def ablate_scan(self, *, position: int, token: int | None = None, mode: str = "zero") -> Scan:
        """Every head and MLP ablated alone: the change of ln p(token) at ``position``."""
        return self._call(tools.ablate_scan, position=position, token=token, mode=mode)

    def attribute(self, *, position: int, token: int | None = None, token_b: int | None = None) -> Attribution:
        """Direct logit attribution of ``token`` (default: the next token) at ``position``."""
        return self._call(tools.attribute, position=position, token=token,
                               token_b=token_b)

    def qk_attribution(self, layer: int, head: int, query: int, key: int | None = None) -> QKAttribution:
        """Why head ``head`` of ``layer`` attends from ``query`` to ``key``: its pre-softmax logit split into
        query-side x key-side terms, one per upstream component (embeddings, each earlier head, each earlier
        MLP, biases), tensors that sum to the model's logit up to ``error``. ``key=None``: every key the
        query sees (``query_side`` and ``key_side`` per key; ``matrix`` only for a single key)."""
        return self._call(tools.qk_attribution, layer=layer, head=head, query=query, key=key)

    def lens(self, *, top_k: int = 5) -> LogitLens:
        """Each layer's residual stream read through the final norm and the LM head."""
        return self._call(runs.lens, top_k=top_k)

    def residual(self) -> Residual:
        """The residual stream layer by layer: norms, change, attention vs MLP."""
        return self._call(runs.residual)

    def next(self, *, position: int, temperature: float = 1.0, top_k: int = 10) -> NextDistribution:
        """The next-token distribution at ``position``, re-scaled by ``temperature``."""
        return self._call(runs.next_token, position=position, temperature=temperature,
                               top_k=top_k)

    def contributions(self, *, layer: int, head: int, position: int) -> Contributions:
        """What each source token the query at ``position`` sees adds to the head's output: its weight,
        ‖v W_O‖ and their product (where the head looks is not what it takes)."""
        return self._call(learn.contributions, layer=layer, head=head, position=position)

    def contribution_gaps(self, *, position: int) -> ContributionGaps:
        """Per head at ``position``: the total-variation distance between its weights and each source's
        share of what it adds (0: the weights tell the whole story)."""
        return self._call(learn.contribution_gaps, position=position)

    def show(self, *, lang: str = "en", height: int = 780) -> Any:
        """The explorer on this run's text in a notebook's output cell (``attnscope.show``)."""
        return self.scope.show(self.text, lang=lang, height=height)

    def sparsity(self) -> list[HeadSparsity]:
        """How concentrated each head is (top-1 / top-5 mass, keys holding 90 %)."""
        return self._call(runs.sparsity)


@dataclass(frozen=True)
class Generated:
    """A finished generation: the new text, why it stopped ("eos" or "length"), every step, and the
    recording as a run over prompt + generated tokens (read it like any run)."""

    text: str
    stop: str
    steps: list[Step]
    run: Run
