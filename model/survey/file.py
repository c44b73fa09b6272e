"""A survey as one file: safetensors (never pickle) with a JSON header, like a run file.

Tensors: ``count``, ``mean``, ``m2`` (fields x layers x heads, float64: Welford's state, so a stopped survey
resumes exactly) and ``probe`` (layers x heads, the synthetic induction probe). The header (safetensors
metadata ``attnscope``) holds the format name, the model, the corpus's identity, the settings, the progress
and each head's examples. Written to a temporary file and renamed: a file on disk is whole or absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from attnscope.model.errors import BadInput
from attnscope.model.survey.stats import FIELDS, Accumulator, Example, Survey

FORMAT = "attnscope-survey/1"
MAX_FILE_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Header:
    model: str
    source: str | None
    corpus: str | None  # the corpus file's identity (size and a hash of its head), to resume only the same file
    max_tokens: int
    complete: bool
    probe: list[list[float]] | None


def corpus_id(path: str | Path) -> str:
    """The file's size and the SHA-256 of its first MiB: cheap, and enough to tell another file."""
    p = Path(path)
    with p.open("rb") as f:
        digest = hashlib.sha256(f.read(1 << 20)).hexdigest()[:32]
    return f"{p.stat().st_size}:{digest}"


def write(path: str | Path, acc: Accumulator, header: Header) -> Path:
    out = Path(path)
    meta: dict[str, Any] = {
        "format": FORMAT, "model": header.model, "source": header.source, "corpus": header.corpus,
        "max_tokens": header.max_tokens, "top_k": acc.top_k, "complete": header.complete, "fields": list(FIELDS),
        "n_layers": acc.n_layers, "n_heads": acc.n_heads, "documents": acc.documents, "sequences": acc.sequences,
        "tokens": acc.tokens,
        "examples": [[dataclasses.asdict(e) for _w, _s, e in sorted(heap, reverse=True)] for heap in acc.best],
    }
    tensors = {"count": acc.count, "mean": acc.mean, "m2": acc.m2}
    if header.probe is not None:
        tensors["probe"] = torch.tensor(header.probe, dtype=torch.float64)
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata={"attnscope": json.dumps(meta)})
    tmp = out.with_name(out.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return out


def _bad(path: Path, reason: str) -> BadInput:
    return BadInput(f"{path.name} is not a usable attnscope survey file: {reason}", params={"file": path.name})


def is_survey(data: bytes) -> bool:
    """Does this safetensors file say it is a survey (cheap: its header only)?"""
    if len(data) < 8:
        return False
    size = int.from_bytes(data[:8], "little")
    if size <= 0 or size > min(len(data) - 8, 64 << 20):
        return False
    try:
        head = json.loads(data[8: 8 + size])
        said = json.loads(head.get("__metadata__", {}).get("attnscope", "{}"))
        return isinstance(said, dict) and said.get("format") == FORMAT
    except (ValueError, AttributeError):
        return False


def read(path: str | Path) -> tuple[Accumulator, Header]:
    """The survey's state (to resume it, or to read it): refuses anything that is not a whole survey file."""
    p = Path(path)
    if not p.is_file():
        raise _bad(p, "no such file")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise _bad(p, f"{p.stat().st_size:,} bytes is more than a survey file holds")
    data = p.read_bytes()
    if not is_survey(data):
        raise _bad(p, f"its header does not say {FORMAT}")
    try:
        tensors = load(data)
        size = int.from_bytes(data[:8], "little")
        meta = json.loads(json.loads(data[8: 8 + size])["__metadata__"]["attnscope"])
        layers, heads, top_k = int(meta["n_layers"]), int(meta["n_heads"]), int(meta["top_k"])
    except (SafetensorError, ValueError, KeyError, TypeError) as err:
        raise _bad(p, f"its contents do not parse ({err})") from None
    if list(meta.get("fields", [])) != list(FIELDS):
        raise _bad(p, "its fields are not this version's")
    acc = Accumulator(layers, heads, top_k)
    for name in ("count", "mean", "m2"):
        t = tensors.get(name)
        if t is None or tuple(t.shape) != tuple(acc.count.shape) or t.dtype != torch.float64:
            raise _bad(p, f"its {name} tensor is missing or misshapen")
        if not bool(torch.isfinite(t).all()):
            raise _bad(p, f"its {name} tensor holds a non-finite number")
        setattr(acc, name, t.clone())
    acc.documents, acc.sequences, acc.tokens = int(meta["documents"]), int(meta["sequences"]), int(meta["tokens"])
    examples = meta.get("examples", [])
    if len(examples) != layers * heads:
        raise _bad(p, "its examples do not cover every head")
    try:
        for i, listed in enumerate(examples):
            for rank, e in enumerate(listed[:top_k]):
                ex = Example(**{f.name: e[f.name] for f in dataclasses.fields(Example)})
                acc.best[i].append((ex.weight, -rank, ex))
    except (KeyError, TypeError) as err:
        raise _bad(p, f"an example does not parse ({err})") from None
    probe = tensors.get("probe")
    if probe is not None and tuple(probe.shape) != (layers, heads):
        raise _bad(p, "its probe tensor is misshapen")
    header = Header(model=str(meta["model"]), source=meta.get("source"), corpus=meta.get("corpus"),
                    max_tokens=int(meta["max_tokens"]), complete=bool(meta["complete"]),
                    probe=None if probe is None else probe.tolist())
    for heap in acc.best:
        heapq.heapify(heap)
    return acc, header


def load_survey(path: str | Path) -> Survey:
    acc, header = read(path)
    return acc.result(model=header.model, source=header.source, max_tokens=header.max_tokens,
                      complete=header.complete, probe=header.probe)
