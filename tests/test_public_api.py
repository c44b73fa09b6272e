"""attnscope reaches torch and transformers through public names only (issue #35).

The shipped code (model/, app/, attnscope/) imports no underscore name from either library, reads no
underscore attribute of their modules or objects, and calls no private ``torch.ops`` kernel — except in
``model/compat.py``, where each such name is listed, says why no public name serves, and has a public
fallback (tested in tests/model/attention/test_interface.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("torch", "transformers")
COMPAT = ROOT / "model" / "compat.py"
# every private name compat.py may touch, each named in its docstring with its reason and fallback
ALLOWED_IN_COMPAT = {"_attn_implementation", "_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_efficient_attention"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def shipped_files() -> list[Path]:
    files = [*sorted((ROOT / "model").rglob("*.py")), *sorted((ROOT / "app").rglob("*.py"))]
    files += sorted(p for p in (ROOT / "attnscope").glob("*.py"))  # the package front (app/ and model/ are mapped into it)
    return [p for p in files if "__pycache__" not in p.parts]


def own_names() -> set[str]:
    """Every name the shipped code itself defines or assigns (its own ``_private`` helpers and fields)."""
    names: set[str] = set()
    for path in shipped_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def findings(path: Path, own: set[str]) -> list[str]:
    """What in this file reaches a private library name: 'line: what'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    library_aliases: set[str] = set()  # local names bound to torch / transformers modules
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    library_aliases.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        out.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            if any(_private(part) for part in node.module.split(".")):
                out.append(f"{node.lineno}: from {node.module}")
            out.extend(f"{node.lineno}: from {node.module} import {alias.name}"
                       for alias in node.names if _private(alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue  # our own classes' fields
            chain = base
            while isinstance(chain, ast.Attribute):
                chain = chain.value
            if isinstance(chain, ast.Name) and chain.id in library_aliases:
                out.append(f"{node.lineno}: {ast.unparse(node)}")  # torch.ops.aten._x, transformers.y._z
            elif node.attr not in own:
                out.append(f"{node.lineno}: .{node.attr} (an attribute attnscope does not define)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and node.args[1].value not in own):
            out.append(f"{node.lineno}: {node.func.id}(…, {node.args[1].value!r})")
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str) and _private(node.value.value)
              and node.value.value in ALLOWED_IN_COMPAT):
            out.append(f"{node.lineno}: the name {node.value.value!r} kept in a constant")
    return sorted(out, key=lambda line: int(line.split(":")[0]))


def test_no_private_torch_or_transformers_name_outside_compat() -> None:
    own = own_names() - ALLOWED_IN_COMPAT
    found = {str(p.relative_to(ROOT)): f for p in shipped_files() if p != COMPAT and (f := findings(p, own))}
    assert not found, found


def test_compat_touches_only_the_listed_names_and_says_why() -> None:
    own = own_names() - ALLOWED_IN_COMPAT
    text = COMPAT.read_text(encoding="utf-8")
    named = {part for line in findings(COMPAT, own) for part in ALLOWED_IN_COMPAT if part in line}
    assert named == ALLOWED_IN_COMPAT  # each is used there (else drop it from the list)
    leftover = [line for line in findings(COMPAT, own) if not any(part in line for part in ALLOWED_IN_COMPAT)]
    assert not leftover, leftover
    doc = ast.get_docstring(ast.parse(text)) or ""
    for name in ALLOWED_IN_COMPAT:
        assert name in doc, f"model/compat.py's docstring must say why it needs {name} and what stands in for it"
    assert "fallback" in doc.lower()


def test_the_scan_finds_what_it_is_for(tmp_path: Path) -> None:
    """The checks above would catch each kind of private name (else they pass vacuously)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\n"
        "import transformers.utils._hidden\n"
        "from transformers.utils.output_capturing import _active_collector\n"
        "from transformers._private import thing\n"
        "out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(1)\n"
        "impl = model.config._attn_implementation\n"
        "q = module._split_heads(x)\n"
        "v = getattr(config, '_attn_implementation', None)\n"
        "self._mine = 1\n", encoding="utf-8")
    got = findings(sample, own={"_mine"})
    assert [line.split(":")[0] for line in got] == ["2", "3", "4", "5", "6", "7", "8"], got


def test_the_top_level_names_every_export_and_the_bundled_folder() -> None:
    """``attnscope.X`` for the doors and every result type a script meets, without deep imports; __all__ and
    the lazy table agree, and each name is the engine's own class."""
    import attnscope
    from attnscope.model.tools.ablation import Ablation

    assert set(attnscope.__all__) == {*attnscope._EXPORTS, "BUNDLED", "__version__", "load", "save_html", "show"}
    for name in attnscope._EXPORTS:
        assert getattr(attnscope, name).__name__ == name
    assert attnscope.Ablation is Ablation
    assert (attnscope.BUNDLED / "config.json").is_file()
