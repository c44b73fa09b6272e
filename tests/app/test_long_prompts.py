"""An over-long prompt is refused after reading only as much of it as the limit needs, and the
first N tokens of a text come without tokenizing the rest (``count_tokens`` / ``first_tokens``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load import tokens as tokens_module
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import count_tokens, first_tokens, max_chars_per_token, read_cap, tokenize
from attnscope.model.services.engine import Engine

WORDS = "the quick brown fox jumps over the lazy dog and 猫 sat on a mat, it's 😀 there. "
BIG = (WORDS * (3_900_000 // len(WORDS) + 1))[:3_900_000]  # 3.9 MB: under the 4 MiB body limit


@pytest.fixture(scope="module")
def big_client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(models={}, default_model="tiny-gpt2"), engine)) as c:
        yield c


@pytest.fixture
def read_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text the tokenizer is given, through either of tokens.py's paths."""
    sizes: list[int] = []
    spans, whole = tokens_module._spans, tokens_module.tokenize

    def counted_spans(tokenizer: PreTrainedTokenizerBase, text: str) -> list[tuple[int, int]]:
        sizes.append(len(text))
        return spans(tokenizer, text)

    def counted_tokenize(tokenizer: PreTrainedTokenizerBase, text: str,
                         add_special_tokens: bool = True) -> list[tokens_module.Token]:
        sizes.append(len(text))
        return whole(tokenizer, text, add_special_tokens)

    monkeypatch.setattr(tokens_module, "_spans", counted_spans)
    monkeypatch.setattr(tokens_module, "tokenize", counted_tokenize)
    monkeypatch.setattr("attnscope.model.load.limits.tokenize", counted_tokenize)
    return sizes


@pytest.mark.parametrize("text", [BIG, "a" * 3_900_000, "😀" * 900_000], ids=["words", "one-word", "emoji"])
@pytest.mark.parametrize("model", ["tiny-gpt2", "tiny-llama", "minilm-l6"])
def test_a_huge_prompt_is_refused_naming_the_limit_without_reading_it_all(
        big_client: TestClient, engine: Engine, read_sizes: list[int], text: str, model: str) -> None:
    limit = engine.token_limit(engine.model(model))
    r = big_client.post("/api/runs", json={"text": text, "model": model})
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert f"more than this model's limit of {limit}" in message or f"reads for its limit of {limit}" in message
    assert message.startswith(("the prompt has at least ", f"the prompt has {len(text):,} characters")), message
    assert max(read_sizes, default=0) < 100_000, "the tokenizer was given most of the text"


def test_generation_and_timing_refuse_a_huge_prompt_too(big_client: TestClient, read_sizes: list[int]) -> None:
    for path in ("/api/generate", "/api/timing"):
        r = big_client.post(path, json={"text": BIG})
        assert r.status_code == 422 and "more than this model's limit of 256" in r.json()["message"], r.text
    assert max(read_sizes, default=0) < 100_000


def test_a_prompt_counted_whole_names_its_exact_count(client: TestClient, engine: Engine) -> None:
    text = " ".join(["word"] * 300)  # ~300 tokens: over the tiny models' 256 positions, short enough to count
    n = len(tokenize(engine.model("tiny-gpt2").tokenizer, text))
    r = client.post("/api/runs", json={"text": text})
    assert r.status_code == 422
    assert r.json()["message"] == f"the prompt has {n} tokens, more than this model's limit of 256"


def test_a_prompt_at_the_limit_is_still_analysed(client: TestClient, engine: Engine) -> None:
    tok = engine.model("tiny-gpt2").tokenizer
    text = " ".join(["word"] * 400)
    head = first_tokens(tok, text, 256)
    assert head.cut and len(head.tokens) == len(tokenize(tok, head.text)) <= 256
    r = client.post("/api/runs", json={"text": head.text})
    assert r.status_code == 201 and len(r.json()["tokens"]) == len(head.tokens)


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    pieces = [*"abc de  f,.'\n\t猫😀éx1234", "it's ", "hello ", "the ", "   ", "<|endoftext|>", "a" * 40]
    out = []
    while len(out) < count:
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 300)))
        if text.strip():
            out.append(text)
    return out


@pytest.mark.parametrize("which", ["gpt2", "encoder"])
def test_counts_and_first_tokens_agree_with_tokenizing_everything(
        tiny_models: dict[str, LoadedModel], encoder: LoadedModel, which: str) -> None:
    tok = tiny_models["gpt2"].tokenizer if which == "gpt2" else encoder.tokenizer
    rng = random.Random(1)
    for text in _texts(2, 150):
        full = tokenize(tok, text)
        limit = rng.randint(3, 120)
        count = count_tokens(tok, text, limit)
        if count.exact:
            assert count.n == len(full)
        else:  # a lower bound, already over the limit
            assert limit < count.n <= len(full)
        assert count.exact or len(full) > limit
        head = first_tokens(tok, text, limit)
        assert head.cut == (len(full) > limit)
        assert text.startswith(head.text) and len(head.tokens) <= limit
        assert head.tokens == tokenize(tok, head.text)  # spans rebuild the kept text exactly
        if head.cut:  # the whole text's first tokens, give or take the one at the cut
            kept = [t.id for t in head.tokens[:-1]]
            assert kept == [t.id for t in full[:len(kept)]]
            # short only by a character's byte tokens at the cut (a text is cut between characters)
            assert len(head.tokens) >= limit - 4
        else:
            assert head.text == text and head.tokens == full


def test_which_tokenizers_bound_the_characters_of_a_token(tiny_models: dict[str, LoadedModel],
                                                          encoder: LoadedModel) -> None:
    per_token = max_chars_per_token(tiny_models["gpt2"].tokenizer)  # byte-level BPE: its longest token, in bytes
    assert per_token is not None and per_token >= len("<|endoftext|>")
    assert max_chars_per_token(encoder.tokenizer) is None  # WordPiece drops spaces and folds long words to [UNK]
    assert read_cap(encoder.tokenizer, 512) == 512 * tokens_module.UNREAD_CHARS_PER_TOKEN
    assert read_cap(tiny_models["gpt2"].tokenizer, 512) is None


def test_an_encoder_prompt_past_what_it_reads_is_refused_by_its_length(big_client: TestClient) -> None:
    r = big_client.post("/api/runs", json={"text": "a" * 100_000, "model": "minilm-l6"})  # one [UNK], if read
    assert r.status_code == 422
    assert r.json()["message"].startswith("the prompt has 100,000 characters, more than this model reads for its "
                                          "limit of 512 tokens (32,768: 64 a token)")


def test_each_at_least_refusal_is_translated_with_its_reason(big_client: TestClient) -> None:
    """The Chinese page says why a count is "at least" (a beginning counted, or the length alone), as the
    English server message does: each wording the server writes has its own code and key."""
    from tests.support.i18n_check import error_key

    seen = set()
    for model, text in (("tiny-gpt2", BIG), ("tiny-llama", BIG), ("tiny-gpt2", "word " * 2000)):
        body = big_client.post("/api/runs", json={"text": text, "model": model}).json()
        message = body["message"]
        key = error_key(body["code"])
        if message.startswith("the prompt has at least "):
            want = ("err.too_long_at_least_read" if "counted in its first" in message
                    else "err.too_long_at_least_length")
            assert key == want, (message, key)
            seen.add(key)
    assert seen, "no at-least refusal was produced"
