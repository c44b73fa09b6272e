"""``Scope.generate``: the HTTP door's greedy generation, token for token, and its recording as a run
whose attention is the analysed text's."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

import attnscope
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import BadInput
from attnscope.model.load.models import wrap_model
from tests.support.families import FAMILIES
from tests.support.sse import events
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

PROMPT = "the cat sat on the"


def test_generate_gives_the_http_doors_tokens_and_a_run() -> None:
    family = next(f for f in FAMILIES if f.model_type == "llama")
    model, tokenizer = family.build("sdpa"), tiny_tokenizer()
    scope = attnscope.Scope(model, tokenizer)
    made = scope.generate(PROMPT, max_new_tokens=6, stop_at_eos=False)
    assert len(made.steps) == 6 and made.stop == "length"
    run = made.run
    assert len(run.tokens) == len(scope.run(PROMPT).tokens) + 6
    again = scope.run(run.text)  # the recorded run is the analysed text's, up to float error
    np.testing.assert_allclose(run.attention(layer=1, head=0).numpy(), again.attention(layer=1, head=0).numpy(),
                               atol=1e-5)
    with pytest.raises(BadInput) as refused:
        scope.generate(PROMPT, max_new_tokens=0)
    assert refused.value.code == "value_out_of_range"
    assert model.config._attn_implementation == "sdpa"

    lm = wrap_model("tiny", model, tokenizer, source="test")
    settings = Settings(models={}, default_model="tiny", max_body_bytes=64 * 1024)
    with TestClient(create_app(settings, make_engine({"tiny": lm}, "tiny"))) as client:
        r = client.post("/api/generate", json={"text": PROMPT, "max_new_tokens": 6, "temperature": 0,
                                               "stop_at_eos": False, "record": True})
        assert r.status_code == 200
        tokens = [data["id"] for name, data in events(r.text) if name == "token"]
    assert tokens == [s.id for s in made.steps]
