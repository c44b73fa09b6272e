"""The run store: LRU by bytes, expired runs say so, nothing leaks across runs."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.capture.names import KINDS, LOGITS, act_name, block_names, kind_of, parse
from attnscope.model.errors import RunNotFound
from attnscope.model.load.models import LoadedModel
from tests.support.tiny import make_engine


def test_lru_evicts_oldest_and_says_expired(tiny_models: dict[str, LoadedModel]) -> None:
    engine = make_engine({"m": tiny_models["gpt2"]}, "m")
    first = engine.analyse("one two three")
    engine.store.max_bytes = first.record.nbytes * 3 // 2  # room for one run of about this size, not two
    engine.run(first.run_id)
    second = engine.analyse("four five six")
    with pytest.raises(RunNotFound) as err:
        engine.run(first.run_id)
    assert err.value.expired and str(err.value) == "run expired, analyse again"
    assert engine.run(second.run_id).text == "four five six"
    assert engine.store.nbytes == engine.run(second.run_id).nbytes


def test_lru_keeps_recently_used(tiny_models: dict[str, LoadedModel]) -> None:
    engine = make_engine({"m": tiny_models["gpt2"]}, "m")
    a = engine.analyse("alpha beta")  # every run below has the same size
    size = engine.run(a.run_id).nbytes
    engine.store.max_bytes = 2 * size + size // 2
    b = engine.analyse("alpha beta")
    engine.run(a.run_id)  # a is now the most recent
    engine.analyse("alpha beta")
    engine.run(a.run_id)
    with pytest.raises(RunNotFound):
        engine.run(b.run_id)


def test_expired_run_is_404_over_http(tiny_models: dict[str, LoadedModel]) -> None:
    engine = make_engine({"m": tiny_models["gpt2"]}, "m")
    with TestClient(create_app(Settings(models={}, default_model="m"), engine)) as client:
        old = client.post("/api/runs", json={"text": "first prompt"}).json()["run_id"]
        engine.store.max_bytes = engine.run(old).nbytes * 3 // 2
        client.post("/api/runs", json={"text": "second prompt"})
        r = client.get(f"/api/runs/{old}/residual")
        assert r.status_code == 404 and r.json()["message"] == "run expired, analyse again"


def test_cache_shapes_and_tl_names(tiny_models: dict[str, LoadedModel]) -> None:
    engine = make_engine({"m": tiny_models["gpt2"]}, "m")
    cache = engine.run(engine.analyse("a b c d e").run_id)
    n = cache.n
    assert cache[act_name("pattern", 0)].shape == (4, n, n)
    assert cache[act_name("resid_pre", 1)].shape == (n, 32)
    assert (cache[act_name("resid_post", 0)] == cache[act_name("resid_pre", 1)]).all()
    assert not any(t.requires_grad for t in cache.resid)
    for bad in ("blocks.0.nonsense", "blocks.2.hook_resid_pre", "logits", "blocks.x.attn.hook_pattern"):
        with pytest.raises(KeyError):
            cache[bad]


def test_act_names_round_trip() -> None:
    assert act_name("pattern", 3) == "blocks.3.attn.hook_pattern"
    assert act_name("resid_post", 0) == "blocks.0.hook_resid_post"
    assert block_names(2)[:5] == [act_name(kind, 0) for kind in KINDS] and len(block_names(2)) == 10
    for name in block_names(3):
        kind, layer = parse(name)
        assert act_name(kind, layer) == name and kind_of(name) == kind
    assert kind_of(LOGITS) is None and kind_of("blocks.1.attn.hook_z") is None
