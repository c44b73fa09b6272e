"""The floors stay apart: model/ knows nothing of HTTP (it imports no attnscope.app module), no route
module imports another route module (what routes share lives in app/errors.py, app/runjson.py,
app/settings.py), and benchmarks and the command line reach no route module either.

The engine's pipeline flows forward, read from the import graph (imports inside functions and under
TYPE_CHECKING count too): each package of model/ imports only packages before it in ``ORDER``, the
capture neither runs nor scores, nothing in the engine imports the package's front (``attnscope``), a route
reaches the engine through its services, errors and result types only, and
no module of model/, app/ or the front is on an import circle. Each rule is also shown to fail on a
back-edge planted in a copy of the graph."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


# model/'s packages in the order data flows; a package may import those before it (and the leaves)
LEAVES = ("attnscope.model", "attnscope.model.errors", "attnscope.model.compat")
ORDER = ("attention", "families", "load", "capture", "scores", "results", "runs", "tools", "survey", "learn", "services")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["attnscope", *parts]) if parts[0] != "attnscope" else ".".join(parts)


def graph() -> dict[str, set[str]]:
    """module -> the attnscope modules it imports (a name imported from a module counts as that module)."""
    files = {module_name(p): p for top in ("model", "app", "attnscope") for p in (ROOT / top).rglob("*.py")
             if not p.is_symlink() and "__pycache__" not in p.parts}
    files = {m: p for m, p in files.items() if not (m.startswith("attnscope.") and m.split(".")[1] in
                                                     ("static", "templates"))}
    return {m: {n for n in imports(p) if n in files and n != m} for m, p in files.items()}


def floor(module: str) -> int | None:
    """The index in ORDER of a model/ module's package; None for the leaves and outside model/."""
    parts = module.split(".")
    if module in LEAVES or len(parts) < 3 or parts[1] != "model":
        return None
    return ORDER.index(parts[2].removesuffix(".py"))


def back_edges(g: dict[str, set[str]]) -> list[str]:
    found = []
    for m, deps in g.items():
        for d in deps:
            if d == "attnscope" and m.startswith("attnscope.model"):
                found.append(f"{m} imports the package's front")
            a, b = floor(m), floor(d)
            if a is not None and b is not None and b > a:
                found.append(f"{m} ({ORDER[a]}) imports {d} ({ORDER[b]})")
            if m.startswith("attnscope.model.capture") and d.startswith(("attnscope.model.runs",
                                                                           "attnscope.model.scores")):
                found.append(f"{m}: the capture imports {d}")
    return sorted(set(found))


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_every_engine_package_is_in_the_order() -> None:
    packages = {p.name for p in (ROOT / "model").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in (ROOT / "model").glob("*.py") if p.stem != "__init__"}
    assert packages | (modules - {m.split(".")[-1] for m in LEAVES}) == set(ORDER)


def test_the_pipeline_flows_forward() -> None:
    g = graph()
    assert len(g) > 80 and "attnscope.model.capture.forward" in g
    assert back_edges(g) == []


def test_no_module_is_on_an_import_circle() -> None:
    assert circles(graph()) == []


@pytest.mark.parametrize(("source", "target"), [
    ("attnscope.model.capture.forward", "attnscope.model.scores.analysis"),  # scoring inside the capture
    ("attnscope.model.attention.kept", "attnscope.model.runs.record"),  # a lower floor reaching up
    ("attnscope.model.services.scope", "attnscope"),  # the engine importing the package's front
])
def test_a_planted_back_edge_is_found(source: str, target: str) -> None:
    g = {m: set(d) for m, d in graph().items()}
    g[source].add(target)
    assert back_edges(g), (source, target)


def test_a_planted_circle_is_found() -> None:
    g = {m: set(d) for m, d in graph().items()}
    g["attnscope.model.runs.record"].add("attnscope.model.runs.runfile")
    g["attnscope.model.runs.runfile"].add("attnscope.model.runs.record")
    assert ["attnscope.model.runs.record", "attnscope.model.runs.runfile"] in circles(g)


def route_reaches(path: Path) -> list[str]:
    """What a route module imports from the engine besides its services, its errors and result types (names
    that are dataclasses: what a service returns or takes)."""
    import dataclasses
    import importlib

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnscope.model"):
            if node.module.startswith(("attnscope.model.services", "attnscope.model.errors")):
                continue
            module = importlib.import_module(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names
                      if not (isinstance(getattr(module, a.name, None), type)
                              and dataclasses.is_dataclass(getattr(module, a.name)))]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("attnscope.model")]
    return found


def test_routes_reach_the_engine_through_its_services() -> None:
    routes = sorted((ROOT / "app" / "routes").glob("*.py"))
    assert len(routes) >= 5
    assert {str(p.relative_to(ROOT)): route_reaches(p) for p in routes if route_reaches(p)} == {}


def test_a_route_reaching_past_the_services_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from attnscope.model.runs.tile_store import OVERVIEW, Tiles\n"
                       "from attnscope.model.runs.record import RunRecord\n", encoding="utf-8")
    assert route_reaches(planted) == ["attnscope.model.runs.tile_store.OVERVIEW",
                                      "attnscope.model.runs.tile_store.Tiles"]


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
