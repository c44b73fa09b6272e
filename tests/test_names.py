"""Names that are true: every dotted ``attnscope.``/``model.``/``app.`` path written in the shipped code's
strings (docstrings, OpenAPI summaries and descriptions, error messages) and in the benchmarks' and scripts'
names a module or an attribute that exists; no module is imported under another module's name."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("model", "app", "attnscope")
READ = (*SHIPPED, "bench", "scripts")
PATH = re.compile(r"(?<![\w./-])((?:attnscope\.)?(?:model|app)\.[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
# dotted words that are not our modules: file names, FastAPI's request.app.state, and the submodule
# paths of transformers' models that the family table names (checked against real models in tests/model)
NOT_OURS = re.compile(r"\.(py|css|js|json|safetensors|gguf)$|^app\.state$|^model\.(decoder|layers|norm|final_layernorm)\b")


def sources() -> list[Path]:
    return sorted(p for top in READ for p in (ROOT / top).rglob("*.py")
                  if not any(part.is_symlink() for part in [p, *p.parents]) and "__pycache__" not in p.parts)


def resolves(name: str) -> bool:
    """Does ``name`` (``model.x.y`` read as ``attnscope.model.x.y``) import, as a module or a module's attribute?"""
    parts = (name if name.startswith("attnscope.") else f"attnscope.{name}").split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def written_paths() -> dict[str, list[str]]:
    """Every dotted path in a string constant, with where it is written."""
    found: dict[str, list[str]] = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in PATH.finditer(node.value):
                    name = m.group(1)
                    if not NOT_OURS.search(name):
                        found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_dotted_path_in_the_code_resolves() -> None:
    found = written_paths()
    assert len(found) > 40  # the scan sees the docstrings
    gone = {name: where[:3] for name, where in found.items() if not resolves(name)}
    assert not gone, gone


def test_a_path_that_is_gone_is_caught() -> None:
    assert resolves("model.scores.pairs.InductionPairs") and resolves("attnscope.app.routes.runs")
    assert not resolves("model.late_scores") and not resolves("model.runs.record.RunStore.nothing")


def test_no_module_is_imported_under_another_name() -> None:
    """``from attnscope.model.x import y as z`` where y is a module: z is y or y with a role (``generate_service``),
    never another module's name (``interface as capture`` once kept a name from before a regrouping)."""
    wrong = []
    for path in [*sources(), *sorted((ROOT / "tests").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnscope")):
                continue
            for alias in node.names:
                module = f"{node.module}.{alias.name}"
                if alias.asname and importlib.util.find_spec(node.module) and _is_module(module) \
                        and not alias.asname.startswith(f"{alias.name}_"):
                    wrong.append(f"{path.relative_to(ROOT)}: {alias.name} as {alias.asname}")
    assert not wrong, wrong


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
