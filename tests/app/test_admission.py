"""Bounded memory: what a run keeps is O(n x d) and known before its forward; what cannot be kept
is refused (413) before it runs; forwards in flight share a byte budget; the export of a long run
is what it keeps."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import TooLarge
from attnscope.model.load.models import LoadedModel
from attnscope.model.runs.budget import MemoryBudget, estimate, mib_over
from attnscope.model.runs.export import KeptRun
from attnscope.model.runs.record import RunStore
from attnscope.model.services.engine import Engine
from tests.support.tiny import make_engine


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_the_estimate_is_exactly_what_a_run_keeps(tiny_models: dict[str, LoadedModel], arch: str) -> None:
    lm = tiny_models[arch]
    engine = make_engine({lm.info.name: lm}, lm.info.name)
    sizes = []
    for words in (5, 40, 75):
        result = engine.analyse(" ".join(["tok"] * words), top_k=7)
        assert estimate(lm, result.record.n, 7).keep == result.record.nbytes
        sizes.append((result.record.n, result.record.nbytes))
        q, k = result.record.attention[0].q, result.record.attention[0].k  # K/V heads kept once, not repeated
        assert q.shape == (lm.info.n_heads, result.record.n, lm.info.d_head)
        assert k.shape == (lm.info.n_kv_heads, result.record.n, lm.info.d_head)
    (n0, b0), (n1, b1), (n2, b2) = sizes
    assert (b1 - b0) * (n2 - n1) == (b2 - b1) * (n1 - n0)  # linear in n: no n² term anywhere


def test_a_run_that_cannot_be_kept_is_413_before_its_forward_and_the_server_keeps_serving(
        tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["llama"]
    engine = make_engine({"m": lm}, "m")
    text = " ".join(["word"] * 230)
    n = len(lm.tokenizer(text)["input_ids"])
    cap = 1 << 20
    assert estimate(lm, n, 10).keep > cap
    engine.store.max_bytes = cap
    forwards = []
    handle = lm.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with TestClient(create_app(Settings(models={}, default_model="m", run_store_bytes=cap), engine)) as client:
            r = client.post("/api/runs", json={"text": text})
            assert r.status_code == 413
            keep, _ = mib_over(estimate(lm, n, 10).keep, cap)  # "1.2 MiB", never "1 MiB ... at most 1 MiB"
            assert r.json()["message"].startswith(f"this prompt's run would keep {keep} (")
            assert "the run store holds at most 1 MiB (ATTNSCOPE_RUN_STORE_BYTES)" in r.json()["message"]
            assert forwards == []  # refused before the forward
            assert client.post("/api/runs", json={"text": "word word"}).status_code == 201
            assert client.get("/api/health").json()["run_cache_bytes"] <= cap
    finally:
        handle.remove()


def test_the_store_never_keeps_a_run_above_its_cap(tiny_models: dict[str, LoadedModel]) -> None:
    engine = make_engine({"m": tiny_models["gpt2"]}, "m")
    run = engine.analyse("a b c d e f").record
    store = RunStore(run.nbytes - 1)
    with pytest.raises(TooLarge, match="ATTNSCOPE_RUN_STORE_BYTES"):
        store.add(run)
    assert len(store) == 0 and store.nbytes == 0


def test_a_forward_larger_than_the_budget_is_413(tiny_models: dict[str, LoadedModel]) -> None:
    lm = tiny_models["gpt2"]
    engine = Engine({"m": lm}, "m", RunStore(1 << 28), 1024, forward_bytes=1 << 20)
    with TestClient(create_app(Settings(models={}, default_model="m"), engine)) as client:
        r = client.post("/api/runs", json={"text": "hello there"})
        assert r.status_code == 413
        assert "at most 1 MiB (ATTNSCOPE_FORWARD_BYTES)" in r.json()["message"]


def test_concurrent_forwards_wait_for_memory() -> None:
    budget = MemoryBudget(100)
    order: list[str] = []
    first_in, second_waiting = threading.Event(), threading.Event()

    def first() -> None:
        with budget.reserve(70):
            order.append("first in")
            first_in.set()
            second_waiting.wait(timeout=10)
            order.append("first out")

    def second() -> None:
        first_in.wait(timeout=10)
        second_waiting.set()
        with budget.reserve(60):  # 70 + 60 > 100: waits until the first is done
            order.append("second in")
            assert budget.used == 60

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert order == ["first in", "first out", "second in"] and budget.used == 0
    with pytest.raises(TooLarge, match="ATTNSCOPE_FORWARD_BYTES"), budget.reserve(101):
        pass


def test_two_engine_requests_share_the_budget(tiny_models: dict[str, LoadedModel]) -> None:
    """Two prompts on two models whose peaks do not fit together run one after the other."""
    a, b = tiny_models["gpt2"], tiny_models["llama"]
    peak = max(estimate(a, 8, 10).peak, estimate(b, 8, 10).peak)
    engine = Engine({"a": a, "b": b}, "a", RunStore(1 << 28), 1024, forward_bytes=peak + peak // 2)
    inside: list[int] = []
    most = [0]
    lock = threading.Lock()

    def watch(_module: object, _args: object) -> None:
        with lock:
            inside.append(1)
            most[0] = max(most[0], engine.budget.used)

    handles = [lm.model.register_forward_pre_hook(watch) for lm in (a, b)]
    try:
        threads = [threading.Thread(target=engine.analyse, args=("one two three four five", name)) for name in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        for h in handles:
            h.remove()
    assert engine.scores.wait_idle(60)  # the late head scores' sweeps hold budget too, after the forwards
    assert len(inside) == 2 and most[0] <= engine.budget.total and engine.budget.used == 0


def test_export_is_what_the_run_keeps_and_rebuilds_any_head(client: TestClient, engine: Engine, tmp_path: Path) -> None:
    run_id = client.post("/api/runs", json={"text": "the cat sat on the mat", "model": "tiny-qwen2"}).json()["run_id"]
    r = client.get(f"/api/runs/{run_id}/export", params={"format": "safetensors"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    path = tmp_path / "run.safetensors"
    path.write_bytes(r.content)
    kept = KeptRun.load(path)
    cache = engine.run(run_id)
    assert kept.n == cache.n and kept.run["text"] == "the cat sat on the mat"
    assert len(r.content) < cache.nbytes  # the tensors a run keeps, not n x n patterns
    for layer in range(cache.n_layers):
        for head in range(cache.n_heads):
            torch.testing.assert_close(kept.pattern(layer, head), cache.head_pattern(layer, head), atol=1e-6, rtol=0)
    torch.testing.assert_close(kept.tensors["blocks.1.hook_resid_post"], cache.resid[2])


def test_the_json_export_of_a_long_run_is_refused_naming_the_other_format(engine: Engine) -> None:
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2", max_cells=1024), engine)) as small:
        run_id = small.post("/api/runs", json={"text": " ".join(["word"] * 30)}).json()["run_id"]
        r = small.get(f"/api/runs/{run_id}/export")
        assert r.status_code == 422
        assert "ATTNSCOPE_MAX_CELLS" in r.json()["message"] and "format=safetensors" in r.json()["message"]
        assert small.get(f"/api/runs/{run_id}/export", params={"format": "safetensors"}).status_code == 200
