"""Runs that last and travel (#30): a run directory behind the memory store, run files out and in.

A restart on the same directory serves every run as before (attention, late head scores, tools); a run
whose model is not loaded, or has changed, still shows its attention and its tools answer 409; a run file
exported here is imported by a server with another directory (or none); hostile files are refused; a
directory that cannot be used stops the server in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import LoadedModel, load_model
from attnscope.model.runs.disk import RunDir
from attnscope.model.runs.persist import RunFiles
from attnscope.model.runs.record import RunStore
from attnscope.model.services.engine import Engine
from tests.support.servers import free_port

TEXT = "the cat sat on the mat. the cat sat on the mat."


@pytest.fixture(scope="module")
def llama(tiny_dirs: dict[str, Path]) -> LoadedModel:
    return load_model("tiny", str(tiny_dirs["llama"]))


def on_disk(models: dict[str, LoadedModel], folder: Path | None, default: str = "tiny") -> Engine:
    """An engine as `attnscope serve` builds one: the memory store, backed by ``folder`` (None: memory only)."""
    store = RunStore(1 << 28)
    engine = Engine(models, default, store, 1024)
    if folder is not None:
        store.backing = RunFiles(RunDir.open(folder, 1 << 30), engine.origin)
    return engine


@contextmanager
def server(engine: Engine, **settings: int) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(models={}, default_model=engine.default, **settings), engine)) as client:
        yield client
    engine.close()  # a stopped server: its queued writes are written, its threads end


def f32(client: TestClient, run_id: str, layer: int, head: int) -> np.ndarray:
    got = client.get(f"/api/runs/{run_id}/attention", params={"layer": layer, "head": head, "format": "f32"})
    assert got.status_code == 200, got.text
    return np.frombuffer(got.content, dtype="<f4")


def heads(client: TestClient, run_id: str) -> list[dict[str, object]]:
    got = client.get(f"/api/runs/{run_id}/heads", params={"wait": 30})
    assert got.status_code == 200, got.text
    return list(got.json()["heads"])


def ablate(client: TestClient, run_id: str) -> tuple[int, dict[str, object]]:
    got = client.post(f"/api/runs/{run_id}/ablate", json={"heads": [[1, 1]], "mode": "zero"})
    return got.status_code, got.json()


def test_a_restart_on_the_same_directory_serves_every_run_as_before(llama: LoadedModel, tmp_path: Path) -> None:
    with server(on_disk({"tiny": llama}, tmp_path)) as before:
        made = [before.post("/api/runs", json={"text": t}).json()["run_id"] for t in (TEXT, "dog bites man")]
        seen = {r: (f32(before, r, 1, 2), heads(before, r), ablate(before, r)) for r in made}
        next_before = before.get(f"/api/runs/{made[0]}/next", params={"position": 3}).json()
    files = sorted(p.name for p in tmp_path.glob("*.run"))
    assert files == sorted(f"{r}.run" for r in made)
    with server(on_disk({"tiny": llama}, tmp_path)) as after:  # a new process's memory: nothing but the files
        for run_id, (attention, scores, tool) in seen.items():
            np.testing.assert_array_equal(f32(after, run_id, 1, 2), attention)  # the kept Q and K: the same bytes
            assert heads(after, run_id) == scores  # late head scores included
            status, body = ablate(after, run_id)
            assert status == 200 and tool[0] == 200
            assert body["positions"][-1]["kl"] == pytest.approx(tool[1]["positions"][-1]["kl"], rel=1e-4, abs=1e-6)
        assert after.get(f"/api/runs/{made[0]}/next", params={"position": 3}).json()["top"] == next_before["top"]
        assert after.get("/api/runs/nosuchrun00000000").json()["code"] == "run_not_found"


def test_a_run_whose_model_changed_or_is_gone_shows_its_attention_and_its_tools_say_why(
        llama: LoadedModel, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    with server(on_disk({"tiny": llama}, tmp_path)) as before:
        run_id = before.post("/api/runs", json={"text": TEXT}).json()["run_id"]
        attention = f32(before, run_id, 1, 2)
    edited = load_model("tiny", str(tiny_dirs["llama"]))
    with torch.no_grad():
        edited.model.model.layers[0].mlp.down_proj.weight.mul_(2.0)  # same name, other weights
    with server(on_disk({"tiny": edited}, tmp_path)) as changed:
        np.testing.assert_array_equal(f32(changed, run_id, 1, 2), attention)
        assert len(heads(changed, run_id)) > 0
        status, body = ablate(changed, run_id)
        assert status == 409 and body["code"] == "run_model_changed" and body["params"] == {"model": "tiny"}
        refused = changed.get(f"/api/runs/{run_id}/next", params={"position": 3})
        assert refused.status_code == 409 and refused.json()["code"] == "run_model_changed"
    other = load_model("other", str(tiny_dirs["gpt2"]))
    with server(on_disk({"other": other}, tmp_path, default="other")) as gone:
        np.testing.assert_array_equal(f32(gone, run_id, 1, 2), attention)
        status, body = ablate(gone, run_id)
        assert status == 409 and body["code"] == "run_model_missing"
        assert body["params"] == {"model": "tiny", "available": ["other"]} and "not loaded" in body["message"]


def test_a_run_file_travels_to_another_server(llama: LoadedModel, tmp_path: Path) -> None:
    with server(on_disk({"tiny": llama}, tmp_path / "a")) as a:
        run_id = a.post("/api/runs", json={"text": TEXT}).json()["run_id"]
        scores = heads(a, run_id)
        file = a.get(f"/api/runs/{run_id}/export", params={"format": "attnscope"})
        assert file.status_code == 200 and file.headers["content-type"] == "application/octet-stream"
        assert f'attnscope-run-{run_id}.attnscope' in file.headers["content-disposition"]
        attention = f32(a, run_id, 0, 3)
    for folder in (tmp_path / "b", None):  # another directory, or memory only
        with server(on_disk({"tiny": llama}, folder)) as b:
            made = b.post("/api/runs/import", content=file.content,
                          headers={"content-type": "application/octet-stream"})
            assert made.status_code == 201, made.text
            run = made.json()
            assert run["run_id"] != run_id and run["text"] == TEXT and run["model"] == "tiny"
            np.testing.assert_array_equal(f32(b, run["run_id"], 0, 3), attention)
            assert heads(b, run["run_id"]) == scores
            assert ablate(b, run["run_id"])[0] == 200  # the same model, as it was: the tools work


def test_hostile_run_files_are_refused_and_nothing_is_kept(llama: LoadedModel, tmp_path: Path) -> None:
    with server(on_disk({"tiny": llama}, tmp_path), max_run_file_bytes=4 << 20) as client:
        good = client.get(f"/api/runs/{client.post('/api/runs', json={'text': TEXT}).json()['run_id']}/export",
                          params={"format": "attnscope"}).content
        kept = len(client.app.state.engine.store)
        header = int.from_bytes(good[:8], "little")
        hostile = {
            "empty": b"",
            "truncated": good[: len(good) // 2],
            "a header longer than the file": (len(good) * 4).to_bytes(8, "little") + good[8:],
            "not JSON": good[:8] + b"{" * header + good[8 + header:],
            "another format": good.replace(b"attnscope-run/1", b"attnscope-run/9"),
            "random bytes": bytes(range(256)) * 64,
            "a JSON export": json.dumps({"format": "attnscope-json/1"}).encode(),
        }
        for what, body in hostile.items():
            got = client.post("/api/runs/import", content=body, headers={"content-type": "application/octet-stream"})
            assert got.status_code == 422, (what, got.status_code, got.text)
            assert got.json()["code"] == "bad_run_file", what
        too_big = client.post("/api/runs/import", content=b"\0" * (5 << 20),
                              headers={"content-type": "application/octet-stream"})
        assert too_big.status_code == 413 and "ATTNSCOPE_MAX_RUN_FILE_BYTES" in too_big.json()["message"]
        assert client.post("/api/runs", content=b"{" * (5 << 20)).json()["params"] == {"max_bytes": 4 << 20}
        assert len(client.app.state.engine.store) == kept


def test_a_corrupt_file_in_the_directory_is_set_aside_not_served(llama: LoadedModel, tmp_path: Path) -> None:
    with server(on_disk({"tiny": llama}, tmp_path)) as before:
        run_id = before.post("/api/runs", json={"text": TEXT}).json()["run_id"]
    path = tmp_path / f"{run_id}.run"
    path.write_bytes(path.read_bytes()[:1000])  # a disk that lost the end of it
    with server(on_disk({"tiny": llama}, tmp_path)) as after:
        got = after.get(f"/api/runs/{run_id}")
        assert got.status_code == 422 and got.json()["code"] == "bad_run_file"
        assert not path.exists() and any((tmp_path / "rejected").iterdir())
        assert after.get(f"/api/runs/{run_id}").status_code == 404


def test_a_run_directory_that_cannot_be_used_stops_the_server_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = {**os.environ, "ATTNSCOPE_RUN_DIR": str(blocker / "runs"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "attnscope", "serve", "--port", str(free_port())], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"attnscope: cannot use the run directory {blocker / 'runs'}"), proc.stderr


def test_a_full_run_directory_keeps_the_newest_runs_and_the_server_goes_on(llama: LoadedModel, tmp_path: Path) -> None:
    """The byte cap as a full disk: the oldest files go first; a run whose file alone is over the cap stays in
    memory only (said in the log), and nothing fails."""
    with server(on_disk({"tiny": llama}, tmp_path)) as probe:
        size = len(probe.get(f"/api/runs/{probe.post('/api/runs', json={'text': TEXT}).json()['run_id']}/export",
                             params={"format": "attnscope"}).content)
    for p in tmp_path.glob("*.run"):
        p.unlink()
    store = RunStore(1 << 28)
    engine = Engine({"tiny": llama}, "tiny", store, 1024)
    store.backing = RunFiles(RunDir.open(tmp_path, int(size * 2.5)), engine.origin)  # room for two of these
    with server(engine) as client:
        made = [client.post("/api/runs", json={"text": TEXT}).json()["run_id"] for _ in range(4)]
        engine.scores.wait_idle(60)  # a run is written again with its late scores: then it is the newest
        store.backing.wait_idle(60)
        kept = sorted(p.stem for p in tmp_path.glob("*.run"))
        assert len(kept) == 2 and made[-1] in kept and set(kept) <= set(made)  # the newest two; the cap holds
        assert sum(p.stat().st_size for p in tmp_path.glob("*.run")) <= int(size * 2.5)
        for run_id in made:  # every run still answers from memory
            assert client.get(f"/api/runs/{run_id}").status_code == 200
        long_run = client.post("/api/runs", json={"text": TEXT * 8}).json()["run_id"]  # its file is over the cap
        store.backing.wait_idle(60)
        assert not (tmp_path / f"{long_run}.run").exists()
        assert client.get(f"/api/runs/{long_run}/heads", params={"wait": 30}).status_code == 200
    with server(on_disk({"tiny": llama}, tmp_path)) as after:
        for run_id in made:  # after a restart: the runs whose files were kept, and only those
            got = after.get(f"/api/runs/{run_id}")
            assert (got.status_code == 200) if run_id in kept else (got.json()["code"] == "run_not_found")
