"""Run files in and out (``model.runs.runfile``): a run as one self-describing file, and a file stored
as a run again — on this server or another, with its own run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnscope.model.errors import ImportBusy, TooLarge
from attnscope.model.load.tokens import Token
from attnscope.model.results import PositionPrediction
from attnscope.model.runs import activations, runfile
from attnscope.model.runs.budget import mib, mib_over
from attnscope.model.runs.disk import write_whole
from attnscope.model.runs.persist import Origin, RunFiles, record_from, record_of
from attnscope.model.runs.record import RunRecord
from attnscope.model.runs.runfile import StoredRun
from attnscope.model.scores.analysis import HeadScore
from attnscope.model.services.analyse import RunResult
from attnscope.model.services.engine import Engine


def run_file(engine: Engine, *, run_id: str) -> bytes:
    """The run's file (``attnscope-run/1``): what it keeps, its summary and late scores as they are now,
    and the fingerprints of the model and tokenizer that made it."""
    record = engine.run(run_id)
    origin = engine.origin(record) or Origin(record.model_fingerprint, "", "")
    return runfile.dump(record, model_fingerprint=origin.model_fingerprint,
                        tokenizer_fingerprint=origin.tokenizer_fingerprint, dtype=origin.dtype)


def spool_folder(engine: Engine) -> Path | None:
    """Where an imported run file is streamed before it is checked: the run directory (same file system as the
    runs it will join), or None for the system's temporary folder."""
    backing = engine.store.backing
    return backing.folder.path if isinstance(backing, RunFiles) else None


def import_run(engine: Engine, *, data: bytes, max_bytes: int, adopt: str | None = None) -> RunResult:
    """Store a run file as a new run here (a new id; its late head scores computed if it still owed them).
    Its attention is served from what it keeps whatever the models here; a tool that needs its model
    answers 409 unless that model is loaded here as it was. ``adopt``: a loaded model that takes the run
    as its own, whatever name the file gives, when it is that very model (the same fingerprint)."""
    return _adopted(engine, record_of(data, max_bytes=max_bytes), adopt)


IMPORT_WAIT_S = 5.0  # how long an import waits for room in the memory budget before 503 import_busy


def import_run_file(engine: Engine, *, path: Path, max_bytes: int, adopt: str | None = None) -> RunResult:
    """``import_run`` of a file on disk (an upload streamed there): its header is checked and the bytes its
    tensors need are counted before any is loaded — a run that could never be kept is refused (413
    ``run_over_cache``), and imports in flight together hold at most the memory budget (the forwards'
    ``ATTNSCOPE_FORWARD_BYTES``; past it, 503 ``import_busy``). The file is never held as bytes."""
    need = runfile.tensor_bytes(path, max_bytes=max_bytes)
    if need > engine.store.max_bytes:
        keep, cap = mib_over(need, engine.store.max_bytes)
        raise TooLarge(f"this run file keeps {keep}; the run store holds at most {cap} (ATTNSCOPE_RUN_STORE_BYTES)",
                       code="run_over_cache", params={"keep": keep, "cap": cap})
    budget = engine.budget
    if need > budget.total:
        asked, total = mib_over(need, budget.total)
        raise TooLarge(f"opening this run file needs {asked}; forwards and imports in flight may use at most "
                       f"{total} (ATTNSCOPE_FORWARD_BYTES)", code="forward_too_big",
                       params={"need": asked, "limit": total})
    try:
        with budget.reserve(need, timeout=IMPORT_WAIT_S):
            record = record_from(runfile.read_path(path, max_bytes=max_bytes))
    except TooLarge as err:
        if err.code != "forward_busy":
            raise
        raise ImportBusy(mib(budget.used), mib(need), mib(budget.total)) from None
    return _adopted(engine, record, adopt)


def _adopted(engine: Engine, record: RunRecord, adopt: str | None) -> RunResult:
    if adopt is not None and record.model_fingerprint == engine.origin_of(adopt).model_fingerprint:
        record.model = adopt
    run_id = engine.store.add(record)
    engine.owe_scores(run_id, record)
    return RunResult(run_id=run_id, record=record)


class RecordView:
    """What a run says of itself, read from its record (``Run`` on a Scope, ``RunFile`` from a file), and
    its activations by name as TransformerLens' cache gives them: ``run["resid_post", 3]``,
    ``run["blocks.3.hook_resid_post"]``, ``run["pattern", 4]`` (computed from the kept Q and K)."""

    @property
    def record(self) -> RunRecord:
        raise NotImplementedError

    def __getitem__(self, key: activations.Key) -> torch.Tensor:
        return activations.activation(self.record, key)

    def names(self) -> list[str]:
        """Every activation name the run answers to (``run[name]``), block by block."""
        return activations.names(self.record)

    @property
    def text(self) -> str:
        return self.record.text

    @property
    def tokens(self) -> list[Token]:
        return list(self.record.summary.tokens)

    @property
    def predictions(self) -> list[PositionPrediction]:
        return list(self.record.summary.predictions)


@dataclass(frozen=True)
class RunFile(RecordView):
    """A run file read without a model (``attnscope.load``): its text, tokens, predictions, head scores and
    any head's exact attention, rebuilt from the kept Q and K. The tools need the model: ``scope.load``."""

    stored: StoredRun

    @staticmethod
    def read(path: str | Path) -> RunFile:
        data = Path(path).read_bytes()
        return RunFile(runfile.read(data, max_bytes=len(data)))

    @property
    def record(self) -> RunRecord:
        return self.stored.record

    @property
    def model(self) -> str:
        return self.record.model

    def heads(self) -> list[HeadScore]:
        """Every head's scores as the file holds them (a file saved before its late scores came has None
        for those: ``scores_pending``)."""
        return list(self.record.summary.heads)

    @property
    def scores_pending(self) -> tuple[str, ...]:
        return self.record.summary.scores_pending

    def attention(self, layer: int, head: int) -> torch.Tensor:
        """(n, n) float32: one head's exact weights (masked cells 0)."""
        record = self.record
        record.check_layer_head(layer, head)
        return record.head_pattern(layer, head)


def save(engine: Engine, *, run_id: str, path: str | Path) -> Path:
    """Write the run's file to ``path`` whole or not at all (a temporary name, then renamed)."""
    return write_whole(Path(path), run_file(engine, run_id=run_id))
