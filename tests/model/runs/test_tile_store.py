"""Kept tiles and overviews computed ahead (model/runs/tile_store.py): one computation per tile however
many ask at once, a byte-capped LRU, thumbnails pooled from the kept overview equal to computed
ones bit for bit, the background prefetch (first head first, paused while a request computes,
dropping runs that are gone), and the API serving a long run's tiles through all of it."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import torch
from fastapi.testclient import TestClient
from transformers.masking_utils import causal_mask_function

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.attention.interface import LazyMask
from attnscope.model.attention.kept import LayerAttention, build
from attnscope.model.load.models import wrap_model
from attnscope.model.runs.tile_store import OVERVIEW, Prefetch, TileCache, Tiles, overview
from attnscope.model.runs.tiles import TileSpec, head_tile, head_tiles
from bench.long import text_of
from tests.support.families import long_llama
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer


def _layer(n: int, heads: int = 2, seed: int = 0) -> LayerAttention:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(heads, n, 8, generator=gen) * 2, torch.randn(1, n, 8, generator=gen) * 2
    mask = LazyMask.over(n, causal_mask_function, torch.device("cpu"))
    return build(q, k, scaling=0.5, softcap=None, groups=heads, bias=None, mask=mask)


def _key(i: int) -> tuple[str, int, int, TileSpec]:
    return ("run", 0, i, TileSpec(0, 4, 0, 4, None, "max"))


def test_concurrent_asks_for_one_tile_compute_it_once() -> None:
    cache = TileCache(1 << 20)
    calls, started, release = [], threading.Event(), threading.Event()

    def compute() -> torch.Tensor:
        calls.append(1)
        started.set()
        release.wait(10)
        return torch.ones(4, 4)

    results: list[torch.Tensor] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(_key(0), compute))) for _ in range(4)]
    threads[0].start()
    started.wait(10)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and len(results) == 4 and all(r is results[0] for r in results)
    assert cache.peek(_key(0)) is results[0] and cache.nbytes == 64


def test_the_cache_keeps_its_byte_cap_least_recently_used_out() -> None:
    cache = TileCache(3 * 64)  # three 4 x 4 float32 tiles
    for i in range(3):
        cache.get(_key(i), lambda: torch.zeros(4, 4))
    cache.get(_key(0), lambda: torch.ones(4, 4))  # used again: the newest
    cache.get(_key(3), lambda: torch.zeros(4, 4))  # key 1 goes
    assert cache.peek(_key(1)) is None and cache.peek(_key(0)) is not None and len(cache) == 3
    assert cache.nbytes == 3 * 64
    big = cache.get(("run", 0, 9, TileSpec(0, 8, 0, 8, None, "max")), lambda: torch.zeros(8, 8))
    assert big.shape == (8, 8) and len(cache) == 3 and cache.nbytes <= cache.max_bytes  # too big to keep


def test_a_failed_computation_reaches_its_waiters_and_is_not_kept() -> None:
    cache = TileCache(1 << 20)

    def boom() -> torch.Tensor:
        raise RuntimeError("no")

    for _ in range(2):
        try:
            cache.get(_key(0), boom)
        except RuntimeError:
            pass
        else:
            raise AssertionError("the error was swallowed")
    assert cache.peek(_key(0)) is None and not cache.busy(_key(0))


def test_thumbnails_from_the_kept_overview_equal_computed_ones() -> None:
    n = 300  # bins of 1 or 2 positions in the overview, uneven thumbnails
    layer = _layer(n)
    tiles = Tiles(1 << 24)
    for size in (32, 64, 128, 8):
        spec = TileSpec(0, n, 0, n, size, "max")
        got = tiles.tile("r", 0, layer, 1, spec)
        want = head_tile(layer, 1, spec)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(-1), want.nan_to_num(-1))
    assert tiles.cache.peek(("r", 0, 1, overview(n))) is not None  # pooled from it
    assert tiles.cache.peek(("r", 0, 1, TileSpec(0, n, 0, n, 32, "max"))) is None  # derived, not kept


def test_the_prefetch_computes_every_overview_first_head_first() -> None:
    layers = [_layer(OVERVIEW + 40, seed=s) for s in range(2)]
    tiles = Tiles(1 << 24)
    try:
        tiles.prefetch.submit("r", layers, first=(1, 1))
        assert tiles.prefetch.wait_idle(120)
        keys = list(tiles.cache._tiles)  # insertion order: the order they were computed in
        assert (keys[0][1], keys[0][2]) == (1, 1) and len(keys) == 4
        for layer_i, head in ((0, 0), (1, 1)):
            kept = tiles.cache.peek(("r", layer_i, head, overview(OVERVIEW + 40)))
            assert kept is not None
            assert torch.equal(kept.nan_to_num(-1), head_tile(layers[layer_i], head, overview(OVERVIEW + 40)).nan_to_num(-1))
    finally:
        tiles.close()


def test_the_prefetch_waits_for_requests_and_drops_runs_that_are_gone() -> None:
    prefetch = Prefetch(TileCache(1 << 24))
    try:
        with prefetch.foreground():
            layers = [_layer(OVERVIEW + 8)]
            prefetch.submit("gone", layers)
            time.sleep(0.3)
            assert prefetch.pending() == 2  # nothing started while a request computes
            del layers
            gc.collect()
        assert prefetch.wait_idle(60)
        assert len(prefetch.cache) == 0  # the run was gone before its turn
    finally:
        prefetch.close()


def test_a_long_runs_overviews_and_thumbnails_through_the_api() -> None:
    lm = wrap_model("long-llama", long_llama(), tiny_tokenizer(), source="config:long-llama")
    engine = make_engine({"long-llama": lm}, "long-llama", store_bytes=1 << 28, max_tokens=1024)
    n = 600
    with TestClient(create_app(Settings(models={}, default_model="long-llama"), engine)) as client:
        r = client.post("/api/runs", json={"text": text_of(n), "model": "long-llama"})
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        tiles: Tiles = client.app.state.tiles  # type: ignore[attr-defined]
        assert tiles.prefetch.wait_idle(120)
        assert len(tiles.cache) == 2 * 4  # every head's overview, computed ahead
        cache = engine.run(run_id)
        url = f"/api/runs/{run_id}/attention"
        thumbs = client.get(url, params={"layer": 1, "size": 32, "pool": "max", "format": "f32"})
        want = head_tiles(cache.attention[1], [0, 1, 2, 3], TileSpec(0, n, 0, n, 32, "max")).numpy()
        got = np.frombuffer(thumbs.content, dtype="<f4").reshape(want.shape)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
        one = client.get(url, params={"layer": 0, "head": 2, "size": OVERVIEW, "format": "f32"})
        want = head_tiles(cache.attention[0], [2], overview(n)).numpy()
        got = np.frombuffer(one.content, dtype="<f4").reshape(want.shape)
        np.testing.assert_array_equal(np.nan_to_num(got, nan=-1), np.nan_to_num(want, nan=-1))
        assert len(tiles.cache) == 2 * 4  # both answered from the kept overviews
        health = client.get("/api/health").json()
        assert health["tile_cache_bytes"] == 2 * 4 * OVERVIEW * OVERVIEW * 4 == tiles.cache.nbytes
        assert health["tile_cache_max_bytes"] == 64 << 20
