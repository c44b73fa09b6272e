"""Runs on disk: one file per run in a directory that several processes share, capped in bytes.

Layout of ``path``:

* ``{run_id}.run``: a run's file (``model/runs/runfile.py``); its mtime is its last use (LRU);
* ``.tmp.{host}.{pid}.{nonce}.{run_id}``: a file being written. ``put`` writes there, flushes and
  fsyncs, then ``os.replace``s it onto the run's name: a reader sees the old file or the new one,
  whole, never a part (a SIGKILL at any moment leaves at most a temporary, which no one reads; ``open``
  removes those of dead processes of this host, and any older than an hour);
* ``locks/{run_id}.lock``: the lock files of ``claim`` (``fcntl.flock``, held by an open descriptor,
  released by the kernel when its process dies);
* ``rejected/``: files set aside (``set_aside``): a corrupt or foreign file with a note saying why;
* ``.evict.lock``: serialises eviction between processes (each evicts after its own writes).

Every operation tolerates the others' at the same time in other processes: a file evicted or replaced
between listing and reading is simply gone (``get`` answers None; eviction skips it). Run ids are
checked (``token_urlsafe``'s alphabet, 1-64 characters): never a path.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from attnscope.model.errors import TooLarge

log = logging.getLogger(__name__)

SUFFIX = ".run"
TMP_PREFIX = ".tmp."
LOCKS = "locks"
REJECTED = "rejected"
EVICT_LOCK = ".evict.lock"
STALE_TMP_S = 3600.0  # a temporary this old is a dead writer's, whoever wrote it
KEEP_REJECTED = 20  # files kept in rejected/ (oldest out)
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class RunDirError(Exception):
    """The run directory cannot be used (created, written): one line naming the path and the OS error."""


def valid_id(run_id: str) -> bool:
    """A run id: ``secrets.token_urlsafe``'s alphabet, 1 to 64 characters (no dot, no slash)."""
    return _ID.fullmatch(run_id) is not None


def _checked(run_id: str) -> str:
    if not valid_id(run_id):
        raise ValueError(f"not a run id: {run_id[:80]!r}")
    return run_id


def host_name() -> str:
    """This host's name as file names and markers carry it."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def alive(pid: int) -> bool:
    """Whether a process of this host with this id is running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@dataclass(frozen=True)
class _Entry:
    run_id: str
    size: int
    mtime_ns: int


def write_whole(target: Path, data: bytes, tmp: Path | None = None) -> Path:
    """Write ``data`` to ``target`` whole or not at all: into ``tmp`` (default ``.NAME.partial`` beside it),
    fsynced, then renamed over ``target``; the temporary is removed if anything fails (a full disk)."""
    tmp = tmp or target.with_name(f".{target.name}.partial")
    try:  # (a partial file left by a killed save is overwritten; the run directory's temporaries are unique)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target


class RunDir:
    """A directory of run files capped at ``max_bytes`` (least recently used out). Use :meth:`open`."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._host = host_name()

    @classmethod
    def open(cls, path: Path | str, max_bytes: int) -> RunDir:
        """Create the directory if needed, check that a file can be written in it, and remove what killed
        writers left. ``RunDirError`` (one line: the path and the OS error) if it cannot be used."""
        where = Path(path).expanduser()
        try:
            where.mkdir(parents=True, exist_ok=True)
            (where / LOCKS).mkdir(exist_ok=True)
            probe = where / f"{TMP_PREFIX}{host_name()}.{os.getpid()}.{secrets.token_hex(4)}.probe"
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, b"attnscope")
                os.fsync(fd)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError as err:
            raise RunDirError(f"cannot use the run directory {where}: {err.strerror or err}") from err
        runs = cls(where, max_bytes)
        runs.clean()
        return runs

    # ---- paths -----------------------------------------------------------------------------------
    def file(self, run_id: str) -> Path:
        return self.path / f"{_checked(run_id)}{SUFFIX}"

    def _lock_file(self, run_id: str) -> Path:
        return self.path / LOCKS / f"{_checked(run_id)}.lock"

    # ---- reading ---------------------------------------------------------------------------------
    def get(self, run_id: str) -> bytes | None:
        """The run's file, or None (no such run, or not a run id); marks it used (its mtime)."""
        if not valid_id(run_id):
            return None
        path = self.file(run_id)
        try:
            with path.open("rb") as f:  # the open file stays whole even if replaced or evicted meanwhile
                data = f.read()
        except FileNotFoundError:
            return None
        self._touch(path)
        return data

    def _touch(self, path: Path) -> None:
        now = time.time_ns()  # finer than the kernel's file clock: runs written in a burst keep their order
        with contextlib.suppress(FileNotFoundError):
            os.utime(path, ns=(now, now))

    def _entries(self) -> list[_Entry]:
        out = []
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        for name in names:
            run_id = name[: -len(SUFFIX)]
            if not name.endswith(SUFFIX) or not valid_id(run_id):
                continue
            try:
                st = os.stat(self.path / name)
            except FileNotFoundError:  # evicted or set aside by another process meanwhile
                continue
            out.append(_Entry(run_id, st.st_size, st.st_mtime_ns))
        return out

    def ids(self) -> list[str]:
        """The stored runs, least recently used first."""
        return [e.run_id for e in sorted(self._entries(), key=lambda e: (e.mtime_ns, e.run_id))]

    @property
    def nbytes(self) -> int:
        """Bytes of the stored runs' files."""
        return sum(e.size for e in self._entries())

    # ---- writing ---------------------------------------------------------------------------------
    def put(self, run_id: str, data: bytes) -> None:
        """Store (or replace) a run's file, crash-safe, then evict the least recently used others until
        the directory is under its cap. ``TooLarge`` (``run_over_disk``) for a file larger than the whole
        cap; an ``OSError`` of the disk (full, gone) is raised after the temporary is removed."""
        final = self.file(run_id)
        if len(data) > self.max_bytes:
            # imported here: this module moves bytes and needs neither torch nor transformers (budget does)
            from attnscope.model.runs.budget import mib_over

            size, cap = mib_over(len(data), self.max_bytes)
            raise TooLarge(f"this run's file is {size}; the run directory holds at most {cap} "
                           "(ATTNSCOPE_RUN_DIR_BYTES)", code="run_over_disk", params={"size": size, "cap": cap})
        write_whole(final, data, self.path / f"{TMP_PREFIX}{self._host}.{os.getpid()}.{secrets.token_hex(6)}.{run_id}")
        self._touch(final)
        self._sync_dir()
        self.evict(keep=run_id)

    def _sync_dir(self) -> None:
        """fsync the directory: the rename itself survives a power cut."""
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove the least recently used runs (never ``keep``) until the files hold at most ``max_bytes``;
        the ids removed. One process evicts at a time (a lock file); files that vanish meanwhile are
        skipped."""
        removed = []
        with self._exclusive(self.path / EVICT_LOCK):
            entries = sorted(self._entries(), key=lambda e: (e.mtime_ns, e.run_id))
            total = sum(e.size for e in entries)
            for e in entries:
                if total <= self.max_bytes:
                    break
                if e.run_id == keep:
                    continue
                total -= e.size
                if self._remove(e.run_id):
                    removed.append(e.run_id)
        if removed:
            log.info("run directory %s: %d least recently used run(s) removed to stay under %s bytes",
                     self.path, len(removed), f"{self.max_bytes:,}")
        return removed

    @contextlib.contextmanager
    def _exclusive(self, path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _remove(self, run_id: str) -> bool:
        try:
            self.file(run_id).unlink()
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):
            self._lock_file(run_id).unlink()
        return True

    def delete(self, run_id: str) -> bool:
        """Remove a run's file; False if there was none (or not a run id)."""
        return valid_id(run_id) and self._remove(run_id)

    def set_aside(self, run_id: str, reason: str) -> Path | None:
        """Move a run's file (corrupt, foreign) into ``rejected/`` with a note saying why, and log one line;
        where it went, or None if it was gone already. The oldest rejected files go beyond ``KEEP_REJECTED``."""
        rejected = self.path / REJECTED
        rejected.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = rejected / f"{_checked(run_id)}.{stamp}.{secrets.token_hex(3)}{SUFFIX}"
        try:
            os.replace(self.file(run_id), target)
        except FileNotFoundError:
            return None
        target.with_suffix(".txt").write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: "
                                              f"run {run_id} set aside: {reason}\n", encoding="utf-8")
        log.warning("run file %s set aside in %s: %s", run_id, rejected, reason)
        files = sorted(rejected.glob(f"*{SUFFIX}"), key=lambda p: p.name.split(".")[1])  # by the stamp
        for old in files[: max(0, len(files) - KEEP_REJECTED)]:
            with contextlib.suppress(OSError):
                old.unlink()
                old.with_suffix(".txt").unlink()
        return target

    # ---- claims ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def claim(self, run_id: str) -> Iterator[bool]:
        """An exclusive claim on a run across processes (and threads), never waited for: yields True if
        this caller holds it until the block ends, False if someone else holds it now. For work done once
        per run across workers (late head scores): whoever gets the claim reads the run again (another
        worker may have finished the work already) and writes the result before releasing it."""
        (self.path / LOCKS).mkdir(exist_ok=True)
        fd = os.open(self._lock_file(run_id), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    # ---- housekeeping ----------------------------------------------------------------------------
    def clean(self) -> int:
        """Remove temporaries that no live writer will finish (a dead process of this host, or over an
        hour old) and lock files of runs that are gone and unclaimed; how many files were removed."""
        removed = 0
        now = time.time()
        for name in os.listdir(self.path):
            if not name.startswith(TMP_PREFIX):
                continue
            parts = name.split(".")  # "", "tmp", host, pid, nonce, run_id
            path = self.path / name
            try:
                age = now - path.stat().st_mtime
            except FileNotFoundError:
                continue
            dead = len(parts) == 6 and parts[2] == self._host and parts[3].isdigit() and not alive(int(parts[3]))
            if dead or age > STALE_TMP_S:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        for lock in (self.path / LOCKS).glob("*.lock"):
            run_id = lock.name[: -len(".lock")]
            if valid_id(run_id) and not self.file(run_id).exists():
                with contextlib.suppress(OSError), self.claim(run_id) as mine:
                    if mine:
                        lock.unlink()
                        removed += 1
        if removed:
            log.info("run directory %s: %d file(s) left by stopped writers removed", self.path, removed)
        return removed
