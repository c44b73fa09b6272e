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
import math
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
HEADER_BYTES = 60 << 20  # the JSON header (examples included): under is_survey's 64 MiB look


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
    said = json.dumps(meta, ensure_ascii=False)
    if len(said.encode()) > HEADER_BYTES:
        raise BadInput(f"this survey's header would be {len(said.encode()):,} bytes, more than the "
                       f"{HEADER_BYTES >> 20} MiB a survey file may hold: survey with a smaller top_k",
                       params={"bytes": len(said.encode())})
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata={"attnscope": said})
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
    except (ValueError, AttributeError, TypeError, RecursionError):
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
        return _parsed(p, data)
    except (SafetensorError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as err:
        raise _bad(p, f"its contents do not parse ({type(err).__name__}: {err})") from None


MAX_HEADS = 1 << 20  # layers x heads a survey file may claim
MAX_TOP_K = 50


def _count(value: Any, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} {value!r} is not an integer in {low}..{high}")
    return value


def _example(e: Any) -> Example:
    if not isinstance(e, dict):
        raise TypeError("an example is not an object")
    ints = {n: _count(e[n], n, 0, 1 << 40) for n in ("document", "offset", "query", "key", "start", "key_start")}
    weight = e["weight"]
    if not isinstance(weight, int | float) or not math.isfinite(weight):
        raise ValueError(f"an example's weight {weight!r} is not a finite number")
    for n in ("tokens", "key_tokens"):
        if not isinstance(e[n], list) or not all(isinstance(x, str) for x in e[n]):
            raise TypeError(f"an example's {n} are not strings")
    return Example(document=ints["document"], offset=ints["offset"], query=ints["query"], key=ints["key"],
                   weight=float(weight), start=ints["start"], tokens=list(e["tokens"]), key_start=ints["key_start"],
                   key_tokens=list(e["key_tokens"]))


def _parsed(p: Path, data: bytes) -> tuple[Accumulator, Header]:
    """The checks, in an order that allocates nothing a header merely claims before the tensors confirm it."""
    size = int.from_bytes(data[:8], "little")
    meta = json.loads(json.loads(data[8: 8 + size])["__metadata__"]["attnscope"])
    if not isinstance(meta, dict):
        raise TypeError("the survey header is not an object")
    tensors = load(data)
    layers = _count(meta["n_layers"], "n_layers", 1, MAX_HEADS)
    heads = _count(meta["n_heads"], "n_heads", 1, MAX_HEADS // layers)
    top_k = _count(meta["top_k"], "top_k", 1, MAX_TOP_K)
    if list(meta.get("fields", [])) != list(FIELDS):
        raise _bad(p, "its fields are not this version's")
    shape = (len(FIELDS), layers, heads)
    for name in ("count", "mean", "m2"):
        t = tensors.get(name)
        if t is None or tuple(t.shape) != shape or t.dtype != torch.float64:
            raise _bad(p, f"its {name} tensor is missing or misshapen")
        if not bool(torch.isfinite(t).all()):
            raise _bad(p, f"its {name} tensor holds a non-finite number")
    if bool((tensors["m2"] < 0).any()) or bool((tensors["count"] < 0).any()):
        raise _bad(p, "its count or m2 tensor holds a negative number")
    probe = tensors.get("probe")
    if probe is not None and (tuple(probe.shape) != (layers, heads) or not bool(torch.isfinite(probe).all())):
        raise _bad(p, "its probe tensor is misshapen or not finite")
    examples = meta.get("examples", [])
    if not isinstance(examples, list) or len(examples) != layers * heads:
        raise _bad(p, "its examples do not cover every head")
    acc = Accumulator(layers, heads, top_k)
    for name in ("count", "mean", "m2"):
        setattr(acc, name, tensors[name].clone())
    acc.documents = _count(meta["documents"], "documents", 0, 1 << 62)
    acc.sequences = _count(meta["sequences"], "sequences", 0, 1 << 62)
    acc.tokens = _count(meta["tokens"], "tokens", 0, 1 << 62)
    for i, listed in enumerate(examples):
        if not isinstance(listed, list):
            raise TypeError("a head's examples are not a list")
        for rank, e in enumerate(listed[:top_k]):
            ex = _example(e)
            acc.best[i].append((ex.weight, -rank, ex))
    acc.reserve_ties(top_k)
    source, corpus = meta.get("source"), meta.get("corpus")
    header = Header(model=str(meta["model"]), source=None if source is None else str(source),
                    corpus=None if corpus is None else str(corpus),
                    max_tokens=_count(meta["max_tokens"], "max_tokens", 1, 1 << 40), complete=bool(meta["complete"]),
                    probe=None if probe is None else probe.tolist())
    for heap in acc.best:
        heapq.heapify(heap)
    return acc, header


def load_survey(path: str | Path) -> Survey:
    acc, header = read(path)
    return acc.result(model=header.model, source=header.source, max_tokens=header.max_tokens,
                      complete=header.complete, probe=header.probe)
