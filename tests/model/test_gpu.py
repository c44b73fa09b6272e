"""On a CUDA GPU (skipped without one): captured patterns equal output_attentions on the GPU,
every tensor the engine keeps lives there, and bfloat16 serves the endpoints.

Run alone on a GPU machine:  .venv/bin/python -m pytest tests/model/test_gpu.py -q
"""

from __future__ import annotations

import logging

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model import compat
from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.names import act_name
from attnscope.model.load.models import wrap_model
from attnscope.model.scores.live import scored_run
from tests.support.families import FAMILIES, Family
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU_FAMILIES = [f for f in FAMILIES if f.id in ("gpt2", "llama", "qwen2", "gemma2", "falcon", "bloom", "modernbert")]


@pytest.mark.parametrize("family", GPU_FAMILIES, ids=lambda f: f.id)
def test_patterns_on_the_gpu_equal_output_attentions(family: Family) -> None:
    model = family.build("eager").to("cuda")
    ids = torch.randint(6, 256, (16,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(input_ids=ids[None].cuda(), output_attentions=True).attentions
    lm = wrap_model(family.id, model, tiny_tokenizer(), source="config")
    assert lm.info.device.startswith("cuda")
    with lm.lock:
        acts = run_with_cache(lm, ids)
    for i, expected in enumerate(ref):
        got = acts[act_name("pattern", i)]
        assert got.device.type == "cuda" and got.dtype == torch.float32
        torch.testing.assert_close(got, expected[0].float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_endpoints_on_the_gpu(dtype: torch.dtype) -> None:
    family = next(f for f in FAMILIES if f.id == "llama")
    lm = wrap_model("gpu-llama", family.build("eager").to(device="cuda", dtype=dtype), tiny_tokenizer(), "config")
    engine = make_engine({"gpu-llama": lm}, "gpu-llama")
    with TestClient(create_app(Settings(models={}, default_model="gpu-llama"), engine)) as client:
        run = client.post("/api/runs", json={"text": "the cat sat on the mat"})
        assert run.status_code == 201, run.text
        rid, n = run.json()["run_id"], len(run.json()["tokens"])
        for url, params in [("attention", {"layer": 1, "head": 0}), ("attention", {"layer": 0, "format": "bin"}),
                            ("residual", {}), ("logit-lens", {}), ("sparsity", {}), ("next", {"position": n - 1}),
                            ("export", {}), ("attribution", {"position": n - 1})]:
            r = client.get(f"/api/runs/{rid}/{url}", params=params)
            assert r.status_code == 200, (url, r.text[:300])
        # the Learn views' embedding sweep (V x V cosines, in blocks) runs beside the GPU model's rows
        r = client.get("/api/models/gpu-llama/embedding", params={"id": 5})
        assert r.status_code == 200, r.text[:300]
        r = client.post("/api/generate", json={"text": "the cat", "max_new_tokens": 3, "record": True})
        assert r.status_code == 200 and "event: done" in r.text
        info = client.get("/api/models").json()["models"][0]
        assert info["device"].startswith("cuda") and info["dtype"] == str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fused_kernel_serves_cuda_and_its_scores_equal_the_block_paths(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The memory-efficient kernel passes its check on this card in every dtype, the capture takes it on
    every layer, and the exact head scores from its Q, K and lse equal the block path's."""
    assert compat.fused_on(torch.device("cuda"), dtype), "the fused CUDA kernel's check failed (see the log)"
    family = next(f for f in FAMILIES if f.id == "llama")
    model = family.build("eager").to(device="cuda", dtype=dtype)
    lm = wrap_model("gpu-llama", model, tiny_tokenizer(), source="config")
    ids = torch.randint(6, 256, (300,), generator=torch.Generator().manual_seed(2)).cuda()
    with caplog.at_level(logging.INFO, logger="attnscope.model.capture.forward"), lm.lock:
        _a, _s, fused = scored_run(lm, ids)
    n = lm.info.n_layers
    assert f"gpu-llama: attention through the fused kernel on {n} of {n} layers (cuda" in caplog.text
    monkeypatch.setenv("ATTNSCOPE_FUSED", "0")  # the block path, public ops only
    with lm.lock:
        _a, _s, blocks = scored_run(lm, ids)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for got, want in zip(fused, blocks, strict=True):
        for field in ("entropy", "max", "prev_token", "first_token", "induction"):
            assert getattr(got, field) == pytest.approx(getattr(want, field), abs=tol), (got.layer, got.head, field)
