"""Text that is not ASCII: byte-level tokens that hold part of a character never repeat it.

Every character belongs to the one token that holds its last byte, so spans never overlap,
consecutive spans are contiguous, and joined they rebuild the text exactly once — through
POST /api/runs, through a recorded generation, and for the encoder's WordPiece.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import TextAssembler, tokenize
from attnscope.model.services.engine import Engine
from tests.support.sse import events as sse_events

TEXTS = {
    "cjk": "我爱人工智能龘",  # whole characters, and a rare one in byte pieces
    "emoji": "I love 🤖",
    "zwj": "family 👩\u200d👩\u200d👧 and 🏳️\u200d🌈",
    "combining": "cafe\u0301 na\u0308ive",
    "rtl": "שלום עולם مرحبا بالعالم",
    "mixed": "GPT 模型 😀👍🏽 done",
}


def assert_spans_rebuild(text: str, tokens: list[dict]) -> None:
    cursor = 0
    for t in tokens:
        assert t["start"] == cursor, f"token {t['index']} starts at {t['start']}, the previous ended at {cursor}"
        assert t["end"] >= t["start"]
        cursor = t["end"]
    assert cursor == len(text)
    assert "".join(text[t["start"]:t["end"]] for t in tokens) == text


def assert_no_repeated_characters(text: str, tokens: list[dict]) -> None:
    """What a person sees, joined, holds every character once: a partial token shows
    bytes (‹e6 88›), never the whole character again."""
    shown = re.sub(r"‹[0-9a-f ]+›", "", "".join(t["text"] for t in tokens if not t["special"]))
    for ch in set(text) - {" "}:
        assert shown.count(ch) == text.count(ch), (ch, shown)
    for t in tokens:
        if t["partial"]:
            assert "‹" in t["text"] and "›" in t["text"], t


@pytest.mark.parametrize("name", list(TEXTS))
def test_run_spans_rebuild_the_text_once(client: TestClient, name: str) -> None:
    text = TEXTS[name]
    r = client.post("/api/runs", json={"text": text, "model": "tiny-gpt2"})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["text"] == text
    assert_spans_rebuild(text, run["tokens"])
    assert_no_repeated_characters(text, run["tokens"])
    assert any(t["partial"] for t in run["tokens"]), "these texts split characters over byte-level tokens"


def test_cjk_character_shows_on_its_last_byte(client: TestClient) -> None:
    run = client.post("/api/runs", json={"text": "龘爱", "model": "tiny-gpt2"}).json()  # a rare character: byte pieces
    shown = [t["text"] for t in run["tokens"]]
    assert shown.count("龘") == 1 and shown.count("爱") == 1
    first = run["tokens"][0]
    assert first["partial"] and first["text"].startswith("‹e9") and first["start"] == first["end"] == 0


@pytest.mark.parametrize("name", list(TEXTS))
def test_encoder_spans_rebuild_the_text_once(client: TestClient, name: str) -> None:
    text = TEXTS[name]
    run = client.post("/api/runs", json={"text": text, "model": "minilm-l6"}).json()
    assert_spans_rebuild(text, run["tokens"])
    assert run["tokens"][0]["special"] and run["tokens"][-1]["special"]  # [CLS] ... [SEP]


def test_an_unknown_character_shows_as_the_unknown_token(client: TestClient, engine: Engine) -> None:
    """WordPiece maps a character it lacks to [UNK]: the chip says [UNK] (what the model sees),
    its span still holds the character it stands for."""
    tokenizer = engine.model("minilm-l6").tokenizer
    text = "I love 🤖 now"
    run = client.post("/api/runs", json={"text": text, "model": "minilm-l6"}).json()
    unknown = [t for t in run["tokens"] if t["id"] == tokenizer.unk_token_id]
    assert len(unknown) == 1, run["tokens"]
    assert unknown[0]["text"] == tokenizer.unk_token and not unknown[0]["special"]
    assert text[unknown[0]["start"]:unknown[0]["end"]].strip() == "🤖"
    assert_spans_rebuild(text, run["tokens"])


@pytest.mark.parametrize("name", ["cjk", "emoji", "zwj"])
def test_recorded_generation_text_is_prompt_plus_generated(client: TestClient, name: str) -> None:
    prompt = TEXTS[name]
    body = {"text": prompt, "model": "tiny-gpt2", "max_new_tokens": 24, "temperature": 1.0, "seed": 3,
            "record": True, "stop_at_eos": False}
    events = sse_events(client.post("/api/generate", json=body).text)
    steps = [d for e, d in events if e == "token"]
    done = next(d for e, d in events if e == "done")
    run_id = next(d for e, d in events if e == "run")["run_id"]
    run = client.get(f"/api/runs/{run_id}").json()
    assert run["text"] == prompt + done["text"]
    assert_spans_rebuild(run["text"], run["tokens"])
    # the streamed pieces, joined, are the generated text (bar bytes the last step left incomplete)
    streamed = "".join(s["text"] for s in steps)
    assert done["text"].startswith(streamed) and set(done["text"][len(streamed):]) <= {"\ufffd"}
    assert "<|endoftext|>" not in done["text"]
    for s in steps:
        if s["partial"]:
            assert "‹" in s["token"]


def test_assembler_matches_the_tokenizer(tiny_models: dict[str, LoadedModel]) -> None:
    tok = tiny_models["gpt2"].tokenizer
    for text in TEXTS.values():
        ids = [t.id for t in tokenize(tok, text)]
        asm = TextAssembler(tok)
        pieces = [asm.push(i) for i in ids]
        asm.finish()
        assert "".join(p.text for p in pieces) == asm.text == text == tok.decode(ids)


def test_prompt_box_text_after_generation_has_no_repeats(client: TestClient) -> None:
    """What the browser writes back into the prompt box is run.text: the prompt once."""
    prompt = TEXTS["cjk"]
    events = sse_events(client.post("/api/generate", json={"text": prompt, "model": "tiny-gpt2", "max_new_tokens": 3,
                                                           "temperature": 0, "record": True}).text)
    run = client.get(f"/api/runs/{next(d for e, d in events if e == 'run')['run_id']}").json()
    assert run["text"].startswith(prompt) and run["text"].count("我") == prompt.count("我")
