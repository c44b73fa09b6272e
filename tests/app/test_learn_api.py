"""The Learn views' endpoints return the model's own numbers."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.names import act_name
from attnscope.model.learn import embedding, timing, values
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.services.engine import Engine
from tests.support.tiny import ARCHS, make_engine


def analyse(client: TestClient, text: str, **extra: object) -> dict:
    r = client.post("/api/runs", json={"text": text, **extra})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_rebuild_the_attention_output(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    """sum_h sum_j a_hij (v_j^h W_O^h) + bias == hook_attn_out: the per-head values are right."""
    lm = tiny_models[arch]
    ids = ids_tensor(tokenize(lm.tokenizer, "the cat sat on the mat and the dog sat too"))
    acts = run_with_cache(lm, ids)
    for layer in range(lm.info.n_layers):
        v, w_o = values.value_vectors(lm, layer, ids)  # (H, n, dh), (H, dh, d)
        pattern = acts[act_name("pattern", layer)]  # (H, n, n)
        mixed = torch.einsum("hqk,hkd->hqd", pattern, v)  # (H, n, dh)
        out = torch.einsum("hqd,hde->qe", mixed, w_o)  # (n, d)
        block = lm.blocks[layer]
        proj = block.get_submodule(lm.spec.out_proj)
        if getattr(proj, "bias", None) is not None:
            out = out + proj.bias
        torch.testing.assert_close(out, acts[act_name("attn_out", layer)], atol=1e-5, rtol=1e-4)


def test_contributions(client: TestClient) -> None:
    run = analyse(client, "I love artificial intelligence")
    body = client.get(f"/api/runs/{run['run_id']}/contributions", params={"layer": 1, "head": 2, "position": 3}).json()
    assert len(body["weights"]) == len(body["value_norms"]) == len(body["contributions"]) == 4
    assert sum(body["weights"]) == pytest.approx(1, abs=1e-5)
    np.testing.assert_allclose(body["contributions"], np.array(body["weights"]) * np.array(body["value_norms"]), rtol=1e-5)
    bad = client.get(f"/api/runs/{run['run_id']}/contributions", params={"layer": 1, "head": 2, "position": 40})
    assert bad.status_code == 422 and "positions 0.." in bad.json()["message"]


def test_contribution_gaps(client: TestClient) -> None:
    run = analyse(client, "I love artificial intelligence")
    body = client.get(f"/api/runs/{run['run_id']}/contribution-gaps", params={"position": 3}).json()
    assert len(body["heads"]) == 2 * 4  # tiny-gpt2: 2 layers x 4 heads
    one = client.get(f"/api/runs/{run['run_id']}/contributions", params={"layer": 1, "head": 2, "position": 3}).json()
    w, c = np.array(one["weights"]), np.array(one["contributions"])
    gap = next(h for h in body["heads"] if (h["layer"], h["head"]) == (1, 2))
    assert gap["gap"] == pytest.approx(0.5 * np.abs(w - c / c.sum()).sum(), abs=1e-5)
    assert gap["top_weight"] == int(w.argmax()) and gap["top_share"] == int(c.argmax())
    bad = client.get(f"/api/runs/{run['run_id']}/contribution-gaps", params={"position": 9})
    assert bad.status_code == 422 and "positions 0..3" in bad.json()["message"]


def test_untrained_rows_are_found(tiny_models: dict[str, LoadedModel]) -> None:
    """A block of near-parallel rows (what training leaves for tokens it never saw) is flagged;
    random rows are not."""
    lm = tiny_models["gpt2"]
    assert not embedding.untrained_rows(lm).any()
    E = lm.model.get_input_embeddings().weight
    saved = E.detach().clone()
    try:
        with torch.no_grad():
            common = torch.randn(E.shape[1])
            E[100:110] = common + 0.01 * torch.randn(10, E.shape[1])
        embedding._untrained.clear()
        flags = embedding.untrained_rows(lm)
        assert flags[100:110].all() and int(flags.sum()) == 10
        info = embedding.neighbours(lm, 104, 3)
        assert info.untrained and info.untrained_count == 10
        assert all(r.untrained for r in info.adjacent) and info.neighbours[0].untrained
        assert abs(info.random_mean) < 0.2  # random pairs of trained rows only
    finally:
        with torch.no_grad():
            E.copy_(saved)
        embedding._untrained.clear()


def test_embedding_neighbours(client: TestClient, engine: Engine) -> None:
    body = client.get("/api/models/tiny-gpt2/embedding", params={"id": 173, "top": 5}).json()
    lm = engine.model("tiny-gpt2")
    E = lm.model.get_input_embeddings().weight
    assert body["vector"] == pytest.approx(E[173].tolist(), abs=1e-6) and len(body["vector"]) == 32
    cos = [n["cos"] for n in body["neighbours"]]
    assert cos == sorted(cos, reverse=True) and 173 not in [n["id"] for n in body["neighbours"]]
    assert [a["id"] for a in body["adjacent"]] == [172, 174]
    expected = torch.nn.functional.cosine_similarity(E[173], E[174], dim=0).item()
    assert body["adjacent"][1]["cos"] == pytest.approx(expected, abs=1e-5)
    double = torch.nn.functional.cosine_similarity(E[173], E[346], dim=0).item()
    assert [d["id"] for d in body["double"]] == [346] and body["double"][0]["cos"] == pytest.approx(double, abs=1e-5)
    assert body["untrained"] is False and body["untrained_count"] == 0  # random rows: none alike
    assert client.get("/api/models/tiny-gpt2/embedding", params={"id": 15000}).json()["double"] == []
    r = client.get("/api/models/tiny-gpt2/embedding", params={"id": 10**6})
    assert r.status_code == 422 and f"0..{lm.info.vocab_size - 1}" in r.json()["message"]
    assert client.get("/api/models/nope/embedding", params={"id": 1}).status_code == 404


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-qwen2", "tiny-gpt_neox", "minilm-l6"])
def test_anatomy_adds_up(client: TestClient, engine: Engine, name: str) -> None:
    body = client.get(f"/api/models/{name}/anatomy").json()
    parts = sum(row["attention"] + row["mlp"] + row["norms"] for row in body["per_layer"])
    parts += body["token_embedding"] + body["position_embedding"] + body["final_norm_and_other"] + body["lm_head"]
    assert parts == body["total"] == engine.model(name).info.n_params
    assert all(row["attention"] > 0 and row["mlp"] > 0 for row in body["per_layer"])
    if name == "tiny-gpt2":
        d = 32
        assert body["per_layer"][0]["attention"] == 4 * d * d + 4 * d  # c_attn (d x 3d + 3d) + c_proj (d x d + d)
        assert body["lm_head_tied"] and body["lm_head"] == 0


def test_positions(client: TestClient) -> None:
    learned = client.get("/api/models/tiny-gpt2/positions", params={"count": 16}).json()
    assert learned["kind"] == "learned" and len(learned["matrix"]) == 16 and len(learned["matrix"][0]) == 32
    assert learned["similarity"][3][3] == pytest.approx(1, abs=1e-5)
    rotary = client.get("/api/models/tiny-llama/positions", params={"count": 16}).json()
    assert rotary["kind"] == "rotary" and len(rotary["inv_freq"]) == rotary["rotary_dims"] // 2 == 4
    assert rotary["inv_freq"][0] == pytest.approx(1.0)


def test_timing(client: TestClient) -> None:
    body = client.post("/api/timing", json={"text": "I love artificial intelligence", "repeats": 3}).json()
    n = body["n"]
    assert len(body["serial_cache_ms"]) == len(body["serial_no_cache_ms"]) == len(body["tokens"]) == n
    assert body["parallel_ms"] > 0 and body["repeats"] == 3
    assert len(body["parallel_runs_ms"]) == len(body["cache_totals_ms"]) == len(body["no_cache_totals_ms"]) == 3
    assert body["parallel_ms"] == pytest.approx(sorted(body["parallel_runs_ms"])[1])  # the median
    long = client.post("/api/timing", json={"text": "I love artificial intelligence", "repeat_to": 10, "repeats": 1}).json()
    assert long["n"] == 10 and long["tokens"][4:8] == long["tokens"][:4]
    r = client.post("/api/timing", json={"text": " ".join(["w"] * 80)})
    assert r.status_code == 422 and "at most 32" in r.json()["message"]
    assert client.post("/api/timing", json={"text": "hi", "model": "minilm-l6"}).status_code == 422


def test_compare_same_tokens_other_order(client: TestClient) -> None:
    a = analyse(client, "dog bites man")
    b = analyse(client, "man bites dog")
    body = client.get("/api/compare", params={"a": a["run_id"], "b": b["run_id"]}).json()
    a_ids, b_ids = [t["id"] for t in a["tokens"]], [t["id"] for t in b["tokens"]]
    for t in body["tokens"]:  # matched by id only: "dog" and " dog" are different tokens
        assert (t["b"] is None) == (a_ids[t["a"]] not in b_ids)
        assert t["b"] is None or b_ids[t["b"]] == a_ids[t["a"]]
        assert len(t["cos_by_stage"]) == (0 if t["b"] is None else 3) and all(-1 <= c <= 1 + 1e-6 for c in t["cos_by_stage"])
    assert body["stages"] == ["embed", "block 0", "block 1"]
    assert len(body["heads"]) == 8 and all(0 <= h["diff"] <= 1 for h in body["heads"])
    c = analyse(client, "the dog bites the man")
    d = analyse(client, "the man bites the dog")
    body = client.get("/api/compare", params={"a": c["run_id"], "b": d["run_id"]}).json()
    moved = [t for t in body["tokens"] if t["b"] is not None and t["a"] != t["b"]]
    assert moved and all(t["cos_by_stage"][0] < 0.999 for t in moved)  # another position vector added
    same = client.get("/api/compare", params={"a": c["run_id"], "b": c["run_id"]}).json()
    assert all(t["cos"] == pytest.approx(1, abs=1e-5) for t in same["tokens"]) and all(h["diff"] < 1e-6 for h in same["heads"])
    enc = analyse(client, "dog bites man", model="minilm-l6")
    assert client.get("/api/compare", params={"a": a["run_id"], "b": enc["run_id"]}).status_code == 422


class RecordingLock:
    """A lock that records each acquire and release, for checking who holds it when."""

    def __init__(self, events: list[str]) -> None:
        self.inner = threading.Lock()
        self.events = events

    def locked(self) -> bool:
        return self.inner.locked()

    def acquire(self) -> bool:
        self.inner.acquire()
        self.events.append("acquire")
        return True

    def release(self) -> None:
        self.events.append("release")
        self.inner.release()

    def __enter__(self) -> RecordingLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


@pytest.mark.parametrize("turn_s", [0.0, 1e9])
def test_timing_holds_the_model_lock_a_turn_at_a_time(tiny_models: dict[str, LoadedModel],
                                                      monkeypatch: pytest.MonkeyPatch, turn_s: float) -> None:
    """Every forward of a timing runs under the model's lock, and the lock is given up between two
    forwards once it has been held HANDOFF_AFTER_S (0: between every two; 1e9: never)."""
    monkeypatch.setattr(timing, "HANDOFF_AFTER_S", turn_s)
    monkeypatch.setattr(timing, "HANDOFF_S", 0.0)
    events: list[str] = []
    lock = RecordingLock(events)
    lm = replace(tiny_models["gpt2"], lock=lock)  # type: ignore[arg-type]
    held: list[bool] = []

    def forward(*_args: object) -> None:
        held.append(lock.locked())
        events.append("forward")

    handle = lm.model.register_forward_pre_hook(forward)
    try:
        result = timing.parallel_vs_serial(lm, ids_tensor(tokenize(lm.tokenizer, "one two three four")), repeats=2)
    finally:
        handle.remove()
    assert result.repeats == 2 and held and all(held)
    forwards = events.count("forward")
    turns = "".join("a" if e == "acquire" else "r" if e == "release" else "f" for e in events)
    if turn_s == 0.0:
        assert "ff" not in turns and turns.count("a") == forwards + 1  # a turn before every forward
    else:
        assert turns == "a" + "f" * forwards + "r"  # one turn: nobody asked for the model


def test_another_request_runs_in_the_middle_of_a_long_timing(
        client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long timing no longer holds the model until it ends: a run that waits for the model gets in
    between two of its forwards (its forward comes before the timing's last ones)."""
    monkeypatch.setattr(timing, "HANDOFF_S", 10.0)  # a generous wait for the waiting thread: no race
    monkeypatch.setattr(timing, "HANDOFF_AFTER_S", 0.05)  # turns far shorter than the timing, on any machine
    lm = engine.model("tiny-gpt2")
    started = threading.Event()
    other: list[int] = []
    order: list[str] = []

    def record(*_args: object) -> None:
        order.append("run" if threading.get_ident() in other else "timing")
        if order[-1] == "run":  # nobody waits any more: the rounds left need not wait for anyone
            timing.HANDOFF_S = 0.0
        started.set()

    def run_meanwhile() -> None:
        other.append(threading.get_ident())
        started.wait(timeout=60)
        engine.analyse("a run that waits for the model", "tiny-gpt2")

    handle = lm.model.register_forward_pre_hook(record)
    waiting = threading.Thread(target=run_meanwhile)
    try:
        waiting.start()
        r = client.post("/api/timing", json={"text": "one two three four five six seven eight",
                                             "repeat_to": 32, "repeats": 3})
        waiting.join(timeout=60)
    finally:
        handle.remove()
    assert r.status_code == 200 and r.json()["repeats"] == 3
    assert "run" in order, "the run never got the model"
    assert order[-1] == "timing" and order.index("run") < len(order) - 32  # the timing went on after it


def reference_twin_counts(E: torch.Tensor) -> torch.Tensor:
    """The sweep as it was: every row block against all V rows."""
    unit = torch.nn.functional.normalize(E.detach().float(), dim=-1)
    return torch.cat([((unit[s : s + 1024] @ unit.T) >= embedding.TWIN_COS).sum(-1) - 1
                      for s in range(0, unit.shape[0], 1024)])


def test_twin_counts_match_the_full_sweep() -> None:
    """The half sweep (each pair of blocks once, counted both ways) counts what the full one did,
    twins inside a block and across blocks alike."""
    torch.manual_seed(3)
    E = torch.randn(2600, 24)  # (V, d): three blocks, the last one short
    common = torch.randn(24)
    for rows in (slice(10, 14), slice(1020, 1030), slice(2590, 2600)):  # within, across and at the end
        E[rows] = common + 0.01 * torch.randn(rows.stop - rows.start, 24)
    E[500] = 0  # a zero row is no one's twin, not even its own
    counts = embedding.twin_counts(E)
    assert torch.equal(counts, reference_twin_counts(E))
    assert int((counts >= embedding.MIN_TWINS).sum()) == 24 and int(counts[500]) == -1


def test_the_embedding_answer_is_unchanged_and_warmed_up_before_the_first_request(
        tiny_models: dict[str, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_models["gpt2"]
    engine = make_engine({"tiny-gpt2": lm, "renamed": lm}, "tiny-gpt2")  # a renamed copy shares the model
    monkeypatch.setattr(embedding, "_untrained", {})  # as at start-up: nothing computed yet
    sweeps: list[int] = []
    sweep = embedding.twin_counts

    def counted(E: torch.Tensor, stop: threading.Event | None = None) -> torch.Tensor:
        sweeps.append(E.shape[0])
        return sweep(E, stop)

    monkeypatch.setattr(embedding, "twin_counts", counted)
    engine.warm_up().join(timeout=120)
    assert len(sweeps) == 1  # once per model
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2"), engine)) as client:
        body = client.get("/api/models/tiny-gpt2/embedding", params={"id": 173, "top": 5}).json()
    assert len(sweeps) == 1  # the request computed nothing again
    flags = reference_twin_counts(lm.model.get_input_embeddings().weight) >= embedding.MIN_TWINS
    assert body["untrained"] == bool(flags[173]) and body["untrained_count"] == int(flags.sum())
    assert [n["untrained"] for n in body["neighbours"]] == [bool(flags[n["id"]]) for n in body["neighbours"]]


def test_a_sweep_past_the_start_up_budget_is_left_to_its_first_request(
        tiny_models: dict[str, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up runs the embedding sweep only where it is cheap (both bundled models); a large
    vocabulary's V x V sweep (minutes of CPU at every start) waits for a request that wants it."""
    from attnscope.model.load.models import BUNDLED_DIR, load_model

    bundled = load_model("attnscope-tiny", str(BUNDLED_DIR / "attnscope-tiny"))
    assert embedding.sweep_flops(bundled) <= embedding.WARM_FLOPS  # the shipped models are warmed at start
    lm = tiny_models["gpt2"]
    monkeypatch.setattr(embedding, "_untrained", {})
    monkeypatch.setattr(embedding, "WARM_FLOPS", embedding.sweep_flops(lm) - 1)
    assert embedding.warm(lm) is False and embedding._untrained == {}  # nothing swept at start-up
    assert embedding.untrained_rows(lm).shape[0] == lm.info.vocab_size  # the request computes it


def test_a_request_during_the_warm_up_waits_for_it_instead_of_sweeping_again(
        tiny_models: dict[str, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_models["llama"]
    monkeypatch.setattr(embedding, "_untrained", {})
    inside, go = threading.Event(), threading.Event()
    sweeps: list[str] = []
    sweep = embedding.twin_counts

    def held(E: torch.Tensor, stop: threading.Event | None = None) -> torch.Tensor:
        sweeps.append(threading.current_thread().name)
        inside.set()
        go.wait(timeout=60)
        return sweep(E, stop)

    monkeypatch.setattr(embedding, "twin_counts", held)
    warming = threading.Thread(target=embedding.warm, args=(lm,), name="warm")
    warming.start()
    assert inside.wait(timeout=60)
    answers: list[torch.Tensor] = []
    asking = threading.Thread(target=lambda: answers.append(embedding.untrained_rows(lm)), name="request")
    asking.start()
    go.set()
    warming.join(timeout=60)
    asking.join(timeout=60)
    assert sweeps == ["warm"] and len(answers) == 1
    assert answers[0] is embedding.untrained_rows(lm)  # the warm-up's own answer


def test_closing_the_engine_stops_its_warm_up(tiny_models: dict[str, LoadedModel],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A server shutting down mid-sweep stops it between two blocks (a daemon thread left inside torch
    at exit aborts the process) and keeps no half answer: the next request computes it whole."""
    lm = tiny_models["gpt_neox"]
    engine = make_engine({"m": lm}, "m")
    monkeypatch.setattr(embedding, "_untrained", {})
    inside = threading.Event()
    sweep = embedding.twin_counts

    def slow(E: torch.Tensor, stop: threading.Event | None = None) -> torch.Tensor:
        inside.set()
        assert stop is not None and stop.wait(timeout=60)  # until the engine closes
        return sweep(E, stop)

    monkeypatch.setattr(embedding, "twin_counts", slow)
    thread = engine.warm_up()
    assert inside.wait(timeout=60)
    engine.close()
    assert not thread.is_alive() and embedding._untrained == {}
    monkeypatch.setattr(embedding, "twin_counts", sweep)
    assert embedding.untrained_rows(lm).shape == (lm.info.vocab_size,)
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(embedding.Stopped):
        embedding.twin_counts(torch.randn(8, 4), stopped)


def test_a_timing_over_its_budget_is_refused_with_the_estimate_before_any_work(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """#36: the timing lesson estimates its work from two probe forwards and refuses above the budget,
    naming the numbers; the schema's maxima are what the server serves (33 tokens, 6 repeats: 422)."""
    from attnscope.model.learn import timing as timing_lesson
    from attnscope.model.services import learn as learn_service

    ran: list[int] = []
    real = timing_lesson.parallel_vs_serial
    monkeypatch.setattr(timing_lesson, "parallel_vs_serial", lambda *a, **k: ran.append(1) or real(*a, **k))
    monkeypatch.setattr(learn_service, "TIMING_BUDGET_S", 0.001)  # any timing is over it
    started = time.monotonic()
    r = client.post("/api/timing", json={"text": "The cat sat on the mat", "repeat_to": 32, "repeats": 5})
    assert r.status_code == 422 and r.json()["code"] == "timing_over_budget", r.text
    params = r.json()["params"]
    assert params["tokens"] == 32 and params["repeats"] == 5 and params["forwards"] == 6 * 65
    assert params["seconds"] > 0 and "about" in r.json()["message"] and not ran
    assert time.monotonic() - started < 5  # refused after the probes, not after the work
    for body in ({"text": "x", "repeat_to": 33}, {"text": "x", "repeats": 6}):
        assert client.post("/api/timing", json=body).status_code == 422
    schema = client.get("/openapi.json").json()["components"]["schemas"]["TimingRequest"]["properties"]
    assert schema["repeats"]["maximum"] == 5 and schema["repeat_to"]["anyOf"][0]["maximum"] == 32
