"""Runs kept on disk behind the in-memory store: every run stored is written (in the background, so the
analyse answers first) to the run directory as one run file, again when its late head scores arrive;
a run the memory no longer holds — evicted, or made before a restart — is read back from its file.

``RunFiles`` is the store's backing (``RunStore(..., backing=RunFiles(...))``). What it needs of the
models is ``describe(record)``: the fingerprints and dtype of the model that made it (None when that
model is not loaded here: the run is then written without them)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from attnscope.model.errors import BadRunFile, EngineError, RunComing
from attnscope.model.runs import runfile
from attnscope.model.runs.disk import RunDir, alive, host_name, valid_id
from attnscope.model.runs.jobthread import JobThread
from attnscope.model.runs.record import FileScores, PendingScores, RunRecord

log = logging.getLogger(__name__)
COMING = "coming"  # the run directory's folder of markers: a run's file being written
COMING_S = 30.0  # a marker of another host's writer older than this is a dead writer's
WAIT_S = 1.0  # the longest a handler waits for a live writer's file; past it: 503 with Retry-After


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
        # so that another worker asked for the run meanwhile waits (a moment) for the file instead of
        # answering 404. A marker names its writer ("host pid"): one whose writer is gone is cleared at once
        self.coming = folder.path / COMING
        self.coming.mkdir(exist_ok=True)
        self._marker = f"{host_name()} {os.getpid()}\n".encode()
        for marker in self.coming.iterdir():  # a writer killed before it finished: not coming any more
            self._live(marker)

    def _live(self, marker: Path) -> bool:
        """Whether a marker's writer may still write the file: a process of this host that is alive, or
        another host's marker younger than COMING_S. A dead writer's marker is removed (False)."""
        try:
            words = marker.read_text(encoding="ascii", errors="replace").split()
            age = time.time() - marker.stat().st_mtime
        except OSError:
            return False  # gone meanwhile: written, or cleared by another worker
        here = len(words) == 2 and words[0] == host_name() and words[1].isdigit()
        live = alive(int(words[1])) if here else age < COMING_S
        if not live:
            with contextlib.suppress(OSError):
                marker.unlink()
            log.info("run %s: its writer is gone (%s); the marker is cleared", marker.name,
                     " ".join(words[:2]) or "an empty marker")
        return live

    # ---- the store's side ------------------------------------------------------------------------
    def saved(self, run_id: str, record: RunRecord) -> None:
        """Write the run's file soon (after an add, or when its late head scores were settled)."""
        with contextlib.suppress(OSError):  # cheap, before the response: other workers will wait for it
            (self.coming / run_id).write_bytes(self._marker)
        with self._cond:
            self._closed = False
            self._jobs = type(self._jobs)(j for j in self._jobs if j.run_id != run_id)  # only the newest state
            self._jobs.append(_Write(run_id, record))
            self._start()

    def load(self, run_id: str) -> RunRecord | None:
        """The run read back from its file (None: no file). A file that is not a usable run is set aside
        and refused (``BadRunFile``, 422). A run another live worker is writing is waited for WAIT_S at
        most, then ``RunComing`` (503, Retry-After): a handler thread is never held longer."""
        data = self.folder.get(run_id)
        deadline = time.monotonic() + WAIT_S
        marker = self.coming / run_id
        while data is None and valid_id(run_id) and self._live(marker):
            if time.monotonic() > deadline:
                raise RunComing(run_id)
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
            record.stored = True  # on disk, fsync'd: GET /api/runs/{id}/stored says so
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

    def scores(self, run_id: str) -> FileScores | None:
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
    return record_from(runfile.read(data, max_bytes=max_bytes))


def record_from(read: runfile.StoredRun) -> RunRecord:
    """The run of a file read (``runfile.read`` / ``read_path``), with the head scores it still owed owed again."""
    record = read.record
    record.model_fingerprint = read.model_fingerprint
    record.stored = True  # read from a file: it is on disk
    if read.pending_fields and record.summary.scores_pending:
        record.pending = PendingScores(fields=dict(read.pending_fields), started=time.perf_counter())
    return record
