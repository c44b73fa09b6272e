"""The notebook widget's kernel side: the frame's /api requests answered over the comm by the web app's
own routes on the model object the notebook holds (here one built from a config and edited in memory),
and the page it is sent built from the web app's own modules."""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("anywidget")

import attnscope
from attnscope.app import embed
from attnscope.app.notebook import Explorer
from tests.support.families import FAMILIES
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat; the cat sat."


class Frame:
    """What the widget's frame would receive: each response's status, headers and body."""

    def __init__(self, widget: Explorer) -> None:
        self.widget = widget
        self.answers: dict[int, dict[str, Any]] = {}
        self.done = threading.Condition()
        self.next = 0
        widget.reply = self.receive  # type: ignore[method-assign]

    def receive(self, content: dict[str, Any], buffers: list[bytes]) -> None:
        with self.done:
            got = self.answers.setdefault(content["id"], {"body": b""})
            if content.get("start"):
                got.update(status=content["status"], headers=content["headers"])
            got["body"] += b"".join(buffers)
            got["done"] = bool(content.get("done"))
            self.done.notify_all()

    def request(self, method: str, url: str, body: object = None) -> dict[str, Any]:
        self.next += 1
        ident = self.next
        data = [json.dumps(body).encode()] if body is not None else []
        headers = {"content-type": "application/json"} if body is not None else {}
        self.widget._on_msg(self.widget, {"type": "request", "id": ident, "method": method, "url": url,
                                          "headers": headers}, data)
        with self.done:
            assert self.done.wait_for(lambda: self.answers.get(ident, {}).get("done"), timeout=120)
        return self.answers[ident]


def build_edited(attn_implementation: str) -> Any:
    """A model built in the kernel from a config (seeded), one weight edited in memory."""
    family = next(f for f in FAMILIES if f.model_type == "llama")
    model = family.build(attn_implementation)
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight.mul_(3.0)  # sharper attention in layer 1
    return model


@pytest.fixture
def edited() -> tuple[Any, Any]:
    return build_edited("sdpa"), tiny_tokenizer()


def test_the_widget_answers_the_frames_requests_with_the_edited_models_attention(edited: tuple[Any, Any]) -> None:
    model, tokenizer = edited
    widget = attnscope.Scope(model, tokenizer, name="edited")
    explorer = Explorer(widget, text=TEXT, lang="zh")
    frame = Frame(explorer)
    try:
        models = frame.request("GET", "/api/models")
        assert models["status"] == 200 and json.loads(models["body"])["models"][0]["name"] == "edited"
        made = frame.request("POST", "/api/runs", {"text": TEXT})
        assert made["status"] == 201
        run = json.loads(made["body"])
        n = len(run["tokens"])
        got = frame.request("GET", f"/api/runs/{run['run_id']}/attention?layer=1&head=2&format=f32")
        assert got["status"] == 200 and got["headers"]["x-attn-encoding"] == "f32"
        sent = np.zeros((n, n), dtype=np.float32)
        sent[np.tril_indices(n)] = np.frombuffer(got["body"], dtype="<f4")
        reference = build_edited("eager")  # the same weights, edited the same way, read by transformers itself
        with torch.inference_mode():
            ids = torch.tensor([[t["id"] for t in run["tokens"]]])
            want = reference(input_ids=ids, output_attentions=True).attentions[1][0, 2].numpy()
        np.testing.assert_allclose(sent, want, atol=1e-5)  # the edited weights, as they are in the kernel
        refused = frame.request("GET", f"/api/runs/{run['run_id']}/attention?layer=9&head=0")
        assert refused["status"] == 422 and json.loads(refused["body"])["code"] == "layer_out_of_range"
        explorer._bridge.wait()
        assert model.config._attn_implementation == "sdpa"  # each request borrows the model, and gives it back
        stream = frame.request("POST", "/api/generate", {"text": TEXT, "max_new_tokens": 3, "temperature": 0,
                                                          "record": True})
        assert stream["status"] == 200 and stream["body"].count(b"event: token") == 3
        assert b"event: run" in stream["body"] and b"event: done" in stream["body"]
    finally:
        explorer.close()


def test_the_page_is_the_web_apps_own_modules_inlined() -> None:
    document = embed.explorer_document(embed={"search": "?lang=zh"}, transport=embed.transport_script())
    assert not re.search(r"""(src|href)=["']/(static|vendor)/""", document)  # nothing asked of a server
    assert not re.search(r"""<(script|link)[^>]+(src|href)=["']https?:""", document)  # nor of a CDN
    sources = embed.modules()
    served = {f"attnscope/{p.relative_to(embed.STATIC).as_posix()}" for p in (embed.STATIC / "js").rglob("*.js")
              if not p.relative_to(embed.STATIC).as_posix().startswith(("js/embed/", "js/widget.js"))}
    assert {"attnscope/js/main.js", "attnscope/js/views/heatmap.js", "attnscope/i18n/zh.js"} <= set(sources)
    assert served <= set(sources)
    spec = re.compile(r"""(["'])(?:\.{1,2}/|attnscope/)[^"']+\1""")
    for name, source in sources.items():  # the same file, only its import specifiers rewritten: no fork
        original = (embed.STATIC / name.removeprefix("attnscope/")).read_text(encoding="utf-8")
        assert spec.sub("''", source) == spec.sub("''", original), name
    assert sorted(p.name for p in (embed.STATIC / "js" / "embed").iterdir()) == ["offline.js", "transport.js"]


def test_show_outside_a_notebook_says_what_to_do(edited: tuple[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    model, tokenizer = edited
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        assert attnscope.show(model, tokenizer, TEXT) is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == "attnscope"]
    assert "attnscope serve" in line and "\n" not in line


def test_the_page_travels_as_a_message_and_a_reexecuted_cell_replaces_its_widget(
        edited: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = edited
    scope = attnscope.Scope(model, tokenizer, name="edited")
    monkeypatch.setattr("attnscope.app.notebook.current_cell", lambda: "cell-7")
    first = Explorer(scope, text=TEXT, lang="zh")
    assert "html" not in first.get_state()  # the 5 MB page is not widget state a notebook would save
    assert first.get_state()["query"] == "?lang=zh&text=the+cat+sat+on+the+mat%3B+the+cat+sat."
    pages: list[bytes] = []
    first.reply = lambda content, buffers: pages.extend(buffers)  # type: ignore[method-assign]
    first._on_msg(first, {"type": "page"}, [])
    (page,) = pages
    assert page.startswith(b"<!doctype html") and b"?lang=zh&text=the+cat+sat" in page and len(page) > 1_000_000
    thread = first._bridge._thread
    second = Explorer(scope, text=TEXT)  # the same cell, executed again
    thread.join(timeout=10)
    assert not thread.is_alive() and first.comm is None  # the old widget is closed, its worker gone
    assert second.comm is not None and second._bridge._thread.is_alive()
    monkeypatch.setattr("attnscope.app.notebook.current_cell", lambda: "cell-8")
    third = Explorer(scope, text=TEXT)  # another cell: both stay
    assert second.comm is not None and third.comm is not None
    second.close()
    third.close()


def test_two_scopes_on_one_model_take_turns(edited: tuple[Any, Any]) -> None:
    """Two widgets (two Scopes) over the same model object, asked at once: each borrow sees the model's
    own attention implementation, and it is restored at the end."""
    model, tokenizer = edited
    scopes = [attnscope.Scope(model, tokenizer, name=f"s{i}") for i in range(2)]
    failures: list[BaseException] = []

    def work(scope: attnscope.Scope) -> None:
        try:
            for _ in range(4):
                run = scope.run(TEXT)
                assert run.attention(layer=1, head=2).shape[0] == len(run.tokens)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in scopes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failures == [] and model.config._attn_implementation == "sdpa"


def test_a_bf16_model_is_inspected_as_it_stands() -> None:
    """The user's model in bfloat16, as it is: the widget's answers are that model's (no float32 copy)."""
    model = build_edited("sdpa").to(torch.bfloat16)
    scope = attnscope.Scope(model, tiny_tokenizer(), name="bf16")
    explorer = Explorer(scope, text=TEXT)
    frame = Frame(explorer)
    try:
        info = json.loads(frame.request("GET", "/api/models")["body"])["models"][0]
        assert info["dtype"] == "bfloat16"
        run = json.loads(frame.request("POST", "/api/runs", {"text": TEXT})["body"])
        n = len(run["tokens"])
        got = frame.request("GET", f"/api/runs/{run['run_id']}/attention?layer=1&head=2&format=f32")
        sent = np.zeros((n, n), dtype=np.float32)
        sent[np.tril_indices(n)] = np.frombuffer(got["body"], dtype="<f4")
        np.testing.assert_allclose(sent.sum(-1), 1.0, atol=1e-3)  # each row a distribution
        direct = scope.run(TEXT).attention(layer=1, head=2).float().numpy()  # the Python door, same model
        np.testing.assert_allclose(sent, direct, atol=1e-6)
        assert next(model.parameters()).dtype == torch.bfloat16  # nothing converted in place
    finally:
        explorer.close()
