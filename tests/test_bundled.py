"""The bundled models, loaded offline exactly as the app's default configuration loads them.

The decoder's bars (issue 16) are checked here on the shipped weights, through the engine
and the HTTP API the app uses, on text generated in the test or held out from training
(tests/data/heldout_sample.txt: documents of the held-out split of scripts/build_corpus.py).
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from app.main import create_app
from app.settings import Settings
from model.analysis import head_scores, previous_token_weights
from model.engine import Engine
from model.hooks import run_with_cache
from model.loading import BUNDLED_DIR, LoadedModel
from model.tokens import ids_tensor, tokenize

FOLDER = BUNDLED_DIR / "attnscope-tiny"
HELDOUT = Path(__file__).parent / "data" / "heldout_sample.txt"
_CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def default_client() -> Iterator[TestClient]:
    """The app with its default settings: both bundled models, the decoder as default."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with TestClient(create_app(Settings())) as client:
        yield client


@pytest.fixture(scope="module")
def default_engine(default_client: TestClient) -> Engine:
    engine: Engine = default_client.app.state.engine  # type: ignore[attr-defined]
    return engine


@pytest.fixture(scope="module")
def tiny(default_engine: Engine) -> LoadedModel:
    return default_engine.model("attnscope-tiny")


def english_heldout() -> str:
    return "\n\n".join(d for d in HELDOUT.read_text(encoding="utf-8").split("\n\n") if not _CJK.search(d))


def test_default_models_are_both_bundled_ones(default_client: TestClient) -> None:
    models = {m["name"]: m for m in default_client.get("/api/models").json()["models"]}
    assert set(models) == {"attnscope-tiny", "minilm-l6"}
    tiny, enc = models["attnscope-tiny"], models["minilm-l6"]
    assert tiny["default"] and tiny["causal"] and tiny["architecture"] == "gpt2"
    assert tiny["n_heads"] == 8 and tiny["d_model"] == 8 * tiny["d_head"] and 4 <= tiny["n_layers"] <= 6
    assert tiny["max_positions"] >= 1024 and tiny["position_encoding"] == "learned"
    assert not enc["default"] and not enc["causal"] and enc["architecture"] == "bert"
    assert enc["n_layers"] == 6 and enc["n_heads"] == 12


def test_size_weights_and_tokenizer_files(tiny: LoadedModel) -> None:
    weights = FOLDER / "model.safetensors"
    assert weights.exists() and weights.stat().st_size <= 40 * 1024 * 1024
    assert tiny.info.n_params <= 20_000_000 and tiny.info.max_positions >= 1024
    tok = AutoTokenizer.from_pretrained(FOLDER)
    assert len(tok) <= 32_768 and len(tok) == tiny.info.vocab_size
    for text in ("dog bites man", "我爱人工智能", "Once upon a time, 在计算机科学中 ✓"):
        assert tok.decode(tok(text)["input_ids"]) == text
    for name in ("README.md", "training_curve.png", "measurements.json", "training.json", "corpus.json"):
        assert (FOLDER / name).exists(), name
    assert not (FOLDER / "state.pt").exists()  # the optimiser's state stays out of git


@pytest.mark.parametrize("sentence", [
    "dog bites man", "man bites dog", "I love artificial intelligence", "The cat sat on the mat",
    "The weather today is cold", "In the morning I drink a cup of coffee", "She opened the window and looked outside",
])
def test_common_english_words_are_whole_tokens(sentence: str) -> None:
    tok = AutoTokenizer.from_pretrained(FOLDER)
    pieces = [tok.decode([i]) for i in tok(sentence)["input_ids"]]
    assert [p.strip() for p in pieces] == sentence.split(), pieces


def test_common_chinese_characters_are_whole_tokens() -> None:
    tok = AutoTokenizer.from_pretrained(FOLDER)
    assert len(tok("我爱人工智能")["input_ids"]) <= 6
    text = "今天天气很好，我们去公园散步吧。"
    pieces = [tok.decode([i]) for i in tok(text)["input_ids"]]
    assert pieces == list(text), pieces  # one character per token, never a fragment of one


def test_heldout_loss_is_well_below_uniform(tiny: LoadedModel) -> None:
    ids = ids_tensor(tokenize(tiny.tokenizer, english_heldout()))[:1024]
    with torch.inference_mode():
        loss = tiny.model(input_ids=ids[None], labels=ids[None]).loss.item()
    assert loss < 0.6 * math.log(tiny.info.vocab_size), loss


def test_previous_token_heads_at_every_position(tiny: LoadedModel) -> None:
    """Two heads >= 0.5 (scored by the engine) over a full window of held-out text, and on every
    stretch of 128 positions of it up to the model's context."""
    n = tiny.info.max_positions
    ids = ids_tensor(tokenize(tiny.tokenizer, english_heldout()))[:n]
    assert len(ids) == n
    acts = run_with_cache(tiny, ids, lambda name: name.endswith("hook_pattern"))
    patterns = [acts[f"blocks.{i}.attn.hook_pattern"] for i in range(tiny.info.n_layers)]  # L x (H, n, n)
    prev = [s.prev_token for i, pattern in enumerate(patterns) for s in head_scores(i, pattern, ids)]
    assert sum(p >= 0.5 for p in prev) >= 2, prev
    per_query = torch.cat([previous_token_weights(p) for p in patterns])  # (L*H, n-1): queries 1..n-1
    stretches = torch.cat([per_query[:, :1], per_query], dim=1).reshape(len(per_query), -1, 128).mean(-1)
    lowest = stretches.amin(-1)  # (L*H,): each head's weakest stretch
    assert int((lowest >= 0.5).sum()) >= 2, stretches.tolist()


def test_induction_on_repeated_random_words(default_client: TestClient, tiny: LoadedModel) -> None:
    """Random common words (drawn here), repeated: a head attends to the token after the earlier copy."""
    vocab = tiny.tokenizer.get_vocab()
    words = sorted(t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isascii() and t[1:].isalpha()
                   and t[1:].islower() and len(t) > 3)
    best = []
    for seed in range(3):
        run_words = " ".join(random.Random(seed).sample(words, 30))
        run = default_client.post("/api/runs", json={"text": f"{run_words} {run_words}"}).json()
        best.append(max(h["induction"] for h in run["heads"]))
    assert sum(best) / len(best) >= 0.4, best


def test_repeated_sentence_shows_an_induction_head(default_client: TestClient) -> None:
    """The explorer badges a head 'ind' at induction >= 0.3 (static/js/views/headgrid.js)."""
    run = default_client.post("/api/runs", json={"text": "The cat sat on the mat. The cat sat on the mat."}).json()
    assert max(h["induction"] for h in run["heads"]) >= 0.3, [h["induction"] for h in run["heads"]]


def greedy(lm: LoadedModel, prompt: str, new_tokens: int = 16) -> list[str]:
    """The greedy continuation's tokens, up to (not including) <|endoftext|>."""
    enc = lm.tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = lm.model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                pad_token_id=lm.tokenizer.eos_token_id)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    eos = lm.tokenizer.eos_token_id
    return [lm.tokenizer.decode([i]) for i in (new[: new.index(eos)] if eos in new else new)]


@pytest.mark.parametrize("prompt", ["Once upon a time", "The weather today is", "In the morning, I"])
def test_greedy_continuation_runs_on_in_english(tiny: LoadedModel, prompt: str) -> None:
    pieces = greedy(tiny, prompt)
    english = [p for p in pieces if re.fullmatch(r"\s?[A-Za-z]+", p)]
    assert len(english) >= 8, pieces


@pytest.mark.parametrize("prompt", ["今天天气很好，", "我爱人工智能"])
def test_chinese_prompts_continue_in_chinese(tiny: LoadedModel, prompt: str) -> None:
    pieces = greedy(tiny, prompt, 12)
    assert sum(bool(_CJK.fullmatch(p)) for p in pieces) >= 4, pieces


def test_encoder_runs_through_the_same_engine(default_client: TestClient) -> None:
    run = default_client.post("/api/runs", json={"text": "dog bites man", "model": "minilm-l6"}).json()
    assert not run["causal"] and run["predictions"] == [] and len(run["heads"]) == 72
    texts = [t["text"] for t in run["tokens"]]
    assert texts == ["[CLS]", "dog", "bites", "man", "[SEP]"]
    rows = default_client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 5, "head": 0}).json()["rows"]
    assert all(len(r) == 5 for r in rows) and rows[0][4] > 0


def test_head_scores_come_from_the_engine(default_client: TestClient) -> None:
    text = "one two three four five six seven. one two three four five six seven."
    run = default_client.post("/api/runs", json={"text": text}).json()
    assert all(h["induction"] is not None for h in run["heads"])  # the prompt repeats itself
    models = default_client.get("/api/models").json()["models"]
    for m in models:
        scores = m["induction_scores"]
        assert len(scores) == m["n_layers"] and len(scores[0]) == m["n_heads"]
        assert len({round(v, 6) for row in scores for v in row}) > 1  # measured, not constant
