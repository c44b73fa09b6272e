"""Long context on a config-built Llama (2 layers, hidden 128, 4 heads, 2 K/V heads, 32,768
positions): one 16,384-token run through the server, in bounded memory, its tiles exact against
references computed on slices with transformers' own code. One run: CI has two cores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import wrap_model
from attnscope.model.runs.budget import estimate
from tests.support.families import LONG_POSITIONS, long_llama
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

N = 16_384


def _slice_reference(model: torch.nn.Module, ids: torch.Tensor, layer: int, q0: int, q1: int) -> torch.Tensor:
    """(H, q1 - q0, n) weights of rows [q0, q1) by transformers' eager attention: Q and K from the
    layer's own projections and rotary embedding (read with a hook on a plain SDPA forward)."""
    seen: dict[str, object] = {}
    attn = model.model.layers[layer].self_attn

    def grab(_m: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["pos"] = kwargs["position_embeddings"]

    impl = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    handle = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(input_ids=ids[None], logits_to_keep=1)
    finally:
        handle.remove()
        model.set_attn_implementation(impl)
    hidden = seen["hidden"]
    cos, sin = seen["pos"]
    shape = (1, hidden.shape[1], -1, attn.head_dim)
    with torch.inference_mode():
        q = attn.q_proj(hidden).view(shape).transpose(1, 2)
        k = attn.k_proj(hidden).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        n = k.shape[2]
        mask = torch.zeros(1, 1, q1 - q0, n)
        mask.masked_fill_(torch.arange(n)[None, :] > torch.arange(q0, q1)[:, None], torch.finfo(torch.float32).min)
        _out, weights = eager_attention_forward(attn, q[:, :, q0:q1], k, k, mask, scaling=attn.scaling)
    return weights[0]  # (H, r, n)


def test_a_16k_run_is_analysed_in_bounded_memory_and_its_tiles_are_exact() -> None:
    model = long_llama()
    lm = wrap_model("long-llama", model, tiny_tokenizer(), source="config:long-llama")
    assert lm.info.max_positions == LONG_POSITIONS
    gen = torch.Generator().manual_seed(0)
    alphabet = "abcdefghij klmnopqrstuvwxyz,."
    text = "".join(alphabet[i] for i in torch.randint(len(alphabet), (N,), generator=gen).tolist())
    engine = make_engine({"long": lm}, "long", store_bytes=1 << 30, max_tokens=LONG_POSITIONS)
    settings = Settings(models={}, default_model="long", max_tokens=LONG_POSITIONS, run_store_bytes=1 << 30)
    with TestClient(create_app(settings, engine)) as client:
        assert client.get("/api/models").json()["models"][0]["max_tokens"] == LONG_POSITIONS
        r = client.post("/api/runs", json={"text": text, "top_k": 1})
        assert r.status_code == 201, r.text[:300]
        run = r.json()
        run_id, n = run["run_id"], len(run["tokens"])
        assert n == N and len(run["heads"]) == 2 * 4 and len(run["predictions"]) == N
        cache = engine.run(run_id)
        dense = 2 * 4 * N * N * 4  # what every head's fp32 pattern would take
        assert cache.nbytes == estimate(lm, N, 1).keep and cache.nbytes * 40 <= dense
        ids = cache.input_ids
        url = f"/api/runs/{run_id}/attention"

        # an exact 128 x 256 tile deep in the run, and an exact one at its start, against eager slices
        for layer, head, (q0, q1, k0, k1) in ((1, 3, (N - 128, N, N - 256, N)), (0, 1, (0, 64, 0, 64))):
            ref = _slice_reference(model, ids, layer, q0, q1)[head]  # (r, n)
            tile = client.get(url, params={"layer": layer, "head": head, "q0": q0, "q1": q1, "k0": k0, "k1": k1,
                                           "format": "f32"})
            assert tile.headers["x-attn-exact"] == "1" and tile.headers["x-attn-rows"] == str(q1 - q0)
            got = np.frombuffer(tile.content, dtype="<f4").reshape(q1 - q0, k1 - k0)
            want = ref[:, k0:k1].numpy()
            hidden = np.arange(k0, k1)[None, :] > np.arange(q0, q1)[:, None]
            np.testing.assert_array_equal(np.isnan(got), hidden)
            np.testing.assert_allclose(got[~hidden], want[~hidden], atol=1e-5, rtol=0)

        # the overview pools every cell of the head: its max bins hold each row block's largest weight
        over = client.get(url, params={"layer": 1, "head": 3, "size": 256, "format": "f32"})
        assert over.status_code == 200 and over.headers["x-attn-rows"] == "256"
        pooled = np.frombuffer(over.content, dtype="<f4").reshape(256, 256)
        ref = _slice_reference(model, ids, 1, N - 64, N)[3].numpy()  # the last 64 rows: the last row bin
        want_last = ref.reshape(64, 256, 64).max(axis=(0, 2))
        np.testing.assert_allclose(pooled[-1], want_last, atol=1e-5, rtol=1e-4)  # float32 sums over 16k keys
        assert np.isnan(pooled[0, 1:]).all() and not np.isnan(np.diag(pooled)).any()

        # every head score follows the response (model/scores/late.py), exact over every row
        late_fields = ["entropy", "max", "prev_token", "first_token", "induction"]
        assert run["scores_pending"] == late_fields and all(run["heads"][0][f] is None for f in late_fields)
        heads = client.get(f"/api/runs/{run_id}/heads", params={"wait": 60})
        assert heads.status_code == 200, heads.text[:300]
        late = next(h for h in heads.json()["heads"] if h["layer"] == 1 and h["head"] == 3)
        prev = late["prev_token"]  # previous-token from the references' rows
        diagonal = []
        for q0 in range(1, N, 2048):
            q1 = min(N, q0 + 2048)
            block = cache.attention[1].rows(3, q0, q1, q0 - 1, q1)[0]  # (r, r + 1): keys q0 - 1 .. q1 - 1
            diagonal.append(block.diagonal())  # row i, key i - 1
        assert prev == pytest.approx(float(torch.cat(diagonal).double().mean()), abs=1e-6)

        # entropy and max (every cell once more)
        entropy = peak = 0.0
        for q0 in range(0, N, 1024):
            w = cache.attention[1].rows(3, q0, q0 + 1024, 0, q0 + 1024)[0].double()  # (r, keys up to the last row)
            entropy += float(-torch.special.xlogy(w, w).sum())
            peak += float(w.amax(-1).sum())
        assert late["entropy"] == pytest.approx(entropy / N, abs=1e-5)
        assert late["max"] == pytest.approx(peak / N, abs=1e-5)
        assert client.get(url, params={"layer": 0, "head": 0}).status_code == 422  # whole head: over the cell limit
        assert client.get(f"/api/runs/{run_id}/next", params={"position": N - 1}).status_code == 200
