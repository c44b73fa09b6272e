"""Tiles of one head: the bin formula, max / mean pooling over visible cells only, masked bins
as null (JSON), 255 (bytes) or NaN (float32), and the cell limit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.encoding import MASKED_U8
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.runs.tiles import TileSpec, edges, tile
from attnscope.model.services.engine import Engine

PROMPT = "the cat sat on the mat and the dog sat on the log while the cat ran off to the barn; " * 2


def _reference(weights: np.ndarray, visible: np.ndarray, spec: TileSpec) -> np.ndarray:
    """The tile by its definition, one bin at a time (float64)."""
    qe = [spec.q0 + math.floor(i * (spec.q1 - spec.q0) / spec.shape[0]) for i in range(spec.shape[0] + 1)]
    ke = [spec.k0 + math.floor(i * (spec.k1 - spec.k0) / spec.shape[1]) for i in range(spec.shape[1] + 1)]
    out = np.full(spec.shape, np.nan)
    for i in range(spec.shape[0]):
        for j in range(spec.shape[1]):
            cells = weights[qe[i] : qe[i + 1], ke[j] : ke[j + 1]]
            seen = visible[qe[i] : qe[i + 1], ke[j] : ke[j + 1]]
            if seen.any():
                out[i, j] = cells[seen].max() if spec.pool == "max" else cells[seen].mean()
    return out


def test_bin_edges_follow_the_formula() -> None:
    assert edges(0, 10, 4).tolist() == [0, 2, 5, 7, 10]
    assert edges(3, 8, 100).tolist() == [3, 4, 5, 6, 7, 8]  # size above the range: one bin a position
    assert edges(5, 17, None).tolist() == list(range(5, 18))
    for a, b, s in ((0, 16_384, 512), (7, 1000, 33), (100, 101, 5)):
        e = edges(a, b, s)
        widths = e.diff()
        assert e[0] == a and e[-1] == b and len(e) == min(s, b - a) + 1
        assert int(widths.max() - widths.min()) <= 1 and int(widths.min()) >= 1


@pytest.mark.parametrize("pool", ["max", "mean"])
@pytest.mark.parametrize(("box", "size"), [((0, 37, 0, 37), 5), ((4, 30, 2, 29), 7), ((10, 20, 0, 37), None),
                                           ((0, 37, 0, 37), 37), ((30, 37, 0, 9), 3)])
def test_tiles_equal_the_definition(pool: str, box: tuple[int, int, int, int], size: int | None) -> None:
    """Causal with a sliding window of 6: bins that straddle the diagonal or the window pool only
    what is visible, bins wholly outside are NaN; a tiny cell budget forces many row blocks."""
    gen = torch.Generator().manual_seed(0)
    n = 37
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    visible = (k <= q) & (k > q - 6)  # (n, n)
    weights = torch.rand(n, n, generator=gen).masked_fill(~visible, 0.0)
    weights[visible & (torch.rand(n, n, generator=gen) < 0.2)] = 0.0  # visible zeros pool as zeros
    spec = TileSpec(*box, size=size, pool=pool)  # type: ignore[arg-type]

    def rows(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return weights[a:b, spec.k0 : spec.k1], visible[a:b, spec.k0 : spec.k1]

    for budget in (1, 50, 1 << 20):
        got = tile(rows, spec, cell_budget=budget).numpy()
        want = _reference(weights.double().numpy(), visible.numpy(), spec)
        assert got.shape == spec.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], atol=1e-6, rtol=0)
    if size is None or spec.exact:
        got = tile(rows, spec)
        cells = weights[spec.q0 : spec.q1, spec.k0 : spec.k1]
        hidden = ~visible[spec.q0 : spec.q1, spec.k0 : spec.k1]
        assert torch.equal(got.nan_to_num(-1.0), cells.masked_fill(hidden, -1.0))  # exact weights, bit for bit


@pytest.fixture(scope="module")
def run(client: TestClient) -> dict:
    r = client.post("/api/runs", json={"text": PROMPT, "model": "tiny-llama"})
    assert r.status_code == 201, r.text
    return r.json()


def _model_weights(engine: Engine, run: dict, layer: int, head: int) -> torch.Tensor:
    lm = engine.model("tiny-llama")
    ids = torch.tensor([t["id"] for t in run["tokens"]])
    eager = lm.model.config._attn_implementation
    lm.model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=ids[None], output_attentions=True)
    finally:
        lm.model.set_attn_implementation(eager)
    return out.attentions[layer][0, head].float()  # (n, n)


def test_a_tile_of_a_run_is_the_models_own_attention(client: TestClient, engine: Engine, run: dict) -> None:
    n = len(run["tokens"])
    ref = _model_weights(engine, run, 1, 2)
    url = f"/api/runs/{run['run_id']}/attention"
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    for params in ({"q0": 3, "q1": 17, "k0": 1, "k1": 12}, {"size": 5}, {"size": 6, "pool": "mean", "q0": 5},
                   {"q0": 0, "q1": 4, "k0": 10, "k1": n}):
        body = client.get(url, params={"layer": 1, "head": 2, **params}).json()
        spec = TileSpec(body["q0"], body["q1"], body["k0"], body["k1"], size=params.get("size"),
                        pool=body["pool"])
        assert body["pool"] == params.get("pool", "max") and body["n_heads"] == 1 and body["head"] == 2
        assert body["q_edges"] == spec.q_edges().tolist() and body["k_edges"] == spec.k_edges().tolist()
        got = np.array([[np.nan if v is None else v for v in row] for row in body["cells"][0]])
        want = _reference(ref.double().numpy(), visible.numpy(), spec)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], atol=1e-5, rtol=0)
    future = client.get(url, params={"layer": 1, "head": 2, "q0": 0, "q1": 4, "k0": 10, "k1": n}).json()
    assert future["exact"] and all(v is None for row in future["cells"][0] for v in row)


def test_binary_tiles_carry_the_masked_code_and_the_shape(client: TestClient, run: dict) -> None:
    url = f"/api/runs/{run['run_id']}/attention"
    params = {"layer": 0, "head": 1, "size": 7, "q0": 2, "k1": 19}
    body = client.get(url, params=params).json()
    values = np.array([[np.nan if v is None else v for v in row] for row in body["cells"][0]])
    raw = client.get(url, params={**params, "format": "bin"})
    h = raw.headers
    assert h["content-type"] == "application/octet-stream" and h["x-attn-encoding"] == "sqrt-u8-tile"
    assert (h["x-attn-rows"], h["x-attn-cols"], h["x-attn-heads"]) == ("7", "7", "1")
    assert (h["x-attn-q0"], h["x-attn-q1"], h["x-attn-k0"], h["x-attn-k1"]) == ("2", str(body["q1"]), "0", "19")
    assert h["x-attn-pool"] == "max" and h["x-attn-masked"] == str(MASKED_U8) and h["x-attn-exact"] == "0"
    codes = np.frombuffer(raw.content, dtype=np.uint8).reshape(7, 7)
    np.testing.assert_array_equal(codes == MASKED_U8, np.isnan(values))
    decoded = (codes.astype(np.float64) / 254) ** 2
    np.testing.assert_allclose(decoded[~np.isnan(values)], values[~np.isnan(values)], atol=0.0045)
    f32 = client.get(url, params={**params, "format": "f32"})
    assert f32.headers["x-attn-encoding"] == "f32-tile" and f32.headers["x-attn-masked"] == "NaN"
    exact = np.frombuffer(f32.content, dtype="<f4").reshape(7, 7)
    np.testing.assert_array_equal(np.isnan(exact), np.isnan(values))
    np.testing.assert_allclose(exact[~np.isnan(exact)], values[~np.isnan(values)], atol=1e-6)
    every = client.get(url, params={"layer": 0, "size": 7, "q0": 2, "k1": 19, "format": "bin"})
    assert every.headers["x-attn-heads"] == "4" and every.headers["x-attn-head"] == "all"
    assert every.content[7 * 7 : 2 * 7 * 7] == raw.content  # head 1's tile follows head 0's


def test_bad_tiles_and_the_cell_limit_are_422(engine: Engine, run: dict) -> None:
    settings = Settings(models={}, default_model="tiny-gpt2", max_cells=1024)
    with TestClient(create_app(settings, engine)) as small:
        url = f"/api/runs/{run['run_id']}/attention"
        n = len(run["tokens"])
        whole = small.get(url, params={"layer": 0, "head": 0, "q0": 0})
        assert n * n > 1024 >= 32 * 32
        assert whole.status_code == 422
        message = whole.json()["message"]
        assert "ATTNSCOPE_MAX_CELLS" in message and "size" in message and "q0, q1, k0, k1" in message
        assert small.get(url, params={"layer": 0, "head": 0, "size": 32}).status_code == 200
        assert small.get(url, params={"layer": 0, "size": 32, "pool": "max"}).status_code == 422  # 4 heads
        assert small.get(url, params={"layer": 0, "head": 0, "q0": 0, "q1": 4, "k1": 200}).status_code == 422
        for bad in ({"q0": 5, "q1": 5}, {"q0": -1}, {"k1": n + 1}, {"k0": 9, "k1": 3}, {"pool": "median"}):
            r = small.get(url, params={"layer": 0, "head": 0, **bad})
            assert r.status_code == 422 and r.json()["message"], bad
