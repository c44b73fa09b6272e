"""Write measured tables into markdown files between <!-- key:start/end --> markers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch


def write_section(path: Path, key: str, body: str, command: str) -> None:
    """Replace the block between the markers (or append it), keeping the rest of the file."""
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    block = (f"{start}\n_Measured {time.strftime('%Y-%m-%d')} with `{command}` "
             f"({torch.get_num_threads()} torch threads, torch {torch.__version__})._\n\n{body}\n{end}")
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in old:
        head, rest = old.split(start, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.write_text(new, encoding="utf-8")


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the header's columns, then one line a row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def publish(lines: list[str], write: Path | None, key: str, command: str) -> None:
    """Print a benchmark's table and, with ``--write``, put it in that file's ``key`` section."""
    text = "\n".join(lines)
    sys.stdout.write(text + "\n")
    if write is not None:
        write_section(write, key, text, command)
