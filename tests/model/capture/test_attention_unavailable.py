"""A model whose attention cannot return weights gets a clear message, not empty heatmaps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from transformers import AutoModelForCausalLM

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.capture.forward import run_with_cache
from attnscope.model.errors import AttentionUnavailable
from attnscope.model.load.models import LoadedModel, load_model
from attnscope.model.load.tokens import ids_tensor, tokenize
from tests.support.tiny import make_engine


def test_loader_uses_the_capture_point(tiny_dirs: dict[str, Path]) -> None:
    lm = load_model("m", str(tiny_dirs["llama"]))
    assert lm.model.config._attn_implementation == "attnscope"


def test_sdpa_model_is_refused_with_a_reason(tiny_dirs: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    sdpa = AutoModelForCausalLM.from_pretrained(tiny_dirs["gpt2"], attn_implementation="sdpa").eval()
    lm = replace(tiny_models["gpt2"], model=sdpa)
    ids = ids_tensor(tokenize(lm.tokenizer, "dog bites man"))
    with pytest.raises(AttentionUnavailable, match="'sdpa' attention"):
        run_with_cache(lm, ids)
    with pytest.raises(AttentionUnavailable, match="never reached attnscope's capture point"):
        make_engine({"sdpa-gpt2": lm}, "sdpa-gpt2")  # the server refuses to start on it
    engine = make_engine({"sdpa-gpt2": replace(tiny_models["gpt2"])}, "sdpa-gpt2")
    engine.models["sdpa-gpt2"].model = sdpa  # swapped after start-up: each request still says why
    with TestClient(create_app(Settings(models={}, default_model="sdpa-gpt2"), engine)) as client:
        r = client.post("/api/runs", json={"text": "dog bites man"})
        assert r.status_code == 422 and "capture point" in r.json()["message"]
