"""bfloat16 and float16 models on the CPU: every endpoint answers without a 5xx, the
analysis maths runs in float32, and the numbers stay close to the float32 model's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import ModelLoadError
from attnscope.model.load.models import Placement, load_model, resolve_device, resolve_dtype, wrap_model
from attnscope.model.services.engine import Engine
from tests.support.families import FAMILIES
from tests.support.sse import events as sse_events
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat. the cat sat"
HALF = ["bfloat16", "float16"]
FAMILY_IDS = ["llama", "gpt2", "gemma2"]  # GQA + rotary, learned positions + Conv1D, soft-caps + sandwich norms


def _engine(dtype: torch.dtype) -> Engine:
    models = {}
    for family in (f for f in FAMILIES if f.id in FAMILY_IDS):
        model = family.build("eager").to(dtype)
        lm = wrap_model(f"{family.id}-{dtype}", model, tiny_tokenizer(), source=f"config:{family.id}")
        models[lm.info.name] = lm
    return make_engine(models, next(iter(models)))


@pytest.fixture(scope="module", params=HALF)
def half(request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, Engine, torch.dtype]]:
    dtype = getattr(torch, request.param)
    engine = _engine(dtype)
    with TestClient(create_app(Settings(models={}, default_model=engine.default), engine)) as client:
        yield client, engine, dtype


def _ok(r: object, what: str) -> dict:
    status = r.status_code  # type: ignore[attr-defined]
    assert status in (200, 201), f"{what}: {status} {r.text[:300]}"  # type: ignore[attr-defined]
    return r.json() if r.headers.get("content-type", "").startswith("application/json") else {}  # type: ignore[attr-defined]


@pytest.mark.parametrize("family", FAMILY_IDS)
def test_every_endpoint_serves_half_precision(half: tuple[TestClient, Engine, torch.dtype], family: str) -> None:
    client, _, dtype = half
    name = f"{family}-{dtype}"
    models = _ok(client.get("/api/models"), "models")["models"]
    info = next(m for m in models if m["name"] == name)
    assert info["dtype"] == str(dtype).removeprefix("torch.") and info["device"] == "cpu"
    run = _ok(client.post("/api/runs", json={"text": TEXT, "model": name}), "runs")
    rid, n = run["run_id"], len(run["tokens"])
    assert all(h["entropy"] == h["entropy"] for h in run["heads"])  # no NaN
    base = f"/api/runs/{rid}"
    _ok(client.get(base), "run")
    rows = _ok(client.get(f"{base}/attention", params={"layer": 1, "head": 0}), "attention")["rows"]
    assert sum(rows[-1]) == pytest.approx(1.0, abs=1e-3)
    _ok(client.get(f"{base}/attention", params={"layer": 0}), "layer attention")
    _ok(client.get(f"{base}/attention", params={"layer": 0, "format": "bin"}), "binary")
    _ok(client.get(f"{base}/attention", params={"layer": 0, "format": "bin", "size": 8}), "thumbnails")
    _ok(client.get(f"{base}/residual"), "residual")
    _ok(client.get(f"{base}/logit-lens", params={"top_k": 3}), "logit lens")
    _ok(client.get(f"{base}/sparsity"), "sparsity")
    nxt = _ok(client.get(f"{base}/next", params={"position": n - 1, "top_k": 3}), "next")
    assert nxt["top"][0]["prob"] > 0
    _ok(client.get(f"{base}/export"), "export")
    _ok(client.get(f"{base}/contributions", params={"layer": 1, "head": 1, "position": n - 1}), "contributions")
    _ok(client.get(f"{base}/attribution", params={"position": n - 1}), "attribution")
    _ok(client.post(f"{base}/ablate", json={"heads": [[0, 1]], "mode": "mean", "top_k": 3}), "ablate")
    _ok(client.post(f"{base}/ablate/scan", json={"position": n - 1, "mode": "zero"}), "scan")
    _ok(client.post("/api/patch", json={"clean": "the cat sat", "corrupted": "the dog sat", "answer": "a",
                                        "wrong": "b", "model": name}), "patch")
    other = _ok(client.post("/api/runs", json={"text": "sat the cat mat. on the the cat", "model": name}), "run b")
    _ok(client.get("/api/compare", params={"a": rid, "b": other["run_id"]}), "compare")
    _ok(client.post("/api/timing", json={"text": "the cat sat", "model": name}), "timing")
    for part in ("embedding?id=40", "anatomy", "positions"):
        _ok(client.get(f"/api/models/{name}/{part}"), part)
    r = client.post("/api/generate", json={"text": TEXT, "model": name, "max_new_tokens": 4, "temperature": 0,
                                           "record": True, "watch_layer": 1, "watch_head": 0})
    kinds = [e for e, _ in sse_events(_ok_text(r))]
    assert kinds[-2:] == ["run", "done"] and kinds.count("token") == 4
    _ok(client.get("/api/health"), "health")


def _ok_text(r: object) -> str:
    assert r.status_code == 200, r.text[:300]  # type: ignore[attr-defined]
    return str(r.text)  # type: ignore[attr-defined]


def test_half_precision_stays_close_to_float32(half: tuple[TestClient, Engine, torch.dtype]) -> None:
    """Captured patterns (float32 maths on half-precision Q/K) are as near the float32 model's as the
    dtype's own eager attention is."""
    _client, engine, dtype = half
    lm = engine.model(f"llama-{dtype}")
    ref = engine_fp32().model("llama-torch.float32")
    a = engine.analyse(TEXT, lm.info.name).record
    b = engine_fp32().analyse(TEXT, ref.info.name).record
    assert a.attention[0].q.dtype == torch.float32 and a.resid[0].dtype == torch.float32
    # the tolerance is the dtype's own: transformers' eager attention in that dtype against float32, on the
    # same tokens (the half model runs the fused kernel where this torch build's kernel takes the dtype)
    family = next(f for f in FAMILIES if f.id == "llama")
    with torch.inference_mode():
        eager_half = family.build("eager").to(dtype)(input_ids=a.input_ids[None], output_attentions=True).attentions
        eager_32 = family.build("eager")(input_ids=a.input_ids[None], output_attentions=True).attentions
    own = max(float((h[0].float() - f[0]).abs().max()) for h, f in zip(eager_half, eager_32, strict=True))
    for layer in range(a.n_layers):
        got, want = a.pattern(layer), b.pattern(layer)
        assert got.dtype == torch.float32 and float((got - want).abs().max()) <= 1.5 * own + 1e-3, (layer, own)


_FP32: list[Engine] = []


def engine_fp32() -> Engine:
    if not _FP32:
        _FP32.append(_engine(torch.float32))
    return _FP32[0]


def test_placement_chooses_device_and_dtype(tiny_dirs: dict[str, Path]) -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, torch.bfloat16) == torch.float32  # float32 on the CPU
    assert resolve_dtype("auto", torch.device("cuda"), torch.bfloat16) == torch.bfloat16  # the checkpoint's on a GPU
    assert resolve_dtype("float16", cpu, None) == torch.float16
    if not torch.cuda.is_available():
        assert resolve_device("auto") in (cpu, torch.device("mps"))
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            resolve_device("cuda:0")
    with pytest.raises(ModelLoadError, match="not a device"):
        resolve_device("tpu-ish")
    lm = load_model("bf", str(tiny_dirs["qwen2"]), Placement(device="cpu", dtype="bfloat16"))
    assert lm.info.dtype == "bfloat16" and lm.info.device == "cpu" and lm.dtype == torch.bfloat16
    lm32 = load_model("f32", str(tiny_dirs["qwen2"]), Placement(device="cpu", dtype="auto"))
    assert lm32.info.dtype == "float32"


def test_device_map_without_accelerate_says_what_to_install(tiny_dirs: dict[str, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without accelerate (the dev extra has it, through peft): simulated by hiding it."""
    import importlib.util

    from attnscope.model.load import models

    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(ModelLoadError, match="accelerate") as refused:
        load_model("m", str(tiny_dirs["llama"]), Placement(device_map="auto"))
    assert "pip install" in str(refused.value)
