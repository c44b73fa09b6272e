"""The floors stay apart: model/ knows nothing of HTTP (it imports no attnscope.app module), no route
module imports another route module (what routes share lives in app/errors.py, app/runjson.py,
app/settings.py), and benchmarks and the command line reach no route module either."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_model_imports_nothing_from_the_http_door() -> None:
    for path in sorted((ROOT / "model").rglob("*.py")):
        assert not {n for n in imports(path) if n.startswith(("attnscope.app", "app.", "fastapi"))}, path


def test_no_route_module_imports_another() -> None:
    # app/routes/__init__.py is the tree's root: it assembles the route modules into one router
    routes = sorted(p for p in (ROOT / "app" / "routes").glob("*.py") if p.name != "__init__.py")
    assert len(routes) >= 5
    for path in routes:
        assert not {n for n in imports(path) if n.startswith("attnscope.app.routes")}, path
    for path in [*sorted((ROOT / "bench").glob("*.py")), ROOT / "app" / "cli.py"]:
        assert not {n for n in imports(path) if n.startswith("attnscope.app.routes")}, path


def test_the_readme_draws_every_folder_of_the_tree() -> None:
    """README "How it is built": one line per folder of the source tree, the pipeline readable there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## How it is built"):]
    drawn = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]
    lines = {line.split()[0] for line in drawn.splitlines() if line.strip()}
    folders = {"model/", "app/", "templates/", "bench/", "scripts/"}
    for top in ("model", "app", "static", "tests"):
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT)
            if path.is_dir() and "__pycache__" not in rel.parts and rel.parts[:2] != ("model", "bundled"):
                folders.add(f"{rel.as_posix()}/")
    folders.add("model/bundled/")  # its model folders are data, drawn as one line
    assert folders <= lines, sorted(folders - lines)
