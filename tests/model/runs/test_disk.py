"""The run directory (``model/runs/disk.py``): files that survive their writer's SIGKILL whole or not at
all, least recently used out under a byte cap, a claim that one process of several gets, and a directory
that cannot be written said in one line."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from attnscope.model.errors import TooLarge
from attnscope.model.runs.budget import mib_over
from attnscope.model.runs.disk import LOCKS, REJECTED, TMP_PREFIX, RunDir, RunDirError, valid_id

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_put_get_delete_and_ids(tmp_path: Path) -> None:
    runs = RunDir.open(tmp_path / "runs", 1 << 20)
    assert runs.get("abc") is None and runs.ids() == []
    runs.put("abc", b"first")
    runs.put("x_Y-9", b"second")
    runs.put("abc", b"replaced")
    assert runs.get("abc") == b"replaced" and runs.get("x_Y-9") == b"second"
    assert sorted(runs.ids()) == ["abc", "x_Y-9"] and runs.nbytes == len(b"replaced") + len(b"second")
    (runs.path / "notes.txt").write_text("not a run")  # foreign files are not runs
    assert sorted(runs.ids()) == ["abc", "x_Y-9"]
    assert runs.delete("abc") and not runs.delete("abc") and runs.get("abc") is None
    assert RunDir.open(tmp_path / "runs", 1 << 20).get("x_Y-9") == b"second"  # another process, later


@pytest.mark.parametrize("bad", ["", "../etc/passwd", "a/b", "..", "a.run", "x" * 65, "é", "a b", "/abs"])
def test_run_ids_are_never_paths(tmp_path: Path, bad: str) -> None:
    runs = RunDir.open(tmp_path, 1 << 20)
    assert not valid_id(bad)
    assert runs.get(bad) is None and not runs.delete(bad)
    with pytest.raises(ValueError, match="not a run id"):
        runs.put(bad, b"data")
    assert os.listdir(tmp_path) == [LOCKS]


def test_least_recently_used_out_under_the_cap(tmp_path: Path) -> None:
    size = 1000
    runs = RunDir.open(tmp_path, int(3.5 * size))  # room for three files: a full disk, simulated
    for run_id in ("a", "b", "c"):
        runs.put(run_id, bytes(size))
    assert runs.get("a") is not None  # a is used again: b is now the least recently used
    runs.put("d", bytes(size))
    assert sorted(runs.ids()) == ["a", "c", "d"] and runs.nbytes <= runs.max_bytes
    runs.put("e", bytes(2 * size))  # needs two files' room
    assert sorted(runs.ids()) == ["d", "e"]
    assert runs.ids()[-1] == "e"  # the newest, kept


def test_a_file_larger_than_the_whole_cap_is_refused(tmp_path: Path) -> None:
    runs = RunDir.open(tmp_path, 3 << 20)
    runs.put("small", b"x")
    with pytest.raises(TooLarge) as caught:
        runs.put("big", bytes((3 << 20) + 1))
    assert caught.value.code == "run_over_disk"
    size, cap = mib_over((3 << 20) + 1, 3 << 20)
    assert caught.value.params == {"size": size, "cap": cap} and size != cap
    assert "ATTNSCOPE_RUN_DIR_BYTES" in str(caught.value)
    assert runs.ids() == ["small"] and not [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]


def test_a_file_set_aside_is_kept_with_its_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runs = RunDir.open(tmp_path, 1 << 20)
    runs.put("bad", b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger="attnscope.model.runs.disk"):
        where = runs.set_aside("bad", "not a usable attnscope run file: too short")
    assert where is not None and where.parent == tmp_path / REJECTED and where.read_bytes() == b"\x00garbage"
    assert "too short" in where.with_suffix(".txt").read_text()
    assert runs.get("bad") is None and runs.ids() == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "bad" in lines[0] and "too short" in lines[0]
    assert runs.set_aside("bad", "again") is None  # gone already


WRITER = """
import sys
from pathlib import Path
from attnscope.model.runs.disk import RunDir
runs = RunDir.open(Path(sys.argv[1]), 1 << 30)
size = int(sys.argv[2])
stall_at = int(sys.argv[3])  # the put whose first write stops half way (0: never)
i = 0
if stall_at:
    import os, time
    real_write = os.write
    def write(fd, view):
        if i == stall_at:  # the kill lands here for certain: half of this file is written
            real_write(fd, view[: len(view) // 2])
            print("stalled", flush=True)
            time.sleep(600)
        return real_write(fd, view)
    os.write = write
print("ready", flush=True)
while True:
    i += 1
    runs.put("victim", i.to_bytes(8, "little") * (size // 8))
"""


def _whole(data: bytes, size: int) -> bool:
    """A file the writer wrote completely: its counter repeated ``size // 8`` times."""
    return len(data) == size and data == data[:8] * (size // 8)


def test_a_writer_killed_mid_write_leaves_nothing_half_written(tmp_path: Path) -> None:
    size = 8 << 20
    leftovers = 0
    for round_ in range(5):  # rounds 0-1 stall a write half way (first put, then a replacing put)
        proc = _python(WRITER, str(tmp_path), str(size), str(round_ + 1 if round_ < 2 else 0))
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr
        if round_ < 2:
            assert proc.stdout.readline().strip() == "stalled", proc.stderr
        else:  # a kill wherever it lands
            time.sleep(0.15 + 0.1 * round_)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        temps = [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]
        leftovers += len(temps)
        runs = RunDir(tmp_path, 1 << 30)  # a reader that has not cleaned anything yet
        data = runs.get("victim")
        assert data is None or _whole(data, size), (round_, None if data is None else len(data))
        assert runs.ids() in ([], ["victim"])  # a temporary is never a run
        reopened = RunDir.open(tmp_path, 1 << 30)  # cleans what the dead writer left
        assert not [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)]
        data = reopened.get("victim")
        assert data is None or _whole(data, size)
    assert leftovers >= 2  # the stalled rounds' kills did land mid-write


CLAIMER = """
import sys, time
from pathlib import Path
from attnscope.model.runs.disk import RunDir
runs = RunDir.open(Path(sys.argv[1]), 1 << 20)
go = Path(sys.argv[2])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
with runs.claim("shared") as mine:
    print("got" if mine else "not", flush=True)
    time.sleep(2.0)
"""


def test_two_processes_claiming_one_run_exactly_one_gets_it(tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [_python(CLAIMER, str(tmp_path / "runs"), str(go)) for _ in range(3)]
    for p in procs:  # every process is waiting for the start
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    answers = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert answers == ["got", "not", "not"], [p.returncode for p in procs]
    runs = RunDir.open(tmp_path / "runs", 1 << 20)
    with runs.claim("shared") as mine:  # released when its holder finished
        assert mine
        with runs.claim("shared") as again:  # exclusive within one process too
            assert not again


WRITERS = """
import sys
from pathlib import Path
from attnscope.model.runs.disk import RunDir
runs = RunDir.open(Path(sys.argv[1]), 20_000)
for i in range(150):
    runs.put(f"{sys.argv[2]}{i}", bytes(1000))
    runs.get(f"{sys.argv[2]}{i // 2}")
print("done", flush=True)
"""


def test_several_processes_write_and_evict_at_once(tmp_path: Path) -> None:
    procs = [_python(WRITERS, str(tmp_path), prefix) for prefix in ("a", "b", "c")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [o[0].strip() for o in outs] == ["done"] * 3, [o[1][-500:] for o in outs]
    runs = RunDir.open(tmp_path, 20_000)
    assert 0 < runs.nbytes <= 20_000 and len(runs.ids()) == runs.nbytes // 1000


def test_an_unwritable_directory_is_said_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RunDirError) as caught:
        RunDir.open(blocker / "runs", 1 << 20)  # under a regular file: refused even for root
    message = str(caught.value)
    assert "\n" not in message and str(blocker / "runs") in message and "Not a directory" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a 0o500 directory's mode; covered above "
                                              "by a path under a regular file")
def test_a_read_only_directory_is_said_in_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(RunDirError, match="Permission denied") as caught:
            RunDir.open(ro, 1 << 20)
        assert str(ro) in str(caught.value) and "\n" not in str(caught.value)
    finally:
        ro.chmod(0o700)
