"""Run-file imports stream to disk and are checked there (issue #36): a 600 MiB chunked upload and three
concurrent 500 MiB ones leave the server's peak memory within 100 MiB of where it was; a run too large
to keep is refused before its tensors are read; imports in flight share the memory budget (503
import_busy past it); other methods on /api/runs/import are its own 405."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from attnscope.model.errors import ImportBusy, TooLarge
from attnscope.model.runs import runfile
from attnscope.model.services import files
from tests.app.test_workers import TEXT, attnscope, fresh
from tests.support.tiny import make_engine

MIB = 1 << 20


def _rss_kib(pid: int) -> int:
    """The process's resident memory now (VmRSS), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Sampler:
    """The largest resident memory of a process while the ``with`` runs, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.top = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.top = max(self.top, _rss_kib(self.pid))
            self._stop.wait(0.02)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _chunks(total: int, chunk: int = 4 * MIB) -> Iterator[bytes]:
    """``total`` bytes of noise, a chunk at a time (httpx sends a generator chunked: no Content-Length)."""
    block = os.urandom(chunk)
    sent = 0
    while sent < total:
        n = min(chunk, total - sent)
        yield block[:n]
        sent += n


def _import(url: str, total: int) -> httpx.Response:
    with httpx.Client(timeout=300) as client:
        return client.post(f"{url}/api/runs/import", content=_chunks(total),
                           headers={"content-type": "application/octet-stream"})


def test_huge_uploads_stream_to_disk_and_memory_stays_flat(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with attnscope(["serve"], tiny_dirs["llama"], runs, tmp_path / "serve.log") as url:
        made = httpx.post(f"{url}/api/runs", json={"text": TEXT}, timeout=60).json()["run_id"]
        good = fresh(url, f"/api/runs/{made}/export", format="attnscope").content
        pid = int(fresh(url, "/api/health").json()["worker"])
        time.sleep(10)  # the start-up's background sweeps settle
        before = _rss_kib(pid)
        with Sampler(pid) as one:
            too_big = _import(url, 600 * MIB)  # chunked, past the 512 MiB limit
        assert too_big.status_code == 413 and too_big.json()["code"] == "body_too_large"
        with Sampler(pid) as three, concurrent.futures.ThreadPoolExecutor(3) as pool:  # at once, each under it
            answers = list(pool.map(lambda _i: _import(url, 500 * MIB), range(3)))
        for got in answers:
            assert got.status_code == 422 and got.json()["code"] == "bad_run_file", got.text[:300]
        for sampled in (one, three):  # before #36: +513 MiB for the first, about +2 GiB for the three
            grew = (sampled.top - before) / 1024
            assert grew < 100, f"resident memory grew by {grew:.0f} MiB"
        assert not [p for p in runs.iterdir() if p.name.startswith(".tmp")]  # every spool removed

        # a real run file still imports (streamed, in 64 KiB chunks) and is served
        with httpx.Client(timeout=60) as client:
            got = client.post(f"{url}/api/runs/import", content=iter([good[i:i + 65536]
                                                                      for i in range(0, len(good), 65536)]))
        assert got.status_code == 201, got.text[:300]
        assert fresh(url, f"/api/runs/{got.json()['run_id']}").json()["text"] == TEXT

        # another method on the import path is that route's 405, not a run id's
        options = httpx.request("OPTIONS", f"{url}/api/runs/import")
        assert options.status_code == 405 and "POST" in options.headers["allow"]
        assert httpx.get(f"{url}/api/runs/import").headers.get("allow", "").startswith("POST")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, object]) -> Path:
    engine = make_engine({"tiny-gpt2": tiny_models["gpt2"]}, "tiny-gpt2")  # type: ignore[dict-item]
    try:
        result = engine.analyse(TEXT)
        path = tmp_path_factory.mktemp("runfile") / "run.attnscope"
        path.write_bytes(files.run_file(engine, run_id=result.run_id))
    finally:
        engine.close()
    return path


def test_a_run_too_large_to_keep_is_refused_before_its_tensors_are_read(
        run_file: Path, tiny_models: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    need = runfile.tensor_bytes(run_file, max_bytes=1 << 30)
    engine = make_engine({"tiny-gpt2": tiny_models["gpt2"]}, "tiny-gpt2")  # type: ignore[dict-item]
    try:
        engine.store.max_bytes = need // 2
        monkeypatch.setattr(runfile, "read_path", lambda *a, **k: pytest.fail("the tensors were read"))
        with pytest.raises(TooLarge) as err:
            files.import_run_file(engine, path=run_file, max_bytes=1 << 30)
        assert err.value.code == "run_over_cache" and "MiB" in err.value.message
    finally:
        engine.close()


def test_imports_in_flight_share_the_memory_budget(run_file: Path, tiny_models: dict[str, object],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    need = runfile.tensor_bytes(run_file, max_bytes=1 << 30)
    engine = make_engine({"tiny-gpt2": tiny_models["gpt2"]}, "tiny-gpt2")  # type: ignore[dict-item]
    try:
        engine.budget.total = need + need // 2  # room for one import, not two
        monkeypatch.setattr(files, "IMPORT_WAIT_S", 0.2)
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with engine.budget.reserve(need):  # another import (or a forward) in flight
                holding.set()
                release.wait(30)

        other = threading.Thread(target=hold)
        other.start()
        holding.wait(30)
        try:
            with pytest.raises(ImportBusy) as err:
                files.import_run_file(engine, path=run_file, max_bytes=1 << 30)
            assert err.value.code == "import_busy" and err.value.params["budget"]
        finally:
            release.set()
            other.join(30)
        result = files.import_run_file(engine, path=run_file, max_bytes=1 << 30)  # room again: it imports
        assert result.record.text == TEXT
    finally:
        engine.close()
