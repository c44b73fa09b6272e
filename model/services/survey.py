"""The survey service: every head's statistics over a corpus, streamed, resumable, within the memory budget.

``survey(engine, texts=[...])`` or ``survey(engine, path=FILE)`` (``model.survey.corpus``: plain text or
JSON Lines). Documents are tokenized as an analysis tokenizes a prompt, cut into windows of ``max_tokens``,
and each window is one forward with every exact head score (``model.survey.stats``); nothing of a window
outlives it. With ``out``, the survey's state is written there (``model.survey.file``) every
``checkpoint_s`` seconds and at the end; ``resume=True`` continues a stopped survey of the same corpus,
model and settings from that file. ``progress`` hears after every window.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Protocol, TypeVar

import torch
from pydantic import Field

from attnscope.model.errors import BadInput, EngineError, SurveyNotFound
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import Token, tokenize
from attnscope.model.runs.budget import estimate, mib
from attnscope.model.scores import probes
from attnscope.model.scores.live import scored_run
from attnscope.model.services.engine import Engine
from attnscope.model.survey import corpus, file
from attnscope.model.survey.stats import Accumulator, Survey, offer_examples, sequence_values

log = logging.getLogger(__name__)
MAX_TOP_K = 50


@dataclass(frozen=True, slots=True)
class Progress:
    documents: int  # documents done
    sequences: int
    tokens: int
    fraction: float | None  # of the corpus file read (None for a list of texts of unknown length)
    tokens_per_s: float


def _nothing(_name: str) -> bool:
    return False  # keep no activation by name: the kept attention layers are all a survey reads


def _documents(texts: Iterable[str] | None, path: str | Path | None, skip: int) -> Iterator[corpus.Document]:
    if path is not None:
        yield from corpus.documents(path, skip)
        return
    index = 0
    for text in texts or []:
        if not isinstance(text, str):
            raise BadInput(f"document {index} is a {type(text).__name__}, not a string", params={"index": index})
        if text.strip():
            if index >= skip:
                yield corpus.Document(index, text, 0)
            index += 1


def _check(lm: LoadedModel, max_tokens: int, top_k: int) -> int:
    if not 1 <= top_k <= MAX_TOP_K:
        raise BadInput(f"top_k {top_k} is out of range: 1..{MAX_TOP_K}", code="value_out_of_range",
                       params={"name": "top_k", "value": top_k, "min": 1, "max": MAX_TOP_K})
    limit = lm.info.max_positions or max_tokens
    if max_tokens < 2:
        raise BadInput(f"max_tokens {max_tokens} is too small: a window needs 2 tokens at least",
                       code="value_out_of_range", params={"name": "max_tokens", "value": max_tokens, "min": 2,
                                                          "max": limit})
    return min(max_tokens, limit)


T = TypeVar("T")


class OnCompute(Protocol):
    """Runs a call somewhere (a served app's compute thread) and returns its answer."""

    def __call__(self, fn: Callable[[], T], /) -> T: ...


def _inline(fn: Callable[[], T], /) -> T:
    return fn()


def _window(engine: Engine, lm: LoadedModel, peak: int, acc: Accumulator, part: list[Token], doc: int,
            offset: int) -> None:
    """One window's forward with every exact head score, added to ``acc``."""
    ids = torch.tensor([t.id for t in part])
    with engine.budget.reserve(peak), lm.lock:
        acts, _scores, heads = scored_run(lm, ids, _nothing)
        with torch.inference_mode():
            acc.add(sequence_values(heads, acts.layers, lm.info.n_layers, lm.info.n_heads))
            offer_examples(acc, acts, [t.text for t in part], doc, offset)


def survey(engine: Engine, *, texts: Iterable[str] | None = None, path: str | Path | None = None,
           model: str | None = None, max_tokens: int = 512, top_k: int = 5, out: str | Path | None = None,
           resume: bool = False, checkpoint_s: float = 30.0, probe: bool = True,
           progress: Callable[[Progress], None] | None = None, source: str | None = None,
           on_compute: OnCompute | None = None) -> Survey:
    """Every head's corpus statistics (``Survey``); ``texts`` or a corpus file ``path``. ``on_compute`` runs each
    window's forward (a served app's compute thread: ``model.runs.compute``); inline by default."""
    run: OnCompute = on_compute if on_compute is not None else _inline
    if (texts is None) == (path is None):
        raise BadInput("give the survey either texts or a corpus file, not both or neither")
    if path is not None and not Path(path).is_file():
        raise BadInput(f"corpus {Path(path).name}: no such file", params={"file": Path(path).name})
    lm = engine.model(model)
    window = _check(lm, max_tokens, top_k)
    est = estimate(lm, window, 0)
    if est.peak > engine.budget.total:
        raise BadInput(f"one window of {window:,} tokens would need {mib(est.peak)} at its peak; forwards may use at "
                       f"most {mib(engine.budget.total)} (ATTNSCOPE_FORWARD_BYTES): survey with a smaller max_tokens",
                       code="forward_too_big", params={"need": mib(est.peak), "limit": mib(engine.budget.total)})
    source = source or (Path(path).name if path is not None else None)
    ident = file.corpus_id(path) if path is not None else None
    acc = Accumulator(lm.info.n_layers, lm.info.n_heads, top_k)
    if out is not None and resume and Path(out).exists():
        acc, header = file.read(out)
        same = (header.model == lm.info.name and header.corpus == ident and header.max_tokens == window
                and acc.top_k == top_k)
        if not same:
            raise BadInput(f"{Path(out).name} is a survey of another corpus, model or settings "
                           f"({header.model}, max_tokens {header.max_tokens}, top_k {acc.top_k}); survey into "
                           "another file, or without resume", params={"file": Path(out).name})
        if header.complete:
            return file.load_survey(out)
        log.info("resuming the survey in %s after %d documents", out, acc.documents)
    probe_scores = run(lambda: probes.induction(lm)) if probe and lm.info.causal else None
    size = Path(path).stat().st_size if path is not None else 0
    t0, last_write, done_tokens = time.perf_counter(), time.perf_counter(), 0

    def save(complete: bool) -> None:
        if out is not None:
            file.write(out, acc, file.Header(model=lm.info.name, source=source, corpus=ident, max_tokens=window,
                                             complete=complete, probe=probe_scores))

    def tell(read: float) -> None:  # progress, ``read``: the file's bytes read (0 for a list of texts)
        if progress is not None:
            elapsed = time.perf_counter() - t0
            progress(Progress(acc.documents, acc.sequences, acc.tokens,
                              min(1.0, max(0.0, read / size)) if size else None,
                              done_tokens / elapsed if elapsed > 0 else 0.0))

    for doc in _documents(texts, path, acc.documents):
        tokens = tokenize(lm.tokenizer, doc.text)
        doc_bytes = len(doc.text.encode()) if progress is not None and len(tokens) > window else 0
        for offset in range(0, len(tokens), window):
            part = tokens[offset: offset + window]
            if len(part) < 2:
                continue
            run(functools.partial(_window, engine, lm, est.peak, acc, part, doc.index, offset))
            acc.tokens += len(part)
            done_tokens += len(part)
            if offset + window < len(tokens):  # a long document: heard a window at a time
                tell(doc.end - doc_bytes * (1 - (offset + window) / len(tokens)))  # less the document's bytes to go
        acc.documents += 1
        tell(doc.end)
        if out is not None and time.perf_counter() - last_write >= checkpoint_s:
            save(False)
            last_write = time.perf_counter()
    if acc.sequences == 0:
        raise BadInput("the corpus holds no document of two tokens or more", code="empty")
    save(True)
    return acc.result(model=lm.info.name, source=source, max_tokens=window, complete=True, probe=probe_scores)


@dataclass(frozen=True)
class SurveyStatus:
    """A survey the server runs (or opened from a file): where it stands, and its result once done."""

    id: str
    status: Annotated[Literal["running", "done", "failed", "stopped"], Field(description=(
        "running: still reading the corpus; done: survey holds the result; failed: error says why; stopped"))]
    model: str
    source: Annotated[str | None, Field(description="the corpus file's name")]
    documents: int
    sequences: int
    tokens: int
    fraction: Annotated[float | None, Field(description="the share of the corpus file read so far")]
    tokens_per_s: float
    error: Annotated[str | None, Field(description="why it failed, in English (code: error_code)")]
    error_code: str | None
    survey: Annotated[Survey | None, Field(description="the result, once done")]


class Stopped(Exception):
    pass


@dataclass
class _Job:
    id: str
    folder: Path
    model: str
    source: str | None
    status: Literal["running", "done", "failed", "stopped"] = "running"
    progress: Progress | None = None
    error: str | None = None
    error_code: str | None = None
    result: Survey | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def status_of(self, full: bool) -> SurveyStatus:
        p = self.progress
        done = self.result
        return SurveyStatus(
            id=self.id, status=self.status, model=self.model, source=self.source,
            documents=done.documents if done else p.documents if p else 0,
            sequences=done.sequences if done else p.sequences if p else 0,
            tokens=done.tokens if done else p.tokens if p else 0,
            fraction=1.0 if done else p.fraction if p else 0.0, tokens_per_s=p.tokens_per_s if p else 0.0,
            error=self.error, error_code=self.error_code, survey=done if full else None)


class SurveyJobs:
    """The server's surveys: each runs in a thread of its own, one at a time per model (the model's lock
    serialises its forwards with the analyses), in a folder of its own that holds the corpus copy and the
    survey file (removed when the job is let go). At most ``keep`` jobs are kept: the oldest finished
    one goes first; all running ones are stopped on ``close``."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}

    def _add(self, job: _Job) -> None:
        with self._lock:
            finished = [j for j in self._jobs.values() if j.status != "running"]
            if len(self._jobs) >= self.keep and not finished:
                raise BadInput(f"{len(self._jobs)} surveys are running, the most this server keeps; stop one first",
                               code="forward_busy", params={"need": "a survey"})
            while len(self._jobs) >= self.keep and finished:
                gone = finished.pop(0)
                del self._jobs[gone.id]
                shutil.rmtree(gone.folder, ignore_errors=True)
            self._jobs[job.id] = job

    def start(self, engine: Engine, corpus_file: Path, *, name: str | None, model: str | None, max_tokens: int,
              top_k: int, on_compute: OnCompute | None = None) -> SurveyStatus:
        """Survey ``corpus_file`` (moved into the job's folder) in the background; ``on_compute`` as ``survey``'s."""
        lm = engine.model(model)
        _check(lm, max_tokens, top_k)
        source = (name or corpus_file.name)[-200:]  # shown, never a path: the copy has a fixed name
        suffix = ".jsonl" if source.lower().endswith((".jsonl", ".ndjson")) else ".txt"
        folder = Path(tempfile.mkdtemp(prefix="attnscope-survey-"))
        job = _Job(secrets.token_urlsafe(9), folder, lm.info.name, source)
        corpus_path = self._place(job, corpus_file, f"corpus{suffix}")

        def heard(p: Progress) -> None:
            job.progress = p
            if job.stop.is_set():
                raise Stopped

        def work() -> None:
            try:
                job.result = dataclasses.replace(
                    survey(engine, path=corpus_path, model=lm.info.name, max_tokens=max_tokens, top_k=top_k,
                           out=folder / "survey.safetensors", progress=heard, source=source,
                           on_compute=on_compute), source=source)
                job.status = "done"
            except Stopped:
                job.status = "stopped"
            except EngineError as err:
                job.error, job.error_code, job.status = err.message, err.code, "failed"
            except Exception as err:  # a survey thread must say why it ended, never vanish
                log.exception("survey %s failed", job.id)
                job.error, job.error_code, job.status = f"{type(err).__name__}: {err}", "engine_error", "failed"

        job.thread = threading.Thread(target=work, name=f"survey-{job.id}", daemon=True)
        job.thread.start()
        return job.status_of(False)

    def open(self, survey_file: Path) -> SurveyStatus:
        """A survey file (``attnscope survey``'s, a download): read and kept as a finished job."""
        result = file.load_survey(survey_file)
        folder = Path(tempfile.mkdtemp(prefix="attnscope-survey-"))
        job = _Job(secrets.token_urlsafe(9), folder, result.model, result.source, status="done", result=result)
        self._place(job, survey_file, "survey.safetensors")
        return job.status_of(True)

    def _place(self, job: _Job, upload: Path, name: str) -> Path:
        """The job kept, and its uploaded file moved into its folder as ``name``; neither, if either fails."""
        try:
            self._add(job)
            return Path(shutil.move(str(upload), job.folder / name))
        except BaseException:
            self._drop(job)
            raise

    def _drop(self, job: _Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)
        shutil.rmtree(job.folder, ignore_errors=True)

    def _job(self, job_id: str) -> _Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise SurveyNotFound(job_id)
        return job

    def status(self, job_id: str, full: bool = True) -> SurveyStatus:
        return self._job(job_id).status_of(full)

    def file(self, job_id: str) -> Path:
        job = self._job(job_id)
        path = job.folder / "survey.safetensors"
        if job.status != "done" or not path.exists():
            raise BadInput(f"survey {job_id} is {job.status}: its file exists once it is done",
                           params={"id": job_id})
        return path

    def stop(self, job_id: str) -> SurveyStatus:
        job = self._job(job_id)
        job.stop.set()
        return job.status_of(False)

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
        for job in jobs:
            job.stop.set()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout=30)
            shutil.rmtree(job.folder, ignore_errors=True)
