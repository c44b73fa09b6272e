"""Run a notebook headless with nbclient, in a kernel of this interpreter, and read what it showed.

The kernel is this process's own Python (``sys.executable``, the .venv's), whatever kernels the machine
has installed: its kernelspec is written into a folder of its own and the kernel manager looks only
there. It starts in the repository root (so ``tests.support`` imports) with the Hugging Face hub offline.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
import nbformat.v4
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
KERNEL = "python3"


def read(path: Path) -> nbformat.NotebookNode:
    """A notebook file, as nbformat 4."""
    nb: nbformat.NotebookNode = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    return nb


def notebook(sources: list[str]) -> nbformat.NotebookNode:
    """A notebook of these code cells, for the kernel below."""
    cells = [nbformat.v4.new_code_cell(source) for source in sources]  # type: ignore[no-untyped-call]
    nb: nbformat.NotebookNode = nbformat.v4.new_notebook(cells=cells, metadata={  # type: ignore[no-untyped-call]
        "kernelspec": {"name": KERNEL, "display_name": "Python 3 (ipykernel)", "language": "python"}})
    return nb


def kernel_manager(folder: Path) -> AsyncKernelManager:
    """A kernel manager whose only ``python3`` kernel runs ``sys.executable``."""
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}), encoding="utf-8")
    specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def execute(nb: nbformat.NotebookNode, *, timeout: int = 300) -> tuple[nbformat.NotebookNode, float]:
    """Every cell of ``nb`` run in order (it is changed in place: outputs, widget state in its
    metadata); raises ``nbclient.exceptions.CellExecutionError`` at the first cell that fails.
    Returns the notebook and the seconds it took, the kernel's start included."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnscope-kernel-") as folder:
        client = NotebookClient(nb, km=kernel_manager(Path(folder)), kernel_name=KERNEL, timeout=timeout,
                                resources={"metadata": {"path": str(ROOT)}})
        client.execute(env=env)
    return nb, time.perf_counter() - start


def outputs(nb: nbformat.NotebookNode) -> list[dict[str, Any]]:
    """Every output of every code cell, in order."""
    return [dict(out) for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def text(nb: nbformat.NotebookNode) -> str:
    """What the cells printed and returned as text, joined."""
    parts: list[str] = []
    for out in outputs(nb):
        if out["output_type"] == "stream":
            parts.append(str(out["text"]))
        elif out["output_type"] in ("execute_result", "display_data"):
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def errors(nb: nbformat.NotebookNode) -> list[str]:
    """The errors the cells raised, as ``ename: evalue`` (nbclient stops at the first)."""
    return [f"{out['ename']}: {out['evalue']}" for out in outputs(nb) if out["output_type"] == "error"]


def widget_views(nb: nbformat.NotebookNode) -> list[str]:
    """The model ids of the widgets the cells displayed."""
    return [str(out["data"][WIDGET_VIEW]["model_id"]) for out in outputs(nb)
            if out["output_type"] in ("execute_result", "display_data") and WIDGET_VIEW in out.get("data", {})]


def widget_state(nb: nbformat.NotebookNode, model_id: str) -> dict[str, Any]:
    """The synced state the kernel sent for one widget (nbclient keeps it in the notebook's metadata)."""
    states = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return dict(states[model_id]["state"])
