"""What pyproject.toml claims is what .ci/run tests (issue #35): Python 3.11 and later, torch and
transformers with a floor and no upper bound, the floors the two environments install."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirement(name: str) -> Requirement:
    found = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, name
    return found[0]


def test_every_supported_python_may_install_it() -> None:
    python = SpecifierSet(PROJECT["requires-python"])
    for version in ("3.11.0", "3.12.1", "3.13.0", "3.14.0"):  # no upper bound: a new Python is not refused
        assert version in python, version
    assert "3.10.13" not in python


def test_torch_and_transformers_have_a_floor_and_no_upper_bound() -> None:
    for name in ("torch", "transformers"):
        spec = _requirement(name).specifier
        assert [s.operator for s in spec] == [">="], (name, str(spec))  # no <, <=, ==, ~=, !=


def test_the_floors_are_what_the_dev_venv_installs_and_the_second_environment_is_above_them() -> None:
    script = (ROOT / "scripts" / "dev.sh").read_text(encoding="utf-8")
    dev_torch = re.search(r'pip install -q "torch==([\d.]+)"', script)
    assert dev_torch is not None
    (torch_floor,) = _requirement("torch").specifier
    assert torch_floor.version == ".".join(dev_torch.group(1).split(".")[:2])  # the oldest tested is the floor
    newest = {Requirement(line.split("#")[0]).name: Requirement(line.split("#")[0])
              for line in (ROOT / "scripts" / "newest.txt").read_text(encoding="utf-8").splitlines()
              if line.split("#")[0].strip()}
    for name in ("torch", "transformers"):
        (floor,) = _requirement(name).specifier
        (top,) = newest[name].specifier
        assert top.operator == ">=" and Version(top.version) >= Version(floor.version), (name, top, floor)


def test_ci_runs_the_readme_command_then_the_second_environment() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("bash scripts/dev.sh")]
    assert commands == ["bash scripts/dev.sh test", "bash scripts/dev.sh newest"]


def test_dev_script_names_the_python_it_lacks_in_one_line(tmp_path: Path) -> None:
    """`pythons` lists 3.11-3.13; with none to be found (an empty PATH and no pyenv) each is one line
    that says how to get it."""
    done = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "dev.sh"), "pythons"], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["Python 3.11", "Python 3.12", "Python 3.13"]
    for line in lines:
        version = line.split()[1].rstrip(":")
        assert line.endswith(f"missing (pyenv install {version}, or put python{version} on PATH)") or "/" in line


def test_every_package_folder_is_mapped_and_listed() -> None:
    """pyproject's package-dir maps the top-level folders into attnscope (no symbolic links), and its package
    list names every folder that holds Python or shipped files, so the wheel carries the whole tree."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert config["package-dir"] == {"attnscope": "attnscope", "attnscope.app": "app", "attnscope.model": "model",
                                     "attnscope.static": "static", "attnscope.templates": "templates"}
    listed = set(config["packages"])
    for top in ("app", "model", "static", "templates"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            rel = folder.relative_to(ROOT)
            if "__pycache__" in rel.parts or (rel.parts[:2] == ("model", "bundled") and len(rel.parts) > 2):
                continue
            assert ".".join(["attnscope", *rel.parts]) in listed, rel


def test_no_symbolic_link_is_tracked() -> None:
    files = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t")[1] for line in files.splitlines() if line.startswith("120000")]
    assert links == []
