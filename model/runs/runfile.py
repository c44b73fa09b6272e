"""One run as one self-describing file: what it keeps (safetensors) and what it reports (a JSON header).

The file is a safetensors file (never pickle), a run's one file format, read by ``read`` / ``read_path``
alone (``model/runs/export.py``'s ``KeptRun`` is their run as tensors by name); per layer i, under
TransformerLens-style names:

* ``blocks.{i}.attn.hook_rot_q`` (H, n, dh), ``hook_rot_k`` (Hkv, n, dh), ``lse`` (H, n), float32;
  ``alibi`` (H, n) float32 for ALiBi families; ``visible`` (2, n) int32: row q sees keys
  [visible[0, q], visible[1, q]);
* ``blocks.0.hook_resid_pre``, ``blocks.{i}.hook_attn_out`` / ``hook_mlp_out`` / ``hook_resid_post`` (n, d)
  float32; ``input_ids`` (n,) int64;

and the run's predictions as tensors (P positions, k candidates; P = 0 for encoders):
``predictions.position`` (P,) int64, ``predictions.top_ids`` (P, k) int64, ``predictions.top_probs`` (P, k)
float64, ``predictions.next`` (P, 2) int64 (the actual next token's id and rank, -1 at the last
position), ``predictions.next_prob`` (P,) float64.

Its metadata holds ``format`` ("attnscope-run/1") and ``attnscope``: one JSON object with the format
version, the creation time, the model's name and fingerprints (``model/load/fingerprint.py``), the
dtype, the causal flag, the text, the tokens, each layer's sizes and parameters (scaling, softcap,
groups, ALiBi), the head scores (late ones included once computed; ``scores_pending`` and the owed
fields per layer while not), the timings and the display strings of the predicted ids.

:func:`read` trusts nothing: the file's size, the safetensors header (its length, JSON, every
tensor's dtype, shape and byte range) and the run header are checked against each other before
``safetensors.torch.load`` sees the bytes; the values after (key ranges, token ids). Anything wrong
is a :class:`BadRunFile` (422) naming what, never another exception.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, load_file, save

from attnscope.model.attention.kept import CHUNK_CELLS, LayerAttention
from attnscope.model.attention.spans import RangeMask
from attnscope.model.errors import BadRunFile
from attnscope.model.load.tokens import Token
from attnscope.model.results import ActualNext, PositionPrediction, RunSummary, TokenProb
from attnscope.model.runs.budget import summary_bytes
from attnscope.model.runs.record import FileScores, RunRecord
from attnscope.model.scores.analysis import SCORE_FIELDS, HeadScore

FORMAT = "attnscope-run/1"
VERSION = 1
OLD_EXPORT = "attnscope-run-tensors/1"  # the retired tensors-only export: no predictions, no fingerprints
HEADER_CAP = 16 << 20  # bytes of safetensors header (the JSON run header is inside it)
META_KEY = "attnscope"

# safetensors dtype -> (torch dtype, bytes an element)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F32": (torch.float32, 4), "F64": (torch.float64, 8), "I32": (torch.int32, 4), "I64": (torch.int64, 8)}


@dataclass(frozen=True)
class StoredRun:
    """A run file read back: the run (every ``RunRecord`` method works on it) and the header's fields."""

    record: RunRecord
    version: int
    model_fingerprint: str
    tokenizer_fingerprint: str
    dtype: str
    created: float  # seconds since the epoch
    pending_fields: dict[int, frozenset[str]]  # layer -> accumulator fields still owed (``SCORE_FIELDS``)

    @property
    def model(self) -> str:
        return self.record.model


# ---- writing -------------------------------------------------------------------------------------

def visible_ranges(layer: LayerAttention) -> torch.Tensor:
    """(2, n) int32: the first visible key and one past the last, per query row (O(n) from the mask's
    spans where known, else read from its rows a block at a time). ValueError if a row's keys are not
    one range."""
    spans = layer.spans()
    if spans is not None:
        return torch.stack([spans.lo, spans.hi]).to("cpu", torch.int32)
    n = layer.n
    lo, hi = torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32)
    rows = max(1, CHUNK_CELLS // max(1, n))
    keys = torch.arange(n)
    for q0 in range(0, n, rows):
        q1 = min(n, q0 + rows)
        seen = layer.visible(q0, q1, 0, n).cpu()  # (r, n)
        first = torch.where(seen, keys, n).amin(-1)
        last = torch.where(seen, keys, -1).amax(-1) + 1
        if bool(((last - first) != seen.sum(-1)).any()):
            raise ValueError("a row's visible keys are not one range: this mask cannot be exported")
        lo[q0:q1], hi[q0:q1] = first.to(torch.int32), last.clamp_min(first).to(torch.int32)
    return torch.stack([lo, hi])


def layer_tensors(record: RunRecord) -> dict[str, torch.Tensor]:
    """The kept tensors under the export's names (float32 and int32/int64, as stored)."""
    tensors: dict[str, torch.Tensor] = {"input_ids": record.input_ids.to(torch.int64)}
    for i, layer in enumerate(record.attention):
        tensors[f"blocks.{i}.attn.hook_rot_q"] = layer.q
        tensors[f"blocks.{i}.attn.hook_rot_k"] = layer.k
        tensors[f"blocks.{i}.attn.lse"] = layer.lse
        if layer.bias is not None:
            tensors[f"blocks.{i}.attn.alibi"] = layer.bias
        tensors[f"blocks.{i}.attn.visible"] = visible_ranges(layer)
        if i == 0:  # block i's resid_pre is block i-1's resid_post: kept once
            tensors["blocks.0.hook_resid_pre"] = record.resid[0]
        tensors[f"blocks.{i}.hook_attn_out"] = record.attn_out[i]
        tensors[f"blocks.{i}.hook_mlp_out"] = record.mlp_out[i]
        tensors[f"blocks.{i}.hook_resid_post"] = record.resid[i + 1]
    return {name: (t if t.dtype in (torch.int32, torch.int64) else t.float()).detach().cpu().contiguous()
            for name, t in tensors.items()}


def _prediction_tensors(preds: list[PositionPrediction]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    k = len(preds[0].top) if preds else 0
    if any(len(p.top) != k for p in preds):
        raise ValueError("every position must have as many candidates to be stored")
    strings: dict[str, str] = {}
    for p in preds:
        for t in p.top:
            strings[str(t.id)] = t.token
        if p.actual_next is not None:
            strings[str(p.actual_next.id)] = p.actual_next.token
    nxt = [(p.actual_next.id, p.actual_next.rank) if p.actual_next else (-1, -1) for p in preds]
    tensors = {
        "predictions.position": torch.tensor([p.position for p in preds], dtype=torch.int64),
        "predictions.top_ids": torch.tensor([[t.id for t in p.top] for p in preds],
                                            dtype=torch.int64).reshape(len(preds), k),
        "predictions.top_probs": torch.tensor([[t.prob for t in p.top] for p in preds],
                                              dtype=torch.float64).reshape(len(preds), k),
        "predictions.next": torch.tensor(nxt, dtype=torch.int64).reshape(len(preds), 2),
        "predictions.next_prob": torch.tensor([p.actual_next.prob if p.actual_next else math.nan for p in preds],
                                              dtype=torch.float64),
    }
    return tensors, strings


def dump(record: RunRecord, *, model_fingerprint: str, tokenizer_fingerprint: str, dtype: str,
         created: float | None = None) -> bytes:
    """The run's file. ``dtype``: the model's parameters' ("float32", "bfloat16"); ``created``: seconds
    since the epoch (now by default). Late head scores are written as the summary holds them: a run
    dumped before they arrive says which are pending (and for which layers)."""
    summary = record.summary
    tensors = layer_tensors(record)
    pred_tensors, strings = _prediction_tensors(summary.predictions)
    tensors.update(pred_tensors)
    pending = record.pending
    header: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "created": time.time() if created is None else float(created),
        "model": record.model, "model_fingerprint": model_fingerprint,
        "tokenizer_fingerprint": tokenizer_fingerprint, "dtype": dtype, "causal": bool(record.causal),
        "text": record.text, "n": record.n, "d_model": int(record.resid[0].shape[-1]),
        "layers": [{"heads": a.n_heads, "kv_heads": int(a.k.shape[0]), "d_head": int(a.q.shape[-1]),
                    "scaling": float(a.scaling), "softcap": None if a.softcap is None else float(a.softcap),
                    "groups": int(a.groups), "alibi": a.bias is not None} for a in record.attention],
        "tokens": [[t.id, t.text, t.start, t.end, t.special, t.partial] for t in summary.tokens],
        "predictions": {"count": len(summary.predictions), "k": int(pred_tensors["predictions.top_ids"].shape[1]),
                        "strings": strings},
        "heads": [[s.layer, s.head, s.entropy, s.prev_token, s.first_token, s.max, s.induction]
                  for s in summary.heads],
        "timing_ms": {k: float(v) for k, v in summary.timing_ms.items()},
        "scores_pending": list(summary.scores_pending),
        "pending_fields": ({str(layer): sorted(fields) for layer, fields in pending.fields.items()}
                           if pending is not None and summary.scores_pending else {}),
    }
    meta = {"format": FORMAT, META_KEY: json.dumps(header, ensure_ascii=False, separators=(",", ":"))}
    data: bytes = save(tensors, metadata=meta)
    return data


# ---- reading -------------------------------------------------------------------------------------

def _need(ok: bool, reason: str) -> None:
    if not ok:
        raise BadRunFile(reason)


def _int(v: Any, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise BadRunFile(f"{what} must be an integer in [{lo}, {hi}], not {_show(v)}")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise BadRunFile(f"{what} must be a string, not {_show(v)}")
    return v


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise BadRunFile(f"{what} must be true or false, not {_show(v)}")
    return v


def _num(v: Any, what: str, none: bool = False) -> float | None:
    if v is None and none:
        return None
    if type(v) not in (int, float):
        raise BadRunFile(f"{what} must be a number, not {_show(v)}")
    return float(v)


def _finite(v: Any, what: str) -> float:
    x = _num(v, what)
    if x is None or not math.isfinite(x):
        raise BadRunFile(f"{what} must be a finite number, not {_show(v)}")
    return x


def _list(v: Any, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(v, list):
        raise BadRunFile(f"{what} must be a list, not {_show(v)}")
    if length is not None and len(v) != length:
        raise BadRunFile(f"{what} must have {length} entries, not {len(v)}")
    return v


def _dict(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadRunFile(f"{what} must be an object, not {_show(v)}")
    return v


def _show(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=True, default=str) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (a duplicate could mean one thing here, another to
    safetensors' own parser)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError(f"a key appears twice in one object: {sorted(k for k, _ in pairs)[:3]}")
    return out


def _safetensors_header(data: bytes, max_bytes: int, size: int | None = None) -> tuple[dict[str, Any], int]:
    """The safetensors header (parsed JSON) and where the tensor data starts, checked against the file.
    ``data``: the file, or its beginning (at least the header) when ``size`` gives the file's length."""
    total = len(data) if size is None else size
    _need(total <= max_bytes, f"the file is {total:,} bytes, more than the {max_bytes:,} allowed")
    _need(total >= 8, f"the file is {total} bytes: too short to hold a header (truncated?)")
    length = int.from_bytes(data[:8], "little")
    _need(length <= HEADER_CAP,
          "it does not begin as a run file does (8 bytes of header length, then its JSON header): another kind "
          "of file?")
    _need(8 + length <= total, f"the header declares {length:,} bytes but the file holds {total - 8:,} "
                               "after its length (truncated?)")
    try:
        parsed = json.loads(data[8 : 8 + length].decode("utf-8"), object_pairs_hook=_unique)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise BadRunFile(f"the header is not JSON ({type(err).__name__}: {str(err)[:80]})") from None
    return _dict(parsed, "the header"), 8 + length


def head_of(path: Path) -> tuple[bytes, int]:
    """A file's safetensors header bytes (8 + its declared length, at most 8 + HEADER_CAP) and its size:
    all that ``read_path`` checks before it loads a tensor."""
    size = path.stat().st_size
    with path.open("rb") as f:
        start = f.read(8)
        length = int.from_bytes(start, "little") if len(start) == 8 else 0
        return start + f.read(min(length, HEADER_CAP)), size


def tensor_bytes(path: Path, *, max_bytes: int) -> int:
    """The bytes of tensor data a run file holds, from its header alone (checked as ``read`` checks it):
    what loading it will take, to refuse before loading what cannot fit."""
    head, size = head_of(path)
    st, start = _safetensors_header(head, max_bytes, size)
    _check_tensors(st, _expected(_run_header(st)), size - start)
    return size - start


def _run_header(st: dict[str, Any]) -> dict[str, Any]:
    meta = _dict(st.get("__metadata__", {}), "the header's __metadata__")
    fmt = meta.get("format")
    if fmt == OLD_EXPORT:
        raise BadRunFile(f"this is an {OLD_EXPORT} export (tensors only: no predictions, no fingerprints); "
                         f"export the run with format=attnscope instead")
    _need(fmt == FORMAT, f"the file's format is {_show(fmt)}, not {FORMAT!r}" if fmt is not None
          else f"the file has no format: a safetensors file that is not an {FORMAT} run (a model's weights?)")
    raw = meta.get(META_KEY)
    _need(isinstance(raw, str), f"the file has no run header ({META_KEY!r} metadata)")
    try:
        header = json.loads(str(raw), object_pairs_hook=_unique)
    except (ValueError, RecursionError) as err:
        raise BadRunFile(f"the run header is not JSON ({str(err)[:80]})") from None
    header = _dict(header, "the run header")
    version = _int(header.get("version"), "version", 1, 1 << 30)
    _need(version <= VERSION, f"format version {version} was written by a newer attnscope (this one reads {VERSION})")
    return header


def _expected(header: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor the header implies: name -> (safetensors dtype, shape)."""
    n = _int(header.get("n"), "n", 1)
    d = _int(header.get("d_model"), "d_model", 1)
    layers = _list(header.get("layers"), "layers")
    _need(len(layers) >= 1, "layers must not be empty")
    preds = _dict(header.get("predictions"), "predictions")
    p, k = _int(preds.get("count"), "predictions.count"), _int(preds.get("k"), "predictions.k")
    out: dict[str, tuple[str, tuple[int, ...]]] = {
        "input_ids": ("I64", (n,)), "blocks.0.hook_resid_pre": ("F32", (n, d)),
        "predictions.position": ("I64", (p,)), "predictions.top_ids": ("I64", (p, k)),
        "predictions.top_probs": ("F64", (p, k)), "predictions.next": ("I64", (p, 2)),
        "predictions.next_prob": ("F64", (p,))}
    heads0 = None
    for i, raw in enumerate(layers):
        lay = _dict(raw, f"layers[{i}]")
        h, hkv = _int(lay.get("heads"), f"layers[{i}].heads", 1), _int(lay.get("kv_heads"), f"layers[{i}].kv_heads", 1)
        dh = _int(lay.get("d_head"), f"layers[{i}].d_head", 1)
        heads0 = h if heads0 is None else heads0
        _need(h == heads0, f"layer {i} has {h} heads, layer 0 {heads0}: every layer must have as many")
        _need(h % hkv == 0 and _int(lay.get("groups"), f"layers[{i}].groups", 1) == h // hkv,
              f"layer {i}: {h} heads over {hkv} K/V heads do not make {_show(lay.get('groups'))} groups")
        b = f"blocks.{i}."
        out |= {b + "attn.hook_rot_q": ("F32", (h, n, dh)), b + "attn.hook_rot_k": ("F32", (hkv, n, dh)),
                b + "attn.lse": ("F32", (h, n)), b + "attn.visible": ("I32", (2, n)),
                b + "hook_attn_out": ("F32", (n, d)), b + "hook_mlp_out": ("F32", (n, d)),
                b + "hook_resid_post": ("F32", (n, d))}
        if _bool(lay.get("alibi"), f"layers[{i}].alibi"):
            out[b + "attn.alibi"] = ("F32", (h, n))
    return out


def _check_tensors(st: dict[str, Any], expected: dict[str, tuple[str, tuple[int, ...]]], data_len: int) -> None:
    """Every tensor of the file is one the header implies, with its dtype and shape, and the byte ranges
    tile the data exactly (no gap, no overlap, none past the end)."""
    names = {k for k in st if k != "__metadata__"}
    missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
    _need(not missing, f"tensors missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    _need(not extra, f"tensors the header does not describe: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    ranges = []
    for name, (dtype, shape) in expected.items():
        entry = _dict(st[name], f"tensor {name}")
        _need(entry.get("dtype") == dtype, f"tensor {name} is {_show(entry.get('dtype'))}, not {dtype}")
        got = _list(entry.get("shape"), f"tensor {name}'s shape")
        _need(len(got) == len(shape) and all(type(s) is int for s in got) and tuple(got) == shape,
              f"tensor {name} has shape {_show(got)}, the header implies {list(shape)}")
        offsets = _list(entry.get("data_offsets"), f"tensor {name}'s data_offsets", 2)
        begin, end = (_int(o, f"tensor {name}'s data offset") for o in offsets)
        size = math.prod(shape) * DTYPES[dtype][1]
        _need(end - begin == size, f"tensor {name} declares {end - begin:,} bytes, its shape needs {size:,}")
        _need(end <= data_len, f"tensor {name} ends at byte {end:,}, past the file's {data_len:,} bytes of data "
                                   "(truncated?)")
        ranges.append((begin, end, name))
    cursor = 0
    for begin, end, name in sorted(ranges):
        _need(begin == cursor, f"tensor {name} starts at byte {begin:,}, not {cursor:,}: "
                               + ("its bytes overlap another's" if begin < cursor else "a gap before it"))
        cursor = end
    _need(cursor == data_len, f"the tensors hold {cursor:,} bytes, the file {data_len:,} (truncated or padded)")


def _tokens(header: dict[str, Any], ids: list[int], text: str) -> list[Token]:
    rows = _list(header.get("tokens"), "tokens", len(ids))
    out = []
    for i, raw in enumerate(rows):
        row = _list(raw, f"tokens[{i}]", 6)
        tid = _int(row[0], f"tokens[{i}].id")
        _need(tid == ids[i], f"tokens[{i}] has id {tid}, input_ids {ids[i]}")
        start, end = _int(row[2], f"tokens[{i}].start"), _int(row[3], f"tokens[{i}].end")
        _need(start <= end <= len(text),
              f"tokens[{i}] spans [{start}, {end}), outside the text's {len(text)} characters")
        out.append(Token(index=i, id=tid, text=_str(row[1], f"tokens[{i}].text"), start=start, end=end,
                         special=_bool(row[4], f"tokens[{i}].special"), partial=_bool(row[5], f"tokens[{i}].partial")))
    _spans_rebuild(out, text)
    return out


def _spans_rebuild(tokens: list[Token], text: str) -> None:
    """The tokens' spans tile the text, in order, as tokenizing it made them (model/load/tokens.py: every
    character belongs to exactly one token; a special or partial token may cover none): a span that
    starts anywhere but where the previous one ended, or text no token covers, is refused."""
    cursor = 0
    for t in tokens:
        if t.start != cursor:
            raise BadRunFile(f"tokens[{t.index}] starts at character {t.start:,}, where the text so far ends at "
                             f"{cursor:,}: the tokens' spans do not rebuild the text", code="run_file_text_mismatch")
        cursor = t.end
    if cursor != len(text):
        raise BadRunFile(f"the tokens cover the text's first {cursor:,} of {len(text):,} characters: the rest "
                         "belongs to no token", code="run_file_text_mismatch")


def _predictions(header: dict[str, Any], t: dict[str, torch.Tensor]) -> list[PositionPrediction]:
    strings = _dict(_dict(header["predictions"], "predictions").get("strings"), "predictions.strings")

    def name(tid: int) -> str:
        text = strings.get(str(tid))
        if not isinstance(text, str):
            raise BadRunFile(f"predictions.strings has no string for token id {tid}")
        return text

    positions, top_ids = t["predictions.position"].tolist(), t["predictions.top_ids"].tolist()
    top_probs, nxt = t["predictions.top_probs"].tolist(), t["predictions.next"].tolist()
    next_prob = t["predictions.next_prob"].tolist()
    out = []
    for i, pos in enumerate(positions):
        next_id, rank = nxt[i]
        actual = None
        if next_id >= 0:
            _need(rank >= 1, f"predictions.next[{i}] has rank {rank}")
            actual = ActualNext(id=next_id, token=name(next_id), prob=next_prob[i], rank=rank)
        _need(all(tid >= 0 for tid in top_ids[i]), f"predictions.top_ids[{i}] holds a negative id")
        out.append(PositionPrediction(position=pos, actual_next=actual,
                                      top=[TokenProb(id=tid, token=name(tid), prob=q)
                                           for tid, q in zip(top_ids[i], top_probs[i], strict=True)]))
    return out


def _heads(header: dict[str, Any], n_layers: int, n_heads: int) -> list[HeadScore]:
    rows = _list(header.get("heads"), "heads", n_layers * n_heads)
    out = []
    for i, raw in enumerate(rows):
        row = _list(raw, f"heads[{i}]", 7)
        layer, head = _int(row[0], f"heads[{i}].layer"), _int(row[1], f"heads[{i}].head")
        _need((layer, head) == divmod(i, n_heads), f"heads[{i}] is layer {layer} head {head}, out of order")
        vals = [_num(v, f"heads[{i}][{j}]", none=True) for j, v in enumerate(row[2:], start=2)]
        out.append(HeadScore(layer=layer, head=head, entropy=vals[0], prev_token=vals[1], first_token=vals[2],
                             max=vals[3], induction=vals[4]))
    return out


def _pending(header: dict[str, Any], n_layers: int) -> tuple[tuple[str, ...], dict[int, frozenset[str]]]:
    names = tuple(_str(v, "scores_pending[]") for v in _list(header.get("scores_pending", []), "scores_pending"))
    fields: dict[int, frozenset[str]] = {}
    for key, raw in _dict(header.get("pending_fields", {}), "pending_fields").items():
        _need(key.isdigit() and int(key) < n_layers, f"pending_fields names layer {_show(key)}")
        owed = frozenset(_str(f, "pending_fields[]") for f in _list(raw, f"pending_fields[{key}]"))
        _need(owed <= set(SCORE_FIELDS), f"pending_fields[{key}] names a score attnscope does not compute")
        fields[int(key)] = owed
    return names, fields


def read(data: bytes, *, max_bytes: int) -> StoredRun:
    """A run file's run, every part checked (``BadRunFile`` otherwise); ``max_bytes``: the largest file
    accepted (a body limit, the run directory's cap)."""
    return _read(data, len(data), lambda: load(data), max_bytes=max_bytes)


def read_path(path: Path, *, max_bytes: int) -> StoredRun:
    """``read`` of a file on disk: its header is read and checked first, then its tensors are loaded from
    the file (memory-mapped by safetensors, copied once into the run): the file is never held as bytes
    beside them."""
    head, size = head_of(path)
    return _read(head, size, lambda: load_file(path), max_bytes=max_bytes)


def _read(data: bytes, size: int, tensors: Callable[[], dict[str, torch.Tensor]], *, max_bytes: int) -> StoredRun:
    """``data``: the file or its beginning (its header at least); ``size``: the file's bytes; ``tensors``
    loads them (called once everything the header says is checked)."""
    st, start = _safetensors_header(data, max_bytes, size)
    header = _run_header(st)
    expected = _expected(header)
    _check_tensors(st, expected, size - start)
    text = _str(header.get("text"), "text")
    model = _str(header.get("model"), "model")
    layers = [_dict(lay, "layers[]") for lay in header["layers"]]
    timing = {_str(k, "timing_ms key"): _finite(v, f"timing_ms[{k}]")
              for k, v in _dict(header.get("timing_ms", {}), "timing_ms").items()}
    fingerprints = (_str(header.get("model_fingerprint"), "model_fingerprint"),
                    _str(header.get("tokenizer_fingerprint"), "tokenizer_fingerprint"))
    dtype, causal = _str(header.get("dtype"), "dtype"), _bool(header.get("causal"), "causal")
    created = _finite(header.get("created"), "created")
    params = []
    for i, lay in enumerate(layers):
        softcap = _num(lay.get("softcap"), f"layers[{i}].softcap", none=True)
        _need(softcap is None or (math.isfinite(softcap) and softcap > 0), f"layers[{i}].softcap must be above 0")
        params.append((_finite(lay.get("scaling"), f"layers[{i}].scaling"), softcap, int(lay["groups"])))
    try:
        t = tensors()
    except (SafetensorError, ValueError, RuntimeError, OSError) as err:  # checked above: safetensors disagreeing
        raise BadRunFile(f"the tensors cannot be read ({type(err).__name__}: {str(err)[:80]})") from None
    for name, (kind, shape) in expected.items():  # what was loaded is what was checked
        _need(name in t and t[name].dtype == DTYPES[kind][0] and tuple(t[name].shape) == shape,
              f"tensor {name} was not read as the header declares it")
    for name, (kind, _shape) in expected.items():  # NaN or an infinity would come back as zeros, or as scores
        values = t[name]
        if name == "predictions.next_prob":  # NaN where a position has no next token (its id is -1): only there
            values = values[t["predictions.next"][:, 0] >= 0]
        if kind in ("F32", "F64") and not bool(torch.isfinite(values).all()):
            raise BadRunFile(f"tensor {name} holds a NaN or an infinity (every float a run keeps is finite)",
                             code="run_file_not_finite", params={"tensor": name})
    ids = t["input_ids"]
    _need(bool((ids >= 0).all()), "input_ids holds a negative id")
    attention = []
    for i, (scaling, softcap, groups) in enumerate(params):
        b = f"blocks.{i}.attn."
        vis = t[b + "visible"]
        try:
            mask = RangeMask.of(vis[0], vis[1])
        except ValueError as err:
            raise BadRunFile(f"layer {i}'s visible key ranges: {err}") from None
        attention.append(LayerAttention(q=t[b + "hook_rot_q"], k=t[b + "hook_rot_k"], lse=t[b + "lse"],
                                        scaling=scaling, softcap=softcap, groups=groups, bias=t.get(b + "alibi"),
                                        mask=mask))
    n_layers, n_heads = len(attention), attention[0].n_heads
    tokens = _tokens(header, ids.tolist(), text)
    predictions = _predictions(header, t)
    heads = _heads(header, n_layers, n_heads)
    scores_pending, pending_fields = _pending(header, n_layers)
    summary = RunSummary(model=model, tokens=tokens, predictions=predictions, heads=heads, timing_ms=timing,
                         scores_pending=scores_pending)
    k = int(t["predictions.top_ids"].shape[1])
    record = RunRecord(
        model=model, causal=causal, input_ids=ids, attention=attention,
        resid=[t["blocks.0.hook_resid_pre"]] + [t[f"blocks.{i}.hook_resid_post"] for i in range(n_layers)],
        attn_out=[t[f"blocks.{i}.hook_attn_out"] for i in range(n_layers)],
        mlp_out=[t[f"blocks.{i}.hook_mlp_out"] for i in range(n_layers)],
        summary=summary, text=text,
        summary_bytes=summary_bytes(len(tokens), len(predictions), k, len(heads)))
    return StoredRun(record=record, version=int(header["version"]), model_fingerprint=fingerprints[0],
                     tokenizer_fingerprint=fingerprints[1], dtype=dtype, created=created,
                     pending_fields=pending_fields)


def scores(data: bytes, *, max_bytes: int) -> FileScores:
    """The head scores of a run file, its header only (another worker may have written its late scores)."""
    st, _start = _safetensors_header(data, max_bytes)
    header = _run_header(st)
    layers = [_dict(lay, "layers[]") for lay in _list(header.get("layers"), "layers")]
    _need(len(layers) > 0, "the run has no layers")
    n_heads = _int(layers[0].get("heads"), "layers[0].heads", 1, 1 << 16)
    timing = {_str(k, "timing_ms key"): _finite(v, f"timing_ms[{k}]")
              for k, v in _dict(header.get("timing_ms", {}), "timing_ms").items()}
    pending, _fields = _pending(header, len(layers))
    return FileScores(heads=_heads(header, len(layers), n_heads), scores_pending=pending, timing_ms=timing)
