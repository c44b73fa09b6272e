"""Runs kept on disk behind the in-memory store: every run stored is written (in the background, so the
analyse answers first) to the run directory as one run file, again when its late head scores arrive;
a run the memory no longer holds — evicted, or made before a restart — is read back from its file.

``RunFiles`` is the store's backing (``RunStore(..., backing=RunFiles(...))``). What it needs of the
models is ``describe(record)``: the fingerprints and dtype of the model that made it (None when that
model is not loaded here: the run is then written without them)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from attnscope.model.errors import BadRunFile, EngineError
from attnscope.model.runs import runfile
from attnscope.model.runs.disk import RunDir, valid_id
from attnscope.model.runs.jobthread import JobThread
from attnscope.model.runs.record import RunRecord
from attnscope.model.scores.late import PendingScores

log = logging.getLogger(__name__)
COMING = "coming"  # the run directory's folder of markers: a run's file being written
COMING_S = 30.0  # the longest a worker waits for another's file (and the age of a marker left by a dead one)


@dataclass(frozen=True)
class Origin:
    """Who made a run: its model's fingerprint, its tokenizer's, and the parameters' dtype."""

    model_fingerprint: str
    tokenizer_fingerprint: str
    dtype: str


@dataclass(frozen=True)
class _Write:
    run_id: str
    record: RunRecord


class RunFiles(JobThread[_Write]):
    """A run directory as the store's backing: writes queued to one background thread (the newest state of
    a run wins), reads on demand."""

    def __init__(self, folder: RunDir, describe: Callable[[RunRecord], Origin | None]) -> None:
        super().__init__("attnscope-run-writer")
        self.folder = folder
        self.describe = describe
        # "this run's file is on its way": made before the analyse answers, removed once the file is there,
        # so that another worker asked for the run meanwhile waits for the file instead of answering 404
        self.coming = folder.path / COMING
        self.coming.mkdir(exist_ok=True)
        now = time.time()
        for marker in self.coming.iterdir():  # a writer killed before it finished: not coming any more
            with contextlib.suppress(OSError):
                if now - marker.stat().st_mtime > COMING_S:
                    marker.unlink()

    # ---- the store's side ------------------------------------------------------------------------
    def saved(self, run_id: str, record: RunRecord) -> None:
        """Write the run's file soon (after an add, or when its late head scores were settled)."""
        with contextlib.suppress(OSError):  # cheap, before the response: other workers will wait for it
            (self.coming / run_id).touch()
        with self._cond:
            self._closed = False
            self._jobs = type(self._jobs)(j for j in self._jobs if j.run_id != run_id)  # only the newest state
            self._jobs.append(_Write(run_id, record))
            self._start()

    def load(self, run_id: str) -> RunRecord | None:
        """The run read back from its file (None: no file). A file that is not a usable run is set aside
        and refused (``BadRunFile``, 422)."""
        data = self.folder.get(run_id)
        deadline = time.monotonic() + COMING_S
        while data is None and valid_id(run_id) and (self.coming / run_id).exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # another worker is writing it (it answered the analyse a moment ago)
            data = self.folder.get(run_id)
        if data is None:
            return None
        try:
            record = record_of(data, max_bytes=max(self.folder.max_bytes, len(data)))
        except BadRunFile as err:
            self.folder.set_aside(run_id, err.message)
            raise
        log.info("run %s read back from %s (%d tokens, %s)", run_id, self.folder.path, record.n, record.model)
        return record

    # ---- the writer thread -----------------------------------------------------------------------
    def _run(self, job: _Write) -> None:
        record = job.record
        origin = self.describe(record)
        if origin is None:
            origin = Origin(record.model_fingerprint, "", "")
        try:
            data = runfile.dump(record, model_fingerprint=origin.model_fingerprint,
                                tokenizer_fingerprint=origin.tokenizer_fingerprint, dtype=origin.dtype)
            self.folder.put(job.run_id, data)
        except EngineError as err:  # over the directory's cap: the run stays in memory only
            log.warning("run %s is not kept on disk: %s", job.run_id, err.message)
        except OSError as err:  # a full disk, a directory removed under us: memory only, said once a run
            log.warning("run %s could not be written to %s: %s", job.run_id, self.folder.path, err)
        finally:
            with contextlib.suppress(OSError):
                (self.coming / job.run_id).unlink(missing_ok=True)

    def claim(self, run_id: str) -> AbstractContextManager[bool]:
        """Across processes sharing the directory: whether this one computes the run's late scores now."""
        return self.folder.claim(run_id)

    def scores(self, run_id: str) -> runfile.FileScores | None:
        """The head scores the run's file holds now (another worker may have written them); None: no file,
        or one that cannot be read (the run's next full read sets it aside)."""
        try:
            with self.folder.file(run_id).open("rb") as f:  # the header only: the tensors may be large
                start = f.read(8)
                length = int.from_bytes(start, "little") if len(start) == 8 else 0
                data = start + f.read(min(length, runfile.HEADER_CAP))
        except (FileNotFoundError, ValueError):
            return None
        try:
            return runfile.scores(data, max_bytes=max(self.folder.max_bytes, len(data)))
        except BadRunFile:
            return None

    def flush(self) -> None:
        """Until the writes queued so far are on disk (a minute at most)."""
        self.wait_idle(60)

    def close(self) -> None:
        """Finish the writes queued (a minute at most), then stop."""
        self.wait_idle(60)
        _left, thread = self._stop()
        if thread is not None:
            thread.join(timeout=30)


def record_of(data: bytes, *, max_bytes: int) -> RunRecord:
    """A run file's run, checked (``BadRunFile``: 422), with the head scores it still owed owed again."""
    read = runfile.read(data, max_bytes=max_bytes)
    record = read.record
    record.model_fingerprint = read.model_fingerprint
    if read.pending_fields and record.summary.scores_pending:
        record.pending = PendingScores(fields=dict(read.pending_fields), started=time.perf_counter())
    return record
