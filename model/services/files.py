"""Run files in and out (``model.runs.runfile``): a run as one self-describing file, and a file stored
as a run again — on this server or another, with its own run directory."""

from __future__ import annotations

from pathlib import Path

from attnscope.model.runs import runfile
from attnscope.model.runs.persist import Origin, record_of
from attnscope.model.services.engine import Engine, RunResult


def run_file(engine: Engine, *, run_id: str) -> bytes:
    """The run's file (``attnscope-run/1``): what it keeps, its summary and late scores as they are now,
    and the fingerprints of the model and tokenizer that made it."""
    record = engine.run(run_id)
    origin = engine.origin(record) or Origin(record.model_fingerprint, "", "")
    return runfile.dump(record, model_fingerprint=origin.model_fingerprint,
                        tokenizer_fingerprint=origin.tokenizer_fingerprint, dtype=origin.dtype)


def import_run(engine: Engine, *, data: bytes, max_bytes: int) -> RunResult:
    """Store a run file as a new run here (a new id; its late head scores computed if it still owed them).
    Its attention is served from what it keeps whatever the models here; a tool that needs its model
    answers 409 unless that model is loaded here as it was."""
    record = record_of(data, max_bytes=max_bytes)
    run_id = engine.store.add(record)
    if record.pending is not None:
        engine.scores.submit(run_id, record)
    return RunResult(run_id=run_id, cache=record)


def save(engine: Engine, *, run_id: str, path: str | Path) -> Path:
    """Write the run's file to ``path`` whole or not at all (a temporary name, then renamed)."""
    target = Path(path)
    data = run_file(engine, run_id=run_id)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target
