"""Head scores that follow the analyse (model/runs/late.py): the analyse answers after its forward
with a fused layer's scores pending, a background sweep computes them exactly (equal to the scores of
``output_attentions=True``), the API says which are pending and hands them out when ready, and a run
evicted before its scores are in is skipped without harm."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import RunNotFound
from attnscope.model.load.models import LoadedModel, wrap_model
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.runs import late as late_module
from attnscope.model.runs.budget import estimate
from attnscope.model.runs.late import STOPPED
from attnscope.model.scores import analysis, live, pairs
from attnscope.model.services.engine import Engine
from tests.support.families import DECODERS, Family
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat; the cat sat on the hat. " * 2  # 96 tokens: within the families' 128 positions
WAIT = 60.0
ALL = ("entropy", "max", "prev_token", "first_token", "induction")  # what a fused layer owes after the analyse


def _lm(family: Family) -> LoadedModel:
    return wrap_model(f"tiny-{family.id}", family.build("eager"), tiny_tokenizer(), source=f"config:{family.id}")


def _reference(lm: LoadedModel, ids: torch.Tensor) -> list[analysis.HeadScore]:
    """Every head's scores from the family's own eager weights (output_attentions=True)."""
    model = lm.model
    with lm.lock:
        model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                attentions = model(input_ids=ids[None], output_attentions=True).attentions
        finally:
            model.set_attn_implementation(lm.spec.attn_implementation)
    return [s for i, a in enumerate(attentions) for s in analysis.head_scores(i, a[0].float(), ids)]


class Gate:
    """Holds the score worker before each layer until opened (``ScoreWorker.pause``)."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __call__(self) -> None:
        assert self.open.wait(WAIT), "the test never opened the gate"


@pytest.fixture
def llama() -> Iterator[tuple[Engine, LoadedModel]]:
    lm = _lm(next(f for f in DECODERS if f.id == "llama"))
    engine = make_engine({lm.info.name: lm}, lm.info.name)
    yield engine, lm
    engine.close()


# one family per attention path (the whole table's patterns are tests/model/test_families.py's): the fused kernel
# (gpt2, llama), fused layers beside windowed ones (qwen2), a window everywhere (mistral), soft-capping (gemma2),
# ALiBi (bloom), a family read from its module (gpt_neo), parallel blocks with partial rotary (phi)
PATHS = ("gpt2", "llama", "qwen2", "mistral", "gemma2", "bloom", "gpt_neo", "phi")


@pytest.mark.parametrize("route", ["pair sums", "dense"])
@pytest.mark.parametrize("family", [f for f in DECODERS if f.id in PATHS], ids=lambda f: f.id)
def test_late_scores_equal_output_attentions(family: Family, route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the analyse answers at once and what follows are the eager scores, on every attention path, by
    either route of a fused layer (``model.scores.live.complete``: the pair sums, or a small layer's weights)."""
    if route == "pair sums":  # these runs' layers are small: the dense route's unless told otherwise
        monkeypatch.setattr(live, "DENSE_CELLS", 0)
    lm = _lm(family)
    engine = make_engine({lm.info.name: lm}, lm.info.name)
    try:
        result = engine.analyse(TEXT)
        first = result.record.summary
        ids = ids_tensor(tokenize(lm.tokenizer, TEXT))
        want = _reference(lm, ids)
        for got, ref in zip(first.heads, want, strict=True):  # what the response carries
            late = got.entropy is None  # a fused layer owes every score; a block-path layer has them all
            for field in ("entropy", "prev_token", "first_token", "max", "induction"):
                if late:
                    assert getattr(got, field) is None and field in first.scores_pending, (got, field)
                else:
                    assert getattr(got, field) == pytest.approx(getattr(ref, field), abs=1e-5), (got, field)
        assert bool(first.scores_pending) == any(h.entropy is None for h in first.heads)
        done = engine.wait_scores(result.run_id, WAIT).summary
        assert done.scores_pending == ()
        for got, ref in zip(done.heads, want, strict=True):
            for field in ("entropy", "prev_token", "first_token", "max", "induction"):
                assert getattr(got, field) == pytest.approx(getattr(ref, field), abs=1e-5), (got, field)
        if first.scores_pending:
            assert "exact_scores" not in first.timing_ms and {"exact_scores", "scores_ready"} <= set(done.timing_ms)
    finally:
        engine.close()


def test_the_fused_path_leaves_its_scores_and_the_run_does_not_grow(llama: tuple[Engine, LoadedModel]) -> None:
    engine, lm = llama
    gate = Gate()
    engine.scores.pause = gate
    result = engine.analyse(TEXT)
    s = result.record.summary
    assert s.scores_pending == ALL and all(h.entropy is h.max is h.prev_token is h.first_token is h.induction is None
                                           for h in s.heads)
    assert {"forward", "total"} <= set(s.timing_ms) and "exact_scores" not in s.timing_ms
    counted, kept = engine.store.nbytes, result.record.nbytes
    assert kept == estimate(lm, len(s.tokens), 10).keep  # the pending heads are counted as complete ones
    gate.open.set()
    done = engine.wait_scores(result.run_id, WAIT)
    assert done is result.record and done.summary.scores_pending == ()
    assert all(None not in (h.entropy, h.max, h.prev_token, h.first_token, h.induction) for h in done.summary.heads)
    assert engine.store.nbytes == counted and done.nbytes == kept  # nothing attached, nothing grew
    assert engine.scores.wait_idle(WAIT) and engine.scores.pending() == 0


def test_a_run_evicted_before_its_scores_is_skipped(llama: tuple[Engine, LoadedModel]) -> None:
    _, lm = llama
    n = len(tokenize(lm.tokenizer, TEXT))
    engine = make_engine({lm.info.name: lm}, lm.info.name, store_bytes=estimate(lm, n, 10).keep * 3 // 2)
    gate = Gate()
    engine.scores.pause = gate
    try:
        old = engine.analyse(TEXT)
        new = engine.analyse(TEXT + "!")  # the cache holds one run: the first is evicted, its scores still owed
        assert not engine.store.holds(old.run_id, old.record) and len(engine.store) == 1
        gate.open.set()
        with pytest.raises(RunNotFound) as err:
            engine.wait_scores(old.run_id, WAIT)
        assert err.value.expired
        assert engine.wait_scores(new.run_id, WAIT).summary.scores_pending == ()
        assert engine.scores.wait_idle(WAIT)
        assert old.record.summary.scores_pending == ALL  # the evicted run was left alone
        assert old.record.pending is not None and old.record.pending.done.is_set() and old.record.pending.error is None
        assert engine.store.nbytes == new.record.nbytes
    finally:
        engine.close()


def test_the_api_marks_pending_scores_and_hands_them_out(llama: tuple[Engine, LoadedModel]) -> None:
    engine, lm = llama
    settings = Settings(models={}, default_model=lm.info.name)
    with TestClient(create_app(settings, engine)) as client:
        gate = Gate()
        engine.scores.pause = gate  # after the lifespan's own (the tile prefetch's wait)
        r = client.post("/api/runs", json={"text": TEXT})
        assert r.status_code == 201
        run = r.json()
        rid = run["run_id"]
        assert run["scores_pending"] == list(ALL)
        assert all(h[f] is None for h in run["heads"] for f in ALL)
        assert "exact_scores" not in run["timing_ms"]
        early = client.get(f"/api/runs/{rid}/heads")
        assert early.status_code == 202 and early.json()["scores_pending"] == list(ALL)
        assert client.get(f"/api/runs/{rid}/heads", params={"wait": 0.2}).status_code == 202  # time up, still owed
        gate.open.set()
        late = client.get(f"/api/runs/{rid}/heads", params={"wait": WAIT})
        assert late.status_code == 200, late.text
        body = late.json()
        assert body["scores_pending"] == [] and body["error"] is None
        assert {"exact_scores", "scores_ready"} <= set(body["timing_ms"])
        want = _reference(lm, ids_tensor(tokenize(lm.tokenizer, TEXT)))
        for got, ref in zip(body["heads"], want, strict=True):
            assert got["entropy"] == pytest.approx(ref.entropy, abs=1e-5)
            assert got["max"] == pytest.approx(ref.max, abs=1e-5)
            assert got["prev_token"] == pytest.approx(ref.prev_token, abs=1e-5)
        again = client.get(f"/api/runs/{rid}").json()  # the run itself now carries them too
        assert again["scores_pending"] == [] and again["heads"] == body["heads"]
        assert client.get("/api/runs/nope/heads").status_code == 404
        assert client.get(f"/api/runs/{rid}/heads", params={"wait": 61}).status_code == 422
        assert client.get(f"/api/runs/{rid}/heads", params={"wait": -1}).status_code == 422


def test_a_failed_sweep_is_reported_not_pending_forever(llama: tuple[Engine, LoadedModel],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    engine, lm = llama

    def broken(*_args: object) -> list[analysis.HeadScore]:
        raise RuntimeError("out of paper")

    monkeypatch.setattr(late_module, "layer_scores", broken)
    with TestClient(create_app(Settings(models={}, default_model=lm.info.name), engine)) as client:
        rid = client.post("/api/runs", json={"text": TEXT}).json()["run_id"]
        r = client.get(f"/api/runs/{rid}/heads", params={"wait": WAIT})
        assert r.status_code == 200
        body = r.json()
        assert body["scores_pending"] == list(ALL) and "out of paper" in body["error"]
        assert all(h["entropy"] is None for h in body["heads"])
        assert client.get("/api/models").status_code == 200  # the server goes on


def test_closing_the_engine_says_the_scores_will_not_come(llama: tuple[Engine, LoadedModel]) -> None:
    engine, _ = llama
    gate = Gate()
    engine.scores.pause = gate
    result = engine.analyse(TEXT)
    closing = threading.Thread(target=engine.close)
    closing.start()  # while the worker waits before its first layer
    gate.open.set()
    closing.join(WAIT)
    assert not closing.is_alive()
    pending = result.record.pending
    assert pending is not None and pending.done.is_set() and pending.error == STOPPED
    assert engine.wait_scores(result.run_id, 0).summary.scores_pending == ALL


@pytest.mark.parametrize("route", ["pair sums", "dense"])
def test_the_sweep_yields_inside_a_layer_not_only_between_layers(llama: tuple[Engine, LoadedModel], route: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A tile request that arrives mid-sweep waits for a part of a layer (the induction sums, a block of rows
    of the entropy and peak pass; a block of weights), not for the whole layer: the worker's pause is called
    between them."""
    engine, lm = llama
    if route == "pair sums":  # this run's layers are small: the dense route's unless told otherwise
        monkeypatch.setattr(live, "DENSE_CELLS", 0)
    calls: list[str] = []
    engine.scores.pause = lambda: calls.append(threading.current_thread().name)
    result = engine.analyse(TEXT)
    pending = result.record.summary.scores_pending
    done = engine.wait_scores(result.run_id, WAIT).summary
    assert pending and done.scores_pending == ()
    n = len(result.record.summary.tokens)
    row_blocks = -(-n // pairs.PAUSE_ROWS)  # entropy_and_peak pauses before each block of these rows
    # per layer: before it, then (pair sums) before the induction sums, before entropy and peak's pass and
    # before each block of its rows, or (dense) before its one block of weights
    assert len(calls) == lm.info.n_layers * (3 + row_blocks if route == "pair sums" else 2), len(calls)
    assert calls and all(c.startswith("attnscope-scores") for c in calls)  # the worker's threads, never the request's
    ids = ids_tensor(tokenize(lm.tokenizer, TEXT))
    for got, ref in zip(done.heads, _reference(lm, ids), strict=True):  # the same exact scores
        assert got.entropy == pytest.approx(ref.entropy, abs=1e-5) and got.max == pytest.approx(ref.max, abs=1e-5)
