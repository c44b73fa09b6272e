"""POST /api/runs with "messages": the chat template renders them, special tokens are marked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import wrap_model
from attnscope.model.load.tokens import ids_tensor
from tests.support.families import FAMILIES
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat sat?"}]


@pytest.fixture(scope="module")
def chat_client() -> Iterator[TestClient]:
    family = next(f for f in FAMILIES if f.id == "qwen2")
    with_template = wrap_model("chatty", family.build("eager"), tiny_tokenizer(chat=True), "config")
    without = wrap_model("plain", family.build("eager"), tiny_tokenizer(chat=False), "config")
    engine = make_engine({"chatty": with_template, "plain": without}, "chatty")
    with TestClient(create_app(Settings(models={}, default_model="chatty"), engine)) as client:
        yield client


def test_messages_use_the_chat_template_and_mark_special_tokens(chat_client: TestClient) -> None:
    models = {m["name"]: m for m in chat_client.get("/api/models").json()["models"]}
    assert models["chatty"]["has_chat_template"] and not models["plain"]["has_chat_template"]
    r = chat_client.post("/api/runs", json={"messages": CHAT, "top_k": 2})
    assert r.status_code == 201, r.text
    tokens = r.json()["tokens"]
    rendered = tiny_tokenizer().apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert "".join(t["text"] for t in tokens) == rendered
    special = [t["text"] for t in tokens if t["special"]]
    assert special == ["<|im_start|>", "<|im_end|>", "<|im_start|>", "<|im_end|>", "<|im_start|>"]
    assert not any(t["special"] for t in tokens if t["text"] not in ("<|im_start|>", "<|im_end|>"))
    # the run is the model's forward over exactly those ids
    engine = chat_client.app.state.engine  # type: ignore[attr-defined]
    lm = engine.model("chatty")
    ids = ids_tensor(engine.chat_tokens(lm, CHAT)[1])
    with torch.inference_mode():
        probs = lm.model(input_ids=ids[None]).logits[0, -1].softmax(-1)
    last = r.json()["predictions"][-1]["top"][0]
    assert last["id"] == int(probs.argmax()) and last["prob"] == pytest.approx(float(probs.max()), abs=1e-5)


def test_chat_without_a_template_or_with_both_fields_is_422(chat_client: TestClient) -> None:
    r = chat_client.post("/api/runs", json={"messages": CHAT, "model": "plain"})
    assert r.status_code == 422 and "has no chat template" in r.json()["message"]
    r = chat_client.post("/api/runs", json={"messages": CHAT, "text": "hi"})
    assert r.status_code == 422 and "either" in r.text
    r = chat_client.post("/api/runs", json={})
    assert r.status_code == 422
    r = chat_client.post("/api/runs", json={"messages": []})
    assert r.status_code == 422


@pytest.mark.browser
def test_the_explorer_offers_the_chat_form_for_a_model_with_a_template(chat_client: TestClient, page: object) -> None:
    from tests.support.servers import serve

    engine = chat_client.app.state.engine  # type: ignore[attr-defined]
    with serve(create_app(Settings(models={}, default_model="chatty"), engine)) as url:
        page.goto(url + "/")  # type: ignore[attr-defined]
        picker = page.get_by_test_id("model-picker")  # type: ignore[attr-defined]
        # the menu is filled once /api/models answers (after the page's load event)
        page.wait_for_function("() => document.querySelector('[data-testid=model-picker]').options.length > 0")  # type: ignore[attr-defined]
        assert "float32 on cpu" in picker.inner_text()
        toggle = page.get_by_test_id("chat-toggle")  # type: ignore[attr-defined]
        toggle.wait_for(state="visible")
        page.get_by_test_id("chat-mode").check()  # type: ignore[attr-defined]
        page.get_by_test_id("system-prompt").fill("be brief")  # type: ignore[attr-defined]
        page.get_by_test_id("prompt-input").fill("the cat sat?")  # type: ignore[attr-defined]
        page.get_by_test_id("analyze-button").click()  # type: ignore[attr-defined]
        page.locator("#tokens .special").first.wait_for()  # type: ignore[attr-defined]
        assert page.locator("#tokens .special").count() == 5  # type: ignore[attr-defined]
        picker.select_option("plain")
        assert toggle.is_hidden()
        # leave the page before this test's server stops: its requests still in flight (the switched model's
        # analyse, the wait for late head scores) would otherwise fail as refused connections
        page.goto("about:blank")  # type: ignore[attr-defined]
