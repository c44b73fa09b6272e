"""A run file (``model/runs/runfile.py``) read back is the run: every head's weights, its masks and spans,
tiles, its summary with late scores, on families with windows, ALiBi, soft-caps, grouped K/V heads and
an encoder; and every hostile file is refused with ``bad_run_file``, never another exception."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from safetensors.torch import load, save

from attnscope.model.attention.spans import RangeMask, mask_spans
from attnscope.model.errors import BadRunFile, EngineError
from attnscope.model.load.models import LoadedModel, wrap_model
from attnscope.model.runs import runfile
from attnscope.model.runs.export import KeptRun
from attnscope.model.runs.late import layer_scores
from attnscope.model.runs.record import PendingScores, RunRecord
from attnscope.model.runs.runfile import FORMAT, HEADER_CAP, META_KEY, StoredRun, dump, read
from attnscope.model.runs.tiles import TileSpec, head_tile
from attnscope.model.scores.analysis import SCORE_FIELDS, SCORE_NAMES
from attnscope.model.services.engine import Engine
from tests.support.families import FAMILIES
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat; the cat sat on it."
MAX = 1 << 30
# llama (causal, fused), mistral (sliding window), gemma2 (soft-cap + window), bloom (ALiBi, module capture),
# falcon (ALiBi read from its additive mask, one K/V head), bert (bidirectional encoder), qwen2 (grouped K/V
# heads, window on one layer), gpt_neo (a local layer)
CHOSEN = ["llama", "mistral", "gemma2", "bloom", "falcon", "bert", "qwen2", "gpt_neo"]


def _engine(family_id: str) -> Engine:
    family = next(f for f in FAMILIES if f.id == family_id)
    lm: LoadedModel = wrap_model(f"tiny-{family_id}", family.build("eager"), tiny_tokenizer(),
                                 source=f"config:{family_id}")
    return make_engine({lm.info.name: lm}, lm.info.name)


_RUNS: dict[str, RunRecord] = {}


def run_of(family_id: str) -> RunRecord:
    """One analysed run per family, with its late head scores in."""
    if family_id not in _RUNS:
        engine = _engine(family_id)
        result = engine.analyse(TEXT)
        _RUNS[family_id] = engine.wait_scores(result.run_id, 60)
        engine.close()
    return _RUNS[family_id]


def roundtrip(record: RunRecord, **kw: Any) -> StoredRun:
    args: dict[str, Any] = {"model_fingerprint": "m" * 64, "tokenizer_fingerprint": "t" * 64, "dtype": "float32"}
    return read(dump(record, **{**args, **kw}), max_bytes=MAX)


@pytest.mark.parametrize("family_id", CHOSEN)
def test_a_read_run_is_the_run(family_id: str) -> None:
    rec = run_of(family_id)
    assert not rec.summary.scores_pending
    got = roundtrip(rec).record
    assert (got.model, got.causal, got.text, got.n, got.n_layers, got.n_heads) == (
        rec.model, rec.causal, rec.text, rec.n, rec.n_layers, rec.n_heads)
    assert got.summary == rec.summary  # tokens, predictions, head scores (late ones included), timings
    assert torch.equal(got.input_ids, rec.input_ids)
    for a, b in zip([*got.resid, *got.attn_out, *got.mlp_out], [*rec.resid, *rec.attn_out, *rec.mlp_out],
                    strict=True):
        assert torch.equal(a, b)
    for layer in (0, rec.n_layers - 1):
        for head in range(rec.n_heads):
            w0, v0 = rec.head_rows(layer, head, 0, rec.n)
            w1, v1 = got.head_rows(layer, head, 0, rec.n)
            assert torch.equal(v0, v1)
            torch.testing.assert_close(w1, w0, atol=1e-6, rtol=0)
            part0, _ = rec.head_rows(layer, head, 3, 9, 2, 7)  # a tile's rows and keys
            part1, _ = got.head_rows(layer, head, 3, 9, 2, 7)
            torch.testing.assert_close(part1, part0, atol=1e-6, rtol=0)
        torch.testing.assert_close(got.pattern(layer), rec.pattern(layer), atol=1e-6, rtol=0)
        torch.testing.assert_close(got.packed(layer), rec.packed(layer), atol=1e-6, rtol=0)
        spans0, spans1 = rec.attention[layer].spans(), got.attention[layer].spans()
        assert spans0 is not None and spans1 is not None
        assert torch.equal(spans0.lo, spans1.lo) and torch.equal(spans0.hi, spans1.hi)
        assert got.attention[layer].fused_causal == rec.attention[layer].fused_causal
        spec = TileSpec(0, rec.n, 0, rec.n, size=4, pool="max")
        torch.testing.assert_close(head_tile(got.attention[layer], 1, spec), head_tile(rec.attention[layer], 1, spec),
                                   atol=1e-6, rtol=0, equal_nan=True)
    assert abs(got.nbytes - rec.nbytes) < 0.1 * rec.nbytes  # counted like the run it was


def test_the_header_says_where_the_run_comes_from() -> None:
    rec = run_of("llama")
    stored = roundtrip(rec, model_fingerprint="f" * 64, tokenizer_fingerprint="0" * 64, dtype="bfloat16",
                       created=1.7e9)
    assert (stored.model, stored.model_fingerprint, stored.tokenizer_fingerprint, stored.dtype, stored.created,
            stored.version) == (rec.model, "f" * 64, "0" * 64, "bfloat16", 1.7e9, 1)
    assert stored.record.attention[0].fused_causal  # a causal run read back still takes the fused path


def test_the_export_reader_reads_a_run_file(tmp_path: Any) -> None:
    rec = run_of("gemma2")
    path = tmp_path / "run.safetensors"
    path.write_bytes(dump(rec, model_fingerprint="m", tokenizer_fingerprint="t", dtype="float32"))
    kept = KeptRun.load(path)
    for head in range(rec.n_heads):
        torch.testing.assert_close(kept.pattern(1, head), rec.head_pattern(1, head), atol=1e-6, rtol=0)


def test_pending_scores_travel_with_the_run() -> None:
    rec = run_of("llama")
    owed = {0: frozenset({"entropy", "peak"}), 1: frozenset({"entropy"})}
    heads = [dataclasses.replace(s, entropy=None, max=None if s.layer == 0 else s.max) for s in rec.summary.heads]
    pending = dataclasses.replace(rec, summary=dataclasses.replace(rec.summary, heads=heads,
                                                                   scores_pending=("entropy", "max")),
                                  pending=PendingScores(fields=owed, started=0.0))
    stored = roundtrip(pending)
    assert stored.pending_fields == owed
    assert stored.record.summary.scores_pending == ("entropy", "max")
    assert stored.record.summary.heads == heads and stored.record.pending is None


@pytest.mark.parametrize("family_id", ["llama", "mistral"])
def test_late_scores_computed_from_a_read_run_are_the_runs(family_id: str) -> None:
    """What a worker that did not make the run computes from its file (fused path: llama; blocks: mistral)."""
    rec = run_of(family_id)
    got = roundtrip(rec).record
    for layer, kept in enumerate(got.attention):
        late = layer_scores(kept, got.input_ids, frozenset(SCORE_FIELDS), layer)
        for head, score in enumerate(late):
            want = rec.summary.heads[layer * rec.n_heads + head]
            for name in SCORE_NAMES.values():
                a, b = getattr(score, name), getattr(want, name)
                assert (a is None) == (b is None) and (a is None or abs(a - b) < 1e-5), (layer, head, name, a, b)


def test_an_encoder_keeps_no_predictions() -> None:
    rec = run_of("bert")
    assert rec.summary.predictions == [] and roundtrip(rec).record.summary.predictions == []


# ---- hostile files ----------------------------------------------------------------------------------

def _good() -> bytes:
    return dump(run_of("llama"), model_fingerprint="m", tokenizer_fingerprint="t", dtype="float32")


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _join(header: dict[str, Any], body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


def _join_raw(raw: bytes) -> bytes:
    return len(raw).to_bytes(8, "little") + raw


def _twice() -> bytes:
    """lse declared twice, the second time as q (json.dumps cannot write it: the text is edited)."""
    header, body = _split(_good())
    lse = json.dumps(header["blocks.0.attn.lse"])
    raw = json.dumps(header).replace('"blocks.0.attn.lse": ' + lse,
                                     '"blocks.0.attn.lse": ' + lse + ', "blocks.0.attn.lse": '
                                     + json.dumps(header["blocks.0.attn.hook_rot_q"]))
    return _join_raw(raw.encode()) + body


def _raw_edit(edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The good file with its safetensors header edited (the tensor bytes left as they are)."""
    header, body = _split(_good())
    edit(header)
    return _join(header, body)


def _resaved(tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
             run: Callable[[dict[str, Any]], None] | None = None) -> bytes:
    """The good file saved again by safetensors with its tensors or its run header changed: well-formed
    safetensors, inconsistent as a run."""
    data = _good()
    t = dict(load(data))
    meta = _split(data)[0]["__metadata__"]
    header = json.loads(meta[META_KEY])
    if tensors is not None:
        tensors(t)
    if run is not None:
        run(header)
    out: bytes = save(t, metadata={**meta, META_KEY: json.dumps(header)})
    return out


def _model_file() -> bytes:
    model = next(f for f in FAMILIES if f.id == "llama").build("eager")
    out: bytes = save({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                      metadata={"format": "pt"})
    return out


def _overlap(h: dict[str, Any]) -> None:
    """lse's bytes declared inside q's."""
    b, e = h["blocks.0.attn.lse"]["data_offsets"]
    q0 = h["blocks.0.attn.hook_rot_q"]["data_offsets"][0]
    h["blocks.0.attn.lse"]["data_offsets"] = [q0, q0 + e - b]


def _past_end(h: dict[str, Any]) -> None:
    """The last tensor's bytes declared a megabyte further on."""
    name = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    b, e = h[name]["data_offsets"]
    h[name]["data_offsets"] = [b + (1 << 20), e + (1 << 20)]


def _swap_dtype(t: dict[str, torch.Tensor]) -> None:
    t["blocks.1.attn.hook_rot_k"] = t["blocks.1.attn.hook_rot_k"].double()


def _bad_ranges(t: dict[str, torch.Tensor]) -> None:
    t["blocks.0.attn.visible"][1, 3] = 10_000  # a key past the run


def _longer(h: dict[str, Any]) -> None:
    h["n"] += 1


def _more_heads(h: dict[str, Any]) -> None:
    for layer in h["layers"]:
        layer["heads"], layer["groups"] = 2 * layer["heads"], 2 * layer["groups"]


def _foreign_id(h: dict[str, Any]) -> None:
    h["tokens"][2][0] += 1


def _newer(h: dict[str, Any]) -> None:
    h["version"] = 2


def _heads_missing(h: dict[str, Any]) -> None:
    h["heads"] = h["heads"][:-1]


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "empty": (lambda: b"", "too short"),
    "truncated": (lambda: _good()[: len(_good()) // 2], "truncated"),
    "header longer than the file": (lambda: (10_000_000).to_bytes(8, "little") + b"{}" * 10, "truncated"),
    "header over the cap": (lambda: (HEADER_CAP + 1).to_bytes(8, "little") + b"\0" * 64, "does not begin as a run file does"),
    "header not JSON": (lambda: (12).to_bytes(8, "little") + b"{not json!!}" + b"\0" * 8, "not JSON"),
    "header not UTF-8": (lambda: (4).to_bytes(8, "little") + b"\xff\xfe{}", "not JSON"),
    "header nested deeply": (lambda: _join_raw(b"[" * 100_000 + b"]" * 100_000), "not JSON"),
    "a tensor named twice": (lambda: _twice(), "twice"),
    "a model's weights": (_model_file, "format is 'pt', not 'attnscope-run/1'"),
    "the old export": (lambda: save(runfile.layer_tensors(run_of("llama")),
                                    metadata={"format": runfile.OLD_EXPORT, "run": "{}"}), "format=attnscope"),
    "a tensor missing": (lambda: _resaved(tensors=lambda t: t.pop("blocks.1.hook_mlp_out")), "missing"),
    "an extra tensor": (lambda: _resaved(tensors=lambda t: t.update(extra=torch.zeros(3))), "does not describe"),
    "a wrong dtype": (lambda: _resaved(tensors=_swap_dtype), "not F32"),
    "shapes against the header": (lambda: _resaved(run=_longer), "shape"),
    "heads against the tensors": (lambda: _resaved(run=_more_heads), "shape"),
    "sizes past the file": (lambda: _raw_edit(_past_end), "past the file"),
    "overlapping tensors": (lambda: _raw_edit(_overlap), "overlap"),
    "key ranges out of the run": (lambda: _resaved(tensors=_bad_ranges), "visible key ranges"),
    "tokens of another text": (lambda: _resaved(run=_foreign_id), "input_ids"),
    "a newer format version": (lambda: _resaved(run=_newer), "newer"),
    "head scores missing": (lambda: _resaved(run=_heads_missing), "heads must have"),
    "no run header": (lambda: save({"x": torch.zeros(2)}, metadata={"format": FORMAT}), "no run header"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_file_is_refused_with_a_reason(name: str) -> None:
    make, reason = HOSTILE[name]
    with pytest.raises(BadRunFile) as caught:
        read(make(), max_bytes=MAX)
    assert caught.value.code == "bad_run_file"
    assert reason in str(caught.value.params["reason"]), caught.value.params
    assert str(caught.value).startswith("not a usable attnscope run file: ")


def test_a_file_over_the_limit_is_refused_before_it_is_read() -> None:
    data = _good()
    with pytest.raises(BadRunFile, match=f"more than the {len(data) - 1:,} allowed"):
        read(data, max_bytes=len(data) - 1)
    assert read(data, max_bytes=len(data)).record.n == run_of("llama").n


def _mutations(data: bytes, count: int) -> Iterator[bytes]:
    """The file with a few bytes of its headers changed, ``count`` times (seeded)."""
    rng = random.Random(0)
    end = 8 + int.from_bytes(data[:8], "little")
    for _ in range(count):
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(0, end)] = rng.randrange(256)
        yield bytes(raw)


def test_mangled_headers_give_bad_run_file_or_a_run_never_a_crash() -> None:
    codes = []
    for data in _mutations(_good(), 300):
        try:
            read(data, max_bytes=MAX)
        except EngineError as err:  # anything else fails the test
            codes.append(err.code)
    assert set(codes) == {"bad_run_file"} and len(codes) > 200  # most of them break the JSON, a name or an offset


# ---- the mask of a read run -------------------------------------------------------------------------

def test_a_range_mask_answers_what_a_lazy_mask_does() -> None:
    n = 6
    rows = torch.arange(n)
    causal = RangeMask.of(torch.zeros(n, dtype=torch.int32), rows + 1)
    assert causal.fused_causal() is True and causal.whole(n) is causal and causal.kv_offset == 0
    assert torch.equal(causal.rows(0, n)[0], torch.ones(n, n, dtype=torch.bool).tril())
    window = RangeMask.of((rows - 2).clamp_min(0), rows + 1)
    assert window.fused_causal() is None
    spans = mask_spans(window)
    assert spans is not None and torch.equal(spans.visible(0, n, 0, n), window.rows(0, n)[0])
    odd = RangeMask.of(torch.tensor([0, 3, 0, 0, 0, 0]), torch.tensor([1, 6, 3, 4, 5, 6]))  # not monotone
    assert mask_spans(odd) is None and odd.rows(1, 2)[0].tolist() == [[False, False, False, True, True, True]]
    with pytest.raises(ValueError, match="within"):
        RangeMask.of(torch.tensor([0, 2]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="whole run"):
        causal.whole(n + 1)


def _nan_lse(t: dict[str, torch.Tensor]) -> None:
    t["blocks.0.attn.lse"][1, 3] = float("nan")


def _inf_q(t: dict[str, torch.Tensor]) -> None:
    t["blocks.1.attn.hook_rot_q"][0, 0, 0] = float("inf")


def _inf_prob(t: dict[str, torch.Tensor]) -> None:
    t["predictions.top_probs"][0, 0] = float("-inf")


@pytest.mark.parametrize(("edit", "tensor"), [(_nan_lse, "blocks.0.attn.lse"), (_inf_q, "blocks.1.attn.hook_rot_q"),
                                              (_inf_prob, "predictions.top_probs")])
def test_a_nan_or_an_infinity_in_any_float_tensor_is_refused(edit: Callable[[dict[str, torch.Tensor]], None],
                                                            tensor: str) -> None:
    """#36: such a file was stored and its rows came back as zeros; now it is refused, naming the tensor."""
    with pytest.raises(BadRunFile) as err:
        read(_resaved(tensors=edit), max_bytes=MAX)
    assert err.value.code == "run_file_not_finite" and err.value.params["tensor"] == tensor


def _script_prefix(header: dict[str, Any]) -> None:
    header["text"] = "<script>alert(1)</script>" + header["text"]  # no token covers it


def _huge_text(header: dict[str, Any]) -> None:
    header["text"] = header["text"] + "x" * (15 << 20)  # 15 MiB of text after the last token


def _gap(header: dict[str, Any]) -> None:
    header["tokens"][3][2] += 1  # token 3 starts a character late: one character belongs to no token


@pytest.mark.parametrize("edit", [_script_prefix, _huge_text, _gap])
def test_tokens_that_do_not_rebuild_the_text_are_refused(edit: Callable[[dict[str, Any]], None]) -> None:
    with pytest.raises(BadRunFile) as err:
        read(_resaved(run=edit), max_bytes=MAX)
    assert err.value.code == "run_file_text_mismatch", err.value.message
    assert "rebuild" in err.value.message or "belongs to no token" in err.value.message


def test_a_good_file_still_reads_and_its_last_position_keeps_its_nan() -> None:
    """The one NaN a run file holds on purpose: the probability of a next token the last position lacks."""
    stored = read(_good(), max_bytes=MAX)
    assert stored.record.summary.predictions[-1].actual_next is None
