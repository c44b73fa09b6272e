"""Strict types over the shipped code as it is installed: ``python scripts/typecheck.py [mypy options]``.

The repository keeps ``app/``, ``model/``, ``static/`` and ``templates/`` at the top; pyproject.toml's
``package-dir`` installs them as ``attnscope.app``, ``attnscope.model``, ... Python finds them through the
editable install's import hook, which mypy cannot run, so this stages the package's Python files as the
wheel lays them out (``build/typecheck/attnscope/``: plain copies, no links) and runs mypy there with the
project's settings. Its findings name the repository's own files (``model/runs/record.py:12: ...``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "typecheck"
# the package's Python parts: where each lives in the repository -> where the wheel puts it
PARTS = {"attnscope": "attnscope", "app": "attnscope/app", "model": "attnscope/model"}


def stage() -> Path:
    """The package's .py files copied into STAGE (stale ones removed, times kept: mypy's cache stays warm)."""
    wanted: dict[Path, Path] = {}
    for source, target in PARTS.items():
        top = ROOT / source
        files = top.glob("*.py") if source == "attnscope" else top.rglob("*.py")
        for path in files:
            if "__pycache__" not in path.parts:
                wanted[STAGE / target / path.relative_to(top)] = path
    if STAGE.exists():
        for old in STAGE.rglob("*.py"):
            if old not in wanted:
                old.unlink()
    for copy, path in wanted.items():
        copy.parent.mkdir(parents=True, exist_ok=True)
        if not copy.exists() or copy.stat().st_mtime_ns != path.stat().st_mtime_ns:
            shutil.copy2(path, copy)
    return STAGE


def to_repository(line: str) -> str:
    """A finding's path in the staged copy -> the repository's file."""
    for source, target in sorted(PARTS.items(), key=lambda kv: -len(kv[1])):
        prefix = str(Path("build") / "typecheck" / target) + os.sep
        if line.startswith(prefix):
            return (f"{source}{os.sep}" if source != "attnscope" else f"attnscope{os.sep}") + line[len(prefix):]
    return line


def main(argv: list[str]) -> int:
    stage()
    args = argv or [str(Path("build") / "typecheck" / "attnscope")]
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        sys.stdout.write(to_repository(line) + "\n")
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
