"""The console script: serve prints its URL, a broken model exits non-zero, analyze --json."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from attnscope.app import svg_export
from attnscope.app.encoding import rows_from_f32_base64
from tests.support.servers import free_port


def _env(models: dict[str, str], default: str) -> dict[str, str]:
    return {**os.environ, "ATTNSCOPE_MODELS": json.dumps(models), "ATTNSCOPE_DEFAULT_MODEL": default,
            "HF_HUB_OFFLINE": "1"}



def _models_when_up(port: int) -> list[dict[str, object]]:
    """/api/models of a server started on ``port``, once it answers (at most 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            models: list[dict[str, object]] = httpx.get(f"http://127.0.0.1:{port}/api/models", timeout=5).json()["models"]
            return models
        except httpx.TransportError:
            assert time.monotonic() < deadline, "server never answered"
            time.sleep(0.2)

def test_serve_with_a_broken_model_exits_with_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "attnscope", "serve", "--port", str(free_port())],
                          env=_env({"bad": str(broken)}, "bad"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("attnscope: model 'bad' could not be loaded")


def test_serve_missing_folder(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "attnscope", "serve", "--port", str(free_port())],
                          env=_env({"gone": str(tmp_path / "nowhere")}, "gone"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "does not exist" in proc.stderr.strip().splitlines()[-1]


def test_serve_prints_url_and_answers(tiny_dirs: dict[str, Path]) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--port", str(port)],
                            env=_env({"tiny": str(tiny_dirs["gpt2"])}, "tiny"), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line
        models = _models_when_up(port)
        assert models[0]["name"] == "tiny" and models[0]["default"]
        r = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=30)
        assert r.status_code == 200 and "server" not in r.headers  # no "server: uvicorn"
        local = httpx.get(f"http://localhost:{port}/api/health", timeout=30)
        assert local.status_code == 200
        rebound = httpx.get(f"http://127.0.0.1:{port}/api/health", headers={"host": f"evil.example:{port}"}, timeout=30)
        assert rebound.status_code == 400 and "server" not in rebound.headers
        assert "ATTNSCOPE_ALLOWED_HOSTS" in rebound.json()["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_analyze_json(tiny_dirs: dict[str, Path]) -> None:
    proc = subprocess.run([sys.executable, "-m", "attnscope", "analyze", "dog bites man", "--json"],
                          env=_env({"tiny": str(tiny_dirs["gpt2"])}, "tiny"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert "".join(t["text"] for t in run["tokens"]) == "dog bites man"
    assert len(run["predictions"]) == len(run["tokens"])


def test_export_run_to_svg(client_for_export: tuple, tmp_path: Path) -> None:
    client, run_id = client_for_export
    body = client.get(f"/api/runs/{run_id}/export")
    assert body.status_code == 200 and "attachment" in body.headers["content-disposition"]
    run = body.json()
    n = len(run["tokens"])
    assert run["format"] == "attnscope-json/1" and len(run["attention"]) == 2 and len(run["attention"][0]) == 4
    head = rows_from_f32_base64(run["attention"][1][3], n, causal=True)
    assert [len(r) for r in head] == list(range(1, n + 1))
    exact = client.get(f"/api/runs/{run_id}/attention", params={"layer": 1, "head": 3, "format": "f32"})
    assert exact.headers["x-attn-encoding"] == "f32"
    cells = np.frombuffer(exact.content, dtype="<f4")
    assert [v for r in head for v in r] == cells.astype(np.float64).tolist()  # the export keeps every float32 bit
    path = tmp_path / "run.json"
    path.write_bytes(body.content)
    out = tmp_path / "head.svg"
    proc = subprocess.run([sys.executable, "-m", "attnscope", "export", str(path), "--layer", "1", "--head", "3", "--svg", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == n * n + 1  # cells + the hatch pattern tile
    assert "&lt;" in svg and "<b>" not in svg and "</b>" not in svg  # token text is escaped
    bad = subprocess.run([sys.executable, "-m", "attnscope", "export", str(path), "--layer", "9", "--head", "0", "--svg", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "out of range" in bad.stderr


@pytest.fixture
def client_for_export(client):
    run = client.post("/api/runs", json={"text": "bold <b>text</b> here"}).json()
    return client, run["run_id"]


def test_serve_model_name_equals_source_serves_exactly_those(tiny_dirs: dict[str, Path]) -> None:
    port = free_port()
    args = ["--model", f"first={tiny_dirs['llama']}", "--model", f"second={tiny_dirs['gpt2']}"]
    proc = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--port", str(port), *args],
                            env=_env({"other": "bundled:attnscope-tiny"}, "other"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert "serving first" in proc.stdout.readline()
        models = _models_when_up(port)
        assert [(m["name"], m["default"], m["family"]) for m in models] == [("first", True, "llama"),
                                                                           ("second", False, "gpt2")]
        assert models[0]["device"] == "cpu" and models[0]["dtype"] == "float32"
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert "loading model 1/2: first" in err and "loaded second" in err  # progress in the terminal


def test_serve_hub_id_without_network_fails_in_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "attnscope", "serve", "--port", str(free_port()),
                           "--model", "qwen=Qwen/Qwen2.5-0.5B-Instruct"], env=_env({}, "x"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("attnscope: model 'qwen':") and "hub could not be reached" in last


def test_model_overrides() -> None:
    from attnscope.app.cli import model_overrides

    assert model_overrides(["a=bundled:x", "b=/m"]) == {"models": {"a": "bundled:x", "b": "/m"}, "default_model": "a"}
    assert model_overrides(["a=bundled:x", "b=/m", "b"])["default_model"] == "b"
    assert model_overrides(["tiny"]) == {"default_model": "tiny"}
    with pytest.raises(ValueError, match="NAME=SOURCE"):
        model_overrides(["=x"])


def test_svg_masks_cells_with_the_browsers_grey() -> None:
    """One masked-cell grey: app.css defines it for the browser, the SVG export uses the same."""
    css = (Path(__file__).resolve().parents[2] / "static" / "css" / "app.css").read_text(encoding="utf-8")
    assert re.search(r"--masked:\s*(#[0-9a-f]{6})", css).group(1) == svg_export.MASKED
    assert re.search(r"--mask-hatch:\s*(#[0-9a-f]{6})", css).group(1) == svg_export.MASK_HATCH
    svg = svg_export.heatmap_svg([[1.0], [0.5, 0.5]], ["a", "b"], causal=True, title="t")
    assert f'fill="{svg_export.MASKED}"' in svg and 'fill="url(#mask)"' in svg


def _wheel_pythons() -> list[str]:
    """The interpreters the wheel is tried on: ATTNSCOPE_WHEEL_PYTHONS (paths joined by os.pathsep; the
    second environment of .ci/run names 3.13 and 3.12), else the one running the tests."""
    listed = os.environ.get("ATTNSCOPE_WHEEL_PYTHONS", "")
    return [p for p in listed.split(os.pathsep) if p] or [sys.executable]


def _build_wheel(tmp_path: Path) -> Path:
    """`pip wheel .` from a copy of the sources (setuptools' build folder never lands in the checkout);
    no packaging warning; one top-level name, attnscope; nothing but what a user needs."""
    import shutil
    import zipfile

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    for folder in ("app", "model", "static", "templates", "attnscope"):  # attnscope/ links to the others
        shutil.copytree(root / folder, src / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path / "whl"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    output = (proc.stdout + proc.stderr).replace(str(tmp_path), "TMP")  # the folder's name holds "warn"
    assert "warn" not in output.lower() and "absent from the `packages`" not in output, output
    (wheel,) = (tmp_path / "whl").glob("attnscope-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"attnscope", wheel.name.removesuffix("-py3-none-any.whl") + ".dist-info"}
    for part in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert f"attnscope/model/bundled/attnscope-tiny/{part}" in names
    assert {"attnscope/__main__.py", "attnscope/app/routes/runs.py", "attnscope/model/services/engine.py",
            "attnscope/static/js/main.js", "attnscope/static/i18n/zh.js", "attnscope/static/css/app.css",
            "attnscope/templates/index.html"} <= names
    # lean: the training record, its plot, the corpus list and the model card's measurements stay in the
    # repository (the app reads none of them); no test, bench or script file ships
    for left in ("training.json", "training_curve.png", "corpus.json", "measurements.json"):
        assert f"attnscope/model/bundled/attnscope-tiny/{left}" not in names
    assert not [n for n in names if n.split("/")[1] in ("tests", "bench", "scripts", "docs", "examples")]
    assert wheel.stat().st_size < 40_000_000  # README "Set up": the bundled model's float32 weights are most of it
    return wheel


def _pinned_torch(tmp_path: Path) -> Path:
    """A pip constraints file holding torch at the release running these tests (the dev venv's CPU build,
    the second environment's newest): pip resolves every other dependency itself, and never swaps the
    user's torch for another build (as a researcher's CUDA torch would not be)."""
    from importlib.metadata import version

    path = tmp_path / "constraints.txt"
    path.write_text(f"torch=={version('torch')}\n", encoding="utf-8")
    return path


def _user_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A user's project folder, with modules named like ours, and an environment that finds no checkout."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.py").write_text("raise SystemExit('the user model.py was imported')\n")
    (work / "app.py").write_text("raise SystemExit('the user app.py was imported')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "PYTHON", "VIRTUAL_ENV"))}
    env["HF_HUB_OFFLINE"] = "1"
    return work, env


def _check_installed(bin_dir: Path, work: Path, env: dict[str, str], site: str) -> None:
    """The installed wheel alone: its import, the Python door, the console script (analyze), the
    README's Python example and a served app, from a folder that shadows app and model."""
    python = str(bin_dir / "python")
    where = subprocess.run([python, "-c", "import attnscope; print(attnscope.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and site in where.stdout, where  # the venv's copy, not the checkout's
    door = subprocess.run([python, "-c", "import attnscope\n"
                           "scope = attnscope.Scope.from_pretrained('bundled:attnscope-tiny')\n"
                           "run = scope.run('the cat sat. the cat sat.')\n"
                           "print(tuple(run.attention(layer=4, head=0).shape), len(run.heads()))\n"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert door.returncode == 0, door.stderr[-2000:]  # the Python door, from the installed wheel alone
    shape = re.fullmatch(r"\((\d+), (\d+)\) 48", door.stdout.strip())  # an (n, n) head; 6 layers x 8 heads scored
    assert shape is not None and shape.group(1) == shape.group(2), door.stdout
    script = subprocess.run([str(bin_dir / "attnscope"), "analyze", "dog bites man", "--json"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=300)  # the console script, as the installer wrote it
    assert script.returncode == 0, script.stderr[-2000:]
    run = json.loads(script.stdout)
    assert "".join(t["text"] for t in run["tokens"]) == "dog bites man" and len(run["attention"]) == 6
    from tests.model.test_readme_python import readme_example

    (work / "example.py").write_text(readme_example(), encoding="utf-8")
    example = subprocess.run([python, "example.py"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert example.returncode == 0 and "most inductive head: L4H0" in example.stdout, example.stderr[-2000:]
    port = free_port()
    server = subprocess.Popen([python, "-m", "attnscope", "serve", "--port", str(port), "--model", "attnscope-tiny"],
                              cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        models = _models_when_up(port)
        assert [m["name"] for m in models if m["default"]] == ["attnscope-tiny"]
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert page.status_code == 200 and "attnscope" in page.text
        for path in ("/static/js/main.js", "/static/i18n/zh.js", "/static/css/app.css", "/learn", "/docs"):
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30).status_code == 200, path
        posted = httpx.post(f"http://127.0.0.1:{port}/api/runs", json={"text": "The cat sat on the mat."}, timeout=60)
        assert posted.status_code == 201, posted.text
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
    assert "the user" not in err


def test_the_wheel_installs_under_one_name_and_serves_from_any_folder(tmp_path: Path) -> None:
    """The wheel, installed by pip *with its dependencies resolved* into a fresh venv of each interpreter
    (_wheel_pythons: 3.13 and 3.12 in .ci/run's second environment), passes `pip check` and serves the
    bundled model, runs `attnscope analyze` and the README's Python example, from a folder that holds a
    model.py and an app.py of its own. With ATTNSCOPE_WHEEL_UV=1 the same holds for `uv pip install` and
    `uv run` in a uv project. Every venv is removed afterwards (each holds a torch)."""
    import shutil

    wheel = _build_wheel(tmp_path)
    constraints = _pinned_torch(tmp_path)
    work, env = _user_folder(tmp_path)
    for n, python in enumerate(_wheel_pythons()):
        venv = tmp_path / f"venv{n}"
        try:
            made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
            assert made.returncode == 0, made.stderr
            pip = [str(venv / "bin" / "python"), "-m", "pip"]
            started = time.monotonic()
            got = subprocess.run([*pip, "install", "-q", "-c", str(constraints), str(wheel)], env=env,
                                 capture_output=True, text=True, timeout=1800)
            assert got.returncode == 0, got.stderr[-3000:]
            logging.getLogger(__name__).info("%s: pip install of the wheel with its dependencies took %.0f s", python,
                                             time.monotonic() - started)
            check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=300)
            assert check.returncode == 0, check.stdout + check.stderr  # nothing installed conflicts
            _check_installed(venv / "bin", work, env, str(venv))
            if n:
                continue  # the notebook extra once, on the first interpreter
            # the notebook extra beside JupyterLab 4 and ipykernel (what VS Code's notebook kernels run)
            got = subprocess.run([*pip, "install", "-q", "-c", str(constraints), f"{wheel}[notebook]", "jupyterlab>=4",
                                  "ipykernel"], env=env, capture_output=True, text=True, timeout=1800)
            assert got.returncode == 0, got.stderr[-3000:]
            check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=300)
            assert check.returncode == 0, check.stdout + check.stderr
            widget = subprocess.run([str(venv / "bin" / "python"), "-c",
                                     "import anywidget, jupyterlab, attnscope\n"
                                     "from attnscope.app.notebook import Explorer\n"
                                     "assert issubclass(Explorer, anywidget.AnyWidget)\n"
                                     "print(jupyterlab.__version__)"], cwd=work, env=env, capture_output=True,
                                    text=True, timeout=300)
            assert widget.returncode == 0 and widget.stdout.startswith("4."), widget.stderr[-2000:]
        finally:
            shutil.rmtree(venv, ignore_errors=True)
    if os.environ.get("ATTNSCOPE_WHEEL_UV") == "1":
        _check_uv(wheel, constraints, _wheel_pythons()[0], tmp_path, work, env)


def _check_uv(wheel: Path, constraints: Path, python: str, tmp_path: Path, work: Path, env: dict[str, str]) -> None:
    """`uv pip install` of the wheel into a uv venv, and `uv run` of the console script in a uv project
    that added the wheel: uv resolves everything itself (it reads none of pip's settings), on the given
    interpreter (UV_PYTHON_DOWNLOADS=never: a user's own Python, never one uv would fetch)."""
    import shutil

    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    env = {**env, "UV_PYTHON_DOWNLOADS": "never"}
    venv, project = tmp_path / "uv-venv", tmp_path / "uv-project"

    def uv_ok(*args: str, cwd: Path | None = None) -> str:
        done = subprocess.run([uv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, (args, done.stderr[-3000:])
        return done.stdout

    def analysed(out: str) -> None:
        assert "".join(t["text"] for t in json.loads(out)["tokens"]) == "dog bites man"

    try:
        uv_ok("venv", "-q", "--python", python, str(venv))
        uv_ok("pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-c", str(constraints), str(wheel))
        uv_ok("pip", "check", "--python", str(venv / "bin" / "python"))
        script = subprocess.run([str(venv / "bin" / "attnscope"), "analyze", "dog bites man", "--json"], cwd=work,
                                env=env, capture_output=True, text=True, timeout=300)
        assert script.returncode == 0, script.stderr[-2000:]
        analysed(script.stdout)
        project.mkdir()
        uv_ok("init", "-q", "--bare", "--python", python, str(project))
        uv_ok("add", "-q", "--python", python, "--project", str(project), str(wheel))
        analysed(uv_ok("run", "-q", "--python", python, "--project", str(project), "attnscope", "analyze",
                       "dog bites man", "--json", cwd=work))
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)


def test_readme_cli_sequence_runs_as_written(tmp_path: Path) -> None:
    """The README's shell lines (analyze --json into run.json, then export a head of it) run as they
    are written, on the default (bundled) model, in a fresh folder."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.startswith(".venv/bin/attnscope ")]
    assert [line.split()[1] for line in lines] == ["analyze", "export"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSCOPE_")}
    env["HF_HUB_OFFLINE"] = "1"
    for line in lines:
        command = line.split("#")[0].replace(".venv/bin/attnscope", f"{sys.executable} -m attnscope", 1)
        proc = subprocess.run(command, shell=True, cwd=tmp_path, env={**env, "PYTHONPATH": str(Path.cwd())},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stderr}"
    run = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert run["format"] == "attnscope-json/1" and run["model"] == "attnscope-tiny"
    assert "".join(t["text"] for t in run["tokens"]) == "dog bites man"
    n = len(run["tokens"])
    head = rows_from_f32_base64(run["attention"][2][5], n, causal=True)
    assert [len(r) for r in head] == list(range(1, n + 1))
    svg = (tmp_path / "head.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "layer 2 head 5" in svg


def test_export_of_a_run_without_attention_says_how_to_save_one(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"tokens": [], "model": "m"}), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "attnscope", "export", str(path), "--layer", "0", "--head", "0",
                           "--svg", str(tmp_path / "x.svg")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "holds no attention" in proc.stderr and "--json > run.json" in proc.stderr
