"""The run directory across processes (#30): `attnscope serve --workers 2` on one port (any worker serves
any run, the late head scores computed once), a server killed with SIGKILL during an analyse and during
the late scores' write (the restarted server serves every run it wrote, whole), and `attnscope open`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import numpy as np

from tests.support.servers import free_port

TEXT = "the cat sat on the mat. the cat sat on the mat. " * 4


@contextmanager
def attnscope(args: list[str], tiny: Path, run_dir: Path, log: Path) -> Iterator[str]:
    """`python -m attnscope ARGS` serving the tiny llama, its output in ``log``; yields its URL once up."""
    port = free_port()
    env = {**os.environ, "ATTNSCOPE_MODELS": json.dumps({"tiny": str(tiny)}), "ATTNSCOPE_DEFAULT_MODEL": "tiny",
           "ATTNSCOPE_RUN_DIR": str(run_dir), "HF_HUB_OFFLINE": "1", "ATTNSCOPE_ALLOWED_HOSTS": "127.0.0.1"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "attnscope", *args, "--port", str(port)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/api/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield url
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


def fresh(url: str, path: str, **params: object) -> httpx.Response:
    """One request on a new connection (the kernel hands each connection to one of the workers)."""
    with httpx.Client(timeout=60) as client:
        return client.get(f"{url}{path}", params=params)


def test_two_workers_share_the_run_directory(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with attnscope(["serve", "--workers", "2"], tiny_dirs["llama"], tmp_path / "runs", log) as url:
        workers: set[int] = set()
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:  # both answer (each loaded the model)
            workers.add(int(fresh(url, "/api/health").json()["worker"]))
        assert len(workers) == 2
        made = []
        for i in range(4):  # at once after the analyse, on new connections: the other worker waits for the file
            made.append(httpx.post(f"{url}/api/runs", json={"text": f"{TEXT * 4} {i}"}, timeout=60).json()["run_id"])
            for _ in range(4):
                assert fresh(url, f"/api/runs/{made[-1]}").status_code == 200
        answered: dict[str, set[int]] = {}
        for run_id in made:
            pattern = None
            for _ in range(12):  # reads spread over both workers: each serves every run, the same bytes
                got = fresh(url, f"/api/runs/{run_id}/attention", layer=1, head=2, format="f32")
                assert got.status_code == 200, got.text
                cells = np.frombuffer(got.content, dtype="<f4")
                pattern = cells if pattern is None else pattern
                np.testing.assert_array_equal(cells, pattern)
                heads = fresh(url, f"/api/runs/{run_id}/heads", wait=30)
                assert heads.status_code == 200 and not heads.json()["scores_pending"]
                answered.setdefault(run_id, set()).add(int(fresh(url, "/api/health").json()["worker"]))
        assert any(len(w) == 2 for w in answered.values())
    text = log.read_text()
    for run_id in made:  # computed once across the workers (the other read them from the run's file)
        assert len(re.findall(rf"run {re.escape(run_id)}: exact ", text)) == 1, text


def test_workers_need_a_run_directory(tiny_dirs: dict[str, Path]) -> None:
    env = {**os.environ, "ATTNSCOPE_RUN_DIR": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "attnscope", "serve", "--workers", "2", "--port", str(free_port())],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--workers needs a run directory" in proc.stderr


def test_sigkill_during_an_analyse_and_during_the_late_scores_leaves_only_whole_runs(
        tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    kept: dict[str, bytes] = {}
    for round_ in range(3):
        with attnscope(["serve"], tiny_dirs["llama"], runs, tmp_path / f"kill{round_}.log") as url:
            health = httpx.get(f"{url}/api/health").json()
            made = httpx.post(f"{url}/api/runs", json={"text": TEXT * 3}, timeout=60).json()["run_id"]
            # the analyse answers before its file is written (stored: false); once the server says the file
            # is on disk, the run is promised to survive the kill (#36)
            assert fresh(url, f"/api/runs/{made}/stored", wait=10).json()["stored"] is True
            kept[made] = fresh(url, f"/api/runs/{made}/attention", layer=0, head=1, format="f32").content
            # a second analyse in flight, its late scores and the files' writes racing the kill
            with suppress(httpx.TimeoutException):
                httpx.post(f"{url}/api/runs", json={"text": TEXT * 4}, timeout=0.05 + 0.1 * round_)
            os.kill(int(health["worker"]), signal.SIGKILL)
    with attnscope(["serve"], tiny_dirs["llama"], runs, tmp_path / "after.log") as url:
        for name in sorted(p.stem for p in runs.glob("*.run")):  # every file there is a whole run
            got = fresh(url, f"/api/runs/{name}")
            assert got.status_code == 200, got.text
        for run_id, cells in kept.items():  # and every run answered before a kill is served as it was
            got = fresh(url, f"/api/runs/{run_id}/attention", layer=0, head=1, format="f32")
            assert got.status_code == 200 and got.content == cells
        assert not any(p.name.startswith(".tmp") for p in runs.iterdir())
        assert not (runs / "rejected").exists() or not any((runs / "rejected").iterdir())


def test_attnscope_open_serves_a_run_file(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    with attnscope(["serve"], tiny_dirs["llama"], tmp_path / "a", tmp_path / "a.log") as url:
        run_id = httpx.post(f"{url}/api/runs", json={"text": TEXT}, timeout=60).json()["run_id"]
        file = tmp_path / "shared.attnscope"
        file.write_bytes(httpx.get(f"{url}/api/runs/{run_id}/export", params={"format": "attnscope"}).content)
        cells = fresh(url, f"/api/runs/{run_id}/attention", layer=1, head=0, format="f32").content
    log = tmp_path / "open.log"
    with attnscope(["open", str(file), "--no-browser"], tiny_dirs["llama"], tmp_path / "b", log) as url:
        printed = re.search(r"at (http://\S+/\?run=([\w-]+))", log.read_text())
        assert printed, log.read_text()
        opened = printed.group(2)
        assert fresh(url, f"/api/runs/{opened}/attention", layer=1, head=0, format="f32").content == cells
        assert fresh(url, f"/api/runs/{opened}").json()["text"] == TEXT
    bad = tmp_path / "bad.attnscope"
    bad.write_bytes(b"not a run")
    proc = subprocess.run([sys.executable, "-m", "attnscope", "open", str(bad), "--no-browser", "--port",
                           str(free_port())], env={**os.environ, "HF_HUB_OFFLINE": "1",
                                                   "ATTNSCOPE_MODELS": json.dumps({"tiny": str(tiny_dirs["llama"])}),
                                                   "ATTNSCOPE_DEFAULT_MODEL": "tiny"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "not a usable attnscope run file" in proc.stderr.strip().splitlines()[-1]
