"""The corpus survey on the bundled model: its means are the means of per-document analyses, its
examples point at real positions with their real weights, a stopped survey resumes to the same result,
long documents are cut into windows, and hostile corpus files get clear errors naming the line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import attnscope
from attnscope.model.errors import BadInput
from attnscope.model.services import survey as survey_service
from attnscope.model.survey import corpus, file
from attnscope.model.survey.stats import FIELDS, Survey

TEXTS = [
    "The cat sat on the mat. The cat sat on the mat.",
    "Once upon a time there was a little girl who lived in a village near the forest.",
    "My friend John lives in the city. My friend John lives in the",
    "Tom and Mary went to the market. Tom bought apples and Mary bought pears.",
]


@pytest.fixture(scope="module")
def scope() -> attnscope.Scope:
    model = AutoModelForCausalLM.from_pretrained(attnscope.BUNDLED)
    return attnscope.Scope(model, AutoTokenizer.from_pretrained(attnscope.BUNDLED))


@pytest.fixture(scope="module")
def surveyed(scope: attnscope.Scope) -> Survey:
    return scope.survey(TEXTS, top_k=4)


def test_means_are_the_means_of_per_document_analyses(scope: attnscope.Scope, surveyed: Survey) -> None:
    runs = [scope.run(text) for text in TEXTS]
    per_doc = [{(h.layer, h.head): h for h in run.heads()} for run in runs]
    assert surveyed.documents == surveyed.sequences == len(TEXTS)
    assert surveyed.tokens == sum(len(run.tokens) for run in runs)
    for head in surveyed.heads:
        for name in FIELDS[:-1]:  # the analysis's own scores
            values = [getattr(d[(head.layer, head.head)], name) for d in per_doc]
            defined = [v for v in values if v is not None]
            stat = getattr(head, name)
            assert stat.count == len(defined), (name, head.layer, head.head)
            if defined:
                assert stat.mean == pytest.approx(sum(defined) / len(defined), abs=1e-6)
            if len(defined) > 1:
                mean = sum(defined) / len(defined)
                std = math.sqrt(sum((v - mean) ** 2 for v in defined) / (len(defined) - 1))
                assert stat.std == pytest.approx(std, abs=1e-6)
    # self-attention: each token's weight on itself, from the exact pattern
    for layer, head in ((0, 1), (4, 0)):
        diag = [float(run.attention(layer, head).diagonal().mean()) for run in runs]
        got = surveyed.heads[layer * surveyed.n_heads + head].self_attention
        assert got.mean == pytest.approx(sum(diag) / len(diag), abs=1e-5)
    grid = surveyed.means("prev_token")
    assert grid.shape == (surveyed.n_layers, surveyed.n_heads)
    assert surveyed.heads[0].induction_probe is not None  # the synthetic probe, stated apart


def test_examples_point_at_real_positions(scope: attnscope.Scope, surveyed: Survey) -> None:
    runs = {i: scope.run(text) for i, text in enumerate(TEXTS)}
    checked = 0
    for head in surveyed.heads:
        assert 0 < len(head.examples) <= surveyed.top_k
        weights = [e.weight for e in head.examples]
        assert weights == sorted(weights, reverse=True)
        for e in head.examples:
            run = runs[e.document]
            texts = [t.text for t in run.tokens]
            assert 1 <= e.key <= e.query < len(texts)
            assert e.tokens == texts[e.start: e.start + len(e.tokens)] and e.start <= e.query < e.start + len(e.tokens)
            assert e.key_tokens == texts[e.key_start: e.key_start + len(e.key_tokens)]
            pattern = run.attention(head.layer, head.head)
            assert e.weight == pytest.approx(float(pattern[e.query, e.key]), abs=1e-5)
            assert e.weight == pytest.approx(float(pattern[e.query, 1: e.query + 1].max()), abs=1e-5)
            checked += 1
    assert checked > 0
    induction = max(surveyed.heads, key=lambda h: h.induction.mean or 0.0)
    best = induction.examples[0]
    ids = scope.run(TEXTS[best.document]).record.input_ids.tolist()
    # the strongest induction example attends to the token after an earlier copy of the query's token
    assert ids[best.key - 1] == ids[best.query]


def test_a_stopped_survey_resumes_to_the_same_result(scope: attnscope.Scope, surveyed: Survey,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "s.survey"
    seen: list[int] = []

    def stop_after_two(p: survey_service.Progress) -> None:
        seen.append(p.documents)
        if p.documents == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        scope.call(survey_service.survey, texts=TEXTS, top_k=4, out=out, checkpoint_s=0.0, progress=stop_after_two)
    partial = attnscope.load(out)
    assert isinstance(partial, Survey) and not partial.complete and partial.documents == 1  # saved before the stop
    resumed = scope.survey(TEXTS, top_k=4, out=out, resume=True)
    assert resumed.complete and resumed.documents == len(TEXTS)
    for name in FIELDS:
        a, b = resumed.means(name), surveyed.means(name)
        assert torch.allclose(torch.nan_to_num(a, 9.0), torch.nan_to_num(b, 9.0), atol=1e-9), name
    assert [e.query for e in resumed.heads[32].examples] == [e.query for e in surveyed.heads[32].examples]
    again = attnscope.load(out)
    assert isinstance(again, Survey) and again.complete and torch.allclose(again.means("entropy"),
                                                                           resumed.means("entropy"))
    with pytest.raises(BadInput, match="another corpus, model or settings"):
        scope.survey(TEXTS, top_k=3, out=out, resume=True)


def test_long_documents_are_cut_into_windows(scope: attnscope.Scope) -> None:
    long = " ".join(TEXTS)
    n = len(scope.run(long).tokens)
    result = scope.survey([long], max_tokens=16, top_k=2)
    assert result.documents == 1 and result.sequences == math.ceil(n / 16) - (1 if n % 16 == 1 else 0)
    assert result.tokens <= n and result.max_tokens == 16
    assert all(e.offset % 16 == 0 and e.query < 16 for h in result.heads for e in h.examples)


def test_a_corpus_file_plain_and_json_lines(scope: attnscope.Scope, surveyed: Survey, tmp_path: Path) -> None:
    plain = tmp_path / "c.txt"
    plain.write_text("\n\n".join(TEXTS) + "\n\n\n", encoding="utf-8")
    lines = tmp_path / "c.jsonl"
    lines.write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(TEXTS)) + "\n", encoding="utf-8")
    for path in (plain, lines):
        docs = list(corpus.documents(path))
        assert [d.text for d in docs] == TEXTS
        result = scope.survey(path=path, top_k=4)
        assert result.source == path.name
        assert torch.allclose(result.means("entropy"), surveyed.means("entropy"), atol=1e-9)


@pytest.mark.parametrize(("content", "message"), [
    (b"\x00\x01binary\x00", "looks binary"),
    (b"one\n\xff\xfe broken\n", "line 2 is not UTF-8"),
    (b'{"text": "fine"}\n{"nope": 1}\n', "line 2 has no string field"),
    (b'{"text": "fine"}\n{"text": \n', "line 2 is not JSON"),
])
def test_hostile_corpus_files_get_clear_errors(scope: attnscope.Scope, tmp_path: Path, content: bytes,
                                               message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(BadInput, match=message):
        scope.survey(path=path)


def test_an_overlong_line_is_refused_without_reading_it_whole(scope: attnscope.Scope, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 1 << 16)  # a 1 GB line reads as this: the cap, then the refusal
    path = tmp_path / "huge.txt"
    with path.open("wb") as f:
        f.write(b"short first line\n")
        f.write(b"x" * (1 << 20))
    reads: list[int] = []
    real = corpus._lines

    def counting(p: Path, f: object) -> object:
        for item in real(p, f):  # type: ignore[arg-type]
            reads.append(item[2])
            yield item

    monkeypatch.setattr(corpus, "_lines", counting)
    with pytest.raises(BadInput, match="line 2 is longer than"):
        list(corpus.documents(path))
    assert reads == [17]  # the long line was never handed on


def test_empty_and_bad_settings(scope: attnscope.Scope, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n\n", encoding="utf-8")
    with pytest.raises(BadInput, match="no document"):
        scope.survey(path=empty)
    with pytest.raises(BadInput, match="top_k"):
        scope.survey(TEXTS, top_k=0)
    with pytest.raises(BadInput, match="max_tokens"):
        scope.survey(TEXTS, max_tokens=1)
    with pytest.raises(BadInput, match="no such file"):
        scope.survey(path=tmp_path / "missing.txt")
    not_survey = tmp_path / "x.survey"
    not_survey.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b" " * 14)
    with pytest.raises(BadInput, match="not a usable attnscope survey file"):
        file.read(not_survey)


def test_survey_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.app.cli import main

    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(TEXTS), encoding="utf-8")
    assert main(["survey", str(path), "--top-k", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "4 documents" in out and "strongest induction: L4H0" in out
    saved = attnscope.load(tmp_path / "c.survey.safetensors")
    assert isinstance(saved, Survey) and saved.top_k == 2
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x00" * 10)
    assert main(["survey", str(bad), "--quiet"]) == 1
    assert "looks binary" in capsys.readouterr().err


def test_a_survey_file_that_claims_too_much_is_refused_before_anything_is_built(surveyed: Survey,
                                                                                 tmp_path: Path) -> None:
    from safetensors.torch import save

    good = tmp_path / "good.survey"
    scope_file = tmp_path / "made.survey"
    from attnscope.model.survey.stats import Accumulator

    acc = Accumulator(surveyed.n_layers, surveyed.n_heads, 2)
    file.write(scope_file, acc, file.Header(model="m", source=None, corpus=None, max_tokens=8, complete=True,
                                            probe=None))
    assert file.read(scope_file)[0].n_layers == surveyed.n_layers
    for claim in ({"n_layers": 100_000, "n_heads": 10_000}, {"n_layers": -1}, {"top_k": 10**9}, {"n_heads": "8"}):
        meta = {"format": file.FORMAT, "model": "m", "source": None, "corpus": None, "max_tokens": 8, "top_k": 2,
                "complete": True, "fields": list(FIELDS), "n_layers": 2, "n_heads": 2, "documents": 0,
                "sequences": 0, "tokens": 0, "examples": [[], [], [], []], **claim}
        tensors = {k: torch.zeros(len(FIELDS), 2, 2, dtype=torch.float64) for k in ("count", "mean", "m2")}
        good.write_bytes(save(tensors, metadata={"attnscope": json.dumps(meta)}))
        with pytest.raises(BadInput, match="not a usable attnscope survey file"):
            file.read(good)
