"""Nothing lost, nothing stalls after a crash (issue #36): a marker left by a writer that was killed between
its marker and its file never holds a request (404 within a second, /api/health unaffected), a live
writer's is waited for a second at most (then 503 with Retry-After), and no run the server said was
stored (GET /api/runs/{id}/stored) is lost when both workers are killed with SIGKILL."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

from attnscope.model.runs.disk import host_name
from tests.app.test_workers import TEXT, attnscope, fresh

WRITER = textwrap.dedent("""
    import sys, threading, time
    from attnscope.model.runs.disk import RunDir
    from attnscope.model.runs.persist import RunFiles

    files = RunFiles(RunDir.open(sys.argv[1], 1 << 30), lambda record: None)
    RunFiles._run = lambda self, job: threading.Event().wait()  # the write never finishes: killed first
    files.saved(sys.argv[2], None)
    print("marked", flush=True)
    time.sleep(600)
""")


def _timed(url: str, path: str) -> tuple[int, float]:
    start = time.monotonic()
    got = fresh(url, path)
    return got.status_code, time.monotonic() - start


def test_a_killed_writers_marker_stalls_nothing(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with attnscope(["serve"], tiny_dirs["llama"], runs, tmp_path / "serve.log") as url:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(runs), "killedRun123"], stdout=subprocess.PIPE,
                                  text=True)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "marked"
        marker = runs / "coming" / "killedRun123"
        assert marker.read_text().split() == [host_name(), str(writer.pid)]
        os.kill(writer.pid, signal.SIGKILL)  # between the marker and the file
        writer.wait(timeout=30)
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            gets = [pool.submit(_timed, url, "/api/runs/killedRun123") for _ in range(20)]
            health = [pool.submit(_timed, url, "/api/health") for _ in range(4)]
            for future in gets:
                status, seconds = future.result()
                assert status == 404 and seconds < 1.0, (status, seconds)
            for future in health:
                status, seconds = future.result()
                assert status == 200 and seconds < 1.0, (status, seconds)
        assert not marker.exists()  # cleared by the first look

        # a live writer that is slow: waited for a second at most, then 503 with Retry-After
        slow = subprocess.Popen([sys.executable, "-c", WRITER, str(runs), "slowRun456"], stdout=subprocess.PIPE,
                                text=True)
        try:
            assert slow.stdout is not None and slow.stdout.readline().strip() == "marked"
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                waits = [pool.submit(fresh, url, "/api/runs/slowRun456") for _ in range(6)]
                beat = pool.submit(_timed, url, "/api/health")
                for future in waits:
                    got = future.result()
                    assert got.status_code == 503 and got.headers["Retry-After"] == "1", got.text
                    assert got.json()["code"] == "run_being_written"
                status, seconds = beat.result()
                assert status == 200 and seconds < 1.0
        finally:
            slow.kill()
            slow.wait(timeout=30)
        status, seconds = _timed(url, "/api/runs/slowRun456")  # its writer is gone now: 404 at once
        assert status == 404 and seconds < 1.0

    # a restarted server clears a dead writer's marker at start, whatever its age
    (runs / "coming" / "deadRun789").write_text(f"{host_name()} {writer.pid}\n")
    with attnscope(["serve"], tiny_dirs["llama"], runs, tmp_path / "again.log") as url:
        assert not (runs / "coming" / "deadRun789").exists()
        assert _timed(url, "/api/runs/deadRun789")[0] == 404


def test_no_run_said_stored_is_lost_when_both_workers_are_killed(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    said_stored: list[str] = []
    answered: list[str] = []
    for round_ in range(2):
        with attnscope(["serve", "--workers", "2"], tiny_dirs["llama"], runs, tmp_path / f"w{round_}.log") as url:
            pids = {int(fresh(url, "/api/health").json()["worker"]) for _ in range(20)}
            for i in range(6):
                made = httpx.post(f"{url}/api/runs", json={"text": f"{TEXT} {round_} {i}"}, timeout=60)
                assert made.status_code == 201
                body = made.json()
                answered.append(body["run_id"])
                # written in the background: the answer promises it only when the write already finished
                if body["stored"] is True or i % 2 == 0:  # half are waited for: "stored" is the promise
                    got = fresh(url, f"/api/runs/{body['run_id']}/stored", wait=10).json()
                    assert got == {"run_id": body["run_id"], "stored": True, "directory": True}
                    said_stored.append(body["run_id"])
            with concurrent.futures.ThreadPoolExecutor(4) as pool:  # analyses in flight at the kill
                for j in range(4):
                    pool.submit(lambda j=j: httpx.post(f"{url}/api/runs", json={"text": f"{TEXT * 2} {j}"}, timeout=0.3))
                time.sleep(0.15)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
    with attnscope(["serve"], tiny_dirs["llama"], runs, tmp_path / "after.log") as url:
        lost = [run_id for run_id in said_stored if fresh(url, f"/api/runs/{run_id}").status_code != 200]
        assert said_stored and not lost, lost
        for run_id in said_stored:  # and such a run says so after the restart too
            assert fresh(url, f"/api/runs/{run_id}").json()["stored"] is True
        assert not any(p.name.startswith(".tmp") for p in runs.iterdir())
