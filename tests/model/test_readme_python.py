"""The README's "Python" example runs as written, and type-checks under ``mypy --strict``: the
Python door's results are typed for a user's own code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Python: the model you already hold"):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "the README's Python section has no python block"
    return found.group(1)


def test_the_readme_python_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_example(), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "most inductive head: L4H0" in out  # the bundled model's induction head, found by its score
    assert "torch.Size([14, 14]) (4, 4)" in out
    restored = re.search(r"L4H0 restores (-?\d+)% of the clean logit difference", out)
    assert restored is not None and 20 <= int(restored.group(1)) <= 100, out
    terms = re.search(r"= sum of (\d+) terms \(\+ (\S+)\)", out)
    assert terms is not None and abs(float(terms.group(2))) < 1e-3, out


def test_the_readme_python_example_type_checks_strictly(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_example(), encoding="utf-8")
    # the project's mypy settings (strict) and its cache, warm after the gates' run; attnscope as the wheel
    # lays it out (scripts/typecheck.py stages it: app/ and model/ live at the top of the repository)
    from scripts.typecheck import stage

    env = {**os.environ, "MYPYPATH": str(stage())}
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(ROOT / ".mypy_cache"), str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
