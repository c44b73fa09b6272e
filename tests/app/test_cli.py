"""The console script: serve prints its URL, a broken model exits non-zero, analyze --json."""

from __future__ import annotations

import json
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
    assert run["format"] == "attnscope-run/2" and len(run["attention"]) == 2 and len(run["attention"][0]) == 4
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


def test_the_wheel_installs_under_one_name_and_serves_from_any_folder(tmp_path: Path) -> None:
    """`pip wheel .` prints no packaging warning and ships one top-level name, attnscope (app, model,
    static/, templates/ and the bundled model inside it: a user's own model.py or app.py shadows
    nothing). Installed into an empty target folder, it serves the bundled model, its pages and its
    scripts from a folder that holds a model.py and an app.py of its own. Built from a copy of the
    sources, so that setuptools' build folder never lands in the checkout."""
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
    for part in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert f"attnscope/model/bundled/attnscope-tiny/{part}" in names
    assert {"attnscope/__main__.py", "attnscope/app/routes/runs.py", "attnscope/model/services/engine.py",
            "attnscope/static/js/main.js", "attnscope/static/i18n/zh.js", "attnscope/static/css/app.css",
            "attnscope/templates/index.html"} <= names

    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "work"  # a user's project folder, with modules named like ours
    work.mkdir()
    (work / "model.py").write_text("raise SystemExit('the user model.py was imported')\n")
    (work / "app.py").write_text("raise SystemExit('the user app.py was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1"}
    env.pop("ATTNSCOPE_MODELS", None)
    where = subprocess.run([sys.executable, "-c", "import attnscope; print(attnscope.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(target)), where  # the wheel's copy, not the checkout's
    door = subprocess.run([sys.executable, "-c", "import attnscope\n"
                           "scope = attnscope.Scope.from_pretrained('bundled:attnscope-tiny')\n"
                           "run = scope.run('the cat sat. the cat sat.')\n"
                           "print(tuple(run.attention(layer=4, head=0).shape), len(run.heads()))\n"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert door.returncode == 0, door.stderr[-2000:]  # the Python door, from the installed wheel alone
    shape = re.fullmatch(r"\((\d+), (\d+)\) 48", door.stdout.strip())  # an (n, n) head; 6 layers x 8 heads scored
    assert shape is not None and shape.group(1) == shape.group(2), door.stdout
    script = subprocess.run([str(target / "bin" / "attnscope"), "--help"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=120)  # the console script, as pip wrote it
    assert script.returncode == 0 and "serve" in script.stdout, script
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--port", str(port),
                               "--model", "attnscope-tiny"], cwd=work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        models = _models_when_up(port)
        assert [m["name"] for m in models if m["default"]] == ["attnscope-tiny"]
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert page.status_code == 200 and "attnscope" in page.text
        for path in ("/static/js/main.js", "/static/i18n/zh.js", "/static/css/app.css", "/learn", "/docs"):
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30).status_code == 200, path
        run = httpx.post(f"http://127.0.0.1:{port}/api/runs", json={"text": "The cat sat on the mat."}, timeout=60)
        assert run.status_code == 201, run.text
    finally:
        server.terminate()
        _out, err = server.communicate(timeout=30)
    assert "the user" not in err


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
    assert run["format"] == "attnscope-run/2" and run["model"] == "attnscope-tiny"
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
