"""The bundled models, loaded offline exactly as the app's default configuration loads them."""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.capture.forward import run_with_cache
from attnscope.model.capture.names import act_name, kind_of
from attnscope.model.load.models import BUNDLED_DIR
from attnscope.model.load.tokens import ids_tensor, tokenize
from attnscope.model.scores.analysis import head_scores, previous_token_weights
from attnscope.model.services.engine import Engine

FOLDER = BUNDLED_DIR / "attnscope-tiny"
HELDOUT = Path(__file__).parents[1] / "data" / "heldout_sample.txt"


@pytest.fixture(scope="module")
def default_client() -> Iterator[TestClient]:
    """The app with its default settings: both bundled models, the decoder as default."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with TestClient(create_app(Settings())) as client:
        yield client


@pytest.fixture(scope="module")
def bundled_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(FOLDER)


@pytest.fixture(scope="module")
def default_engine(default_client: TestClient) -> Engine:
    return default_client.app.state.engine


def test_default_models_are_both_bundled_ones(default_client: TestClient) -> None:
    models = {m["name"]: m for m in default_client.get("/api/models").json()["models"]}
    assert set(models) == {"attnscope-tiny", "minilm-l6"}
    tiny, enc = models["attnscope-tiny"], models["minilm-l6"]
    assert tiny["default"] and tiny["causal"] and tiny["architecture"] == "llama"
    assert tiny["n_heads"] == 8 and tiny["d_model"] == 8 * tiny["d_head"] and 4 <= tiny["n_layers"] <= 8
    assert tiny["max_positions"] >= 1024 and tiny["position_encoding"] == "rotary"
    assert not enc["default"] and not enc["causal"] and enc["architecture"] == "bert"
    assert enc["n_layers"] == 6 and enc["n_heads"] == 12


def test_weights_and_tokenizer_files() -> None:
    weights = FOLDER / "model.safetensors"
    assert weights.exists() and weights.stat().st_size <= 40 * 1024 * 1024
    tok = AutoTokenizer.from_pretrained(FOLDER)
    assert 16000 <= len(tok) <= 32768
    assert tok.decode(tok("dog bites man")["input_ids"]) == "dog bites man"
    assert (FOLDER / "README.md").exists() and (FOLDER / "training_curve.png").exists()


def test_parameter_budget(default_engine: Engine) -> None:
    params = default_engine.model("attnscope-tiny").info.n_params
    assert params <= 20_000_000, params


@pytest.mark.parametrize("text", ["dog bites man", "man bites dog", "I love artificial intelligence",
                                  "The cat sat on the mat", "The weather today is nice and warm",
                                  "In the morning I drink a cup of coffee and read the news",
                                  "She opened the window and looked at the garden"])
def test_common_english_words_are_single_tokens(bundled_tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    tok = bundled_tokenizer
    pieces = [tok.decode([i]) for i in tok(text)["input_ids"]]
    assert [p.strip() for p in pieces] == text.split(), pieces


@pytest.mark.parametrize("text", ["我爱人工智能", "今天天气很好"])
def test_chinese_characters_are_whole_tokens(bundled_tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    tok = bundled_tokenizer
    pieces = [tok.decode([i]) for i in tok(text)["input_ids"]]
    assert pieces == list(text), pieces


def test_an_induction_head_emerged(default_engine: Engine) -> None:
    """Random common words (drawn here, so never seen as such in training) repeated once: some head's
    engine-scored induction (attention from the second copy to the token after the first) is >= 0.4."""
    lm = default_engine.model("attnscope-tiny")
    vocab = lm.tokenizer.get_vocab()
    words = sorted(t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isascii() and t[1:].isalpha()
                   and t[1:].islower() and len(t) > 3)
    scores = torch.zeros(lm.info.n_layers, lm.info.n_heads)
    for seed in range(4):
        run = " ".join(random.Random(seed).sample(words, 40))
        ids = ids_tensor(tokenize(lm.tokenizer, f"{run} {run}"))
        acts = run_with_cache(lm, ids, lambda name: kind_of(name) == "pattern")
        for layer in range(lm.info.n_layers):
            heads = head_scores(layer, acts[act_name("pattern", layer)], ids)
            scores[layer] += torch.tensor([h.induction or 0.0 for h in heads]) / 4
    assert float(scores.max()) >= 0.4, scores.tolist()


def greedy(engine: Engine, prompt: str, new_tokens: int) -> list[int]:
    """The bundled model's greedy continuation of ``prompt``: the new token ids."""
    lm = engine.model("attnscope-tiny")
    enc = lm.tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = lm.model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                                pad_token_id=lm.tokenizer.eos_token_id)
    return out[0, enc["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("prompt", ["Once upon a time", "The weather today is", "In the morning, I"])
def test_greedy_continuations_run_on_in_english(default_engine: Engine, prompt: str) -> None:
    lm = default_engine.model("attnscope-tiny")
    new = greedy(default_engine, prompt, 10)
    eos = lm.tokenizer.eos_token_id
    before = new[: new.index(eos)] if eos in new else new
    english = [i for i in before if re.fullmatch(r"\s?[A-Za-z]+|[.,;:'!?]", lm.tokenizer.decode([i]))]
    assert len(before) >= 8 and len(english) >= 8, lm.tokenizer.decode(new)


def test_chinese_prompts_continue_in_chinese(default_engine: Engine) -> None:
    lm = default_engine.model("attnscope-tiny")
    enc = lm.tokenizer("今天天气很好，", return_tensors="pt")
    with torch.inference_mode():
        out = lm.model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=lm.tokenizer.eos_token_id)
    text = lm.tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert len(re.findall(r"[\u4e00-\u9fff]", text)) >= 4, text


def test_heldout_loss_is_well_below_uniform(default_engine: Engine) -> None:
    lm = default_engine.model("attnscope-tiny")
    ids = ids_tensor(tokenize(lm.tokenizer, HELDOUT.read_text(encoding="utf-8")))[:512]
    with torch.inference_mode():
        loss = lm.model(input_ids=ids[None], labels=ids[None]).loss.item()
    assert loss < 0.7 * math.log(lm.info.vocab_size), loss


def test_previous_token_heads_over_the_whole_context(default_engine: Engine) -> None:
    """Issue 3's bar (two heads >= 0.5, scored by the engine) over a full 1,024-token window of held-out
    text, and on that window's last 512 positions alone."""
    lm = default_engine.model("attnscope-tiny")
    n = lm.info.max_positions
    ids = ids_tensor(tokenize(lm.tokenizer, HELDOUT.read_text(encoding="utf-8")))[:n]
    assert len(ids) == n == 1024
    acts = run_with_cache(lm, ids, lambda name: kind_of(name) == "pattern")
    patterns = [acts[act_name("pattern", i)] for i in range(lm.info.n_layers)]  # L x (H, n, n)
    prev = [s.prev_token for i, pattern in enumerate(patterns) for s in head_scores(i, pattern, ids)]
    assert sum(p >= 0.5 for p in prev) >= 2, prev
    late = torch.cat([previous_token_weights(p)[:, n // 2 - 1 :].mean(-1) for p in patterns])  # (L*H,) queries 512..1023
    assert int((late >= 0.5).sum()) >= 2, late.tolist()


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
    assert "induction" in run["scores_pending"]  # the fused forward answers first; the scores follow
    heads = default_client.get(f"/api/runs/{run['run_id']}/heads", params={"wait": 60}).json()["heads"]
    assert all(h["induction"] is not None for h in heads)  # the prompt repeats itself
    models = default_client.get("/api/models").json()["models"]
    for m in models:
        scores = m["induction_scores"]
        assert len(scores) == m["n_layers"] and len(scores[0]) == m["n_heads"]
        assert len({round(v, 6) for row in scores for v in row}) > 1  # measured, not constant


def test_a_multi_token_answer_is_named_in_display_text(default_client: TestClient) -> None:
    """Patching's one-token check shows the pieces as the token strip does (never byte-level BPE strings like
    'èĥ½'), and its hint fits the case: a Chinese answer with a space before it is two tokens because of it."""
    body = {"clean": "我爱人工智", "corrupted": "我爱人工智", "answer": " 能", "wrong": "力"}
    r = default_client.post("/api/patch", json=body)
    assert r.status_code == 422
    message = r.json()["message"]
    assert "'能'" in message and "è" not in message and "the leading space is a token of its own" in message
    r = default_client.post("/api/patch", json={**body, "answer": " Maryland"})
    assert r.status_code == 422 and "' Peter'" in r.json()["message"] and "'land'" in r.json()["message"]
    r = default_client.post("/api/patch", json={**body, "clean": "I met Peter", "corrupted": "I met John",
                                                "answer": " Peter", "wrong": " John"})
    assert r.status_code == 200  # the hint's example is itself one token here


def test_the_patch_tools_default_pair_shows_the_induction_head(default_client: TestClient) -> None:
    """The Patch tool's default pair (static/js/tools/patching.js) is one this model tells apart:
    the clean prompt prefers the answer, the corrupted one the wrong token, and of all heads the
    model's strongest induction head (its card's measurement) restores the most."""
    source = (Path(__file__).resolve().parents[2] / "static" / "js" / "tools" / "patching.js").read_text(encoding="utf-8")
    block = source[source.index("const EXAMPLE = {"):]
    example = {k: json.loads(v) for k, v in re.findall(r'^\s+(\w+): ("[^"]*"),$', block[: block.index("};")], re.M)}
    assert set(example) == {"clean", "corrupted", "answer", "wrong"}
    r = default_client.post("/api/patch", json=example)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["clean"]["metric"] > 0 > out["corrupted"]["metric"]
    card = json.loads((BUNDLED_DIR / "attnscope-tiny" / "measurements.json").read_text())
    def argmax(grid: list[list[float]]) -> tuple[int, int]:
        return max(((layer, head) for layer, row in enumerate(grid) for head in range(len(row))),
                   key=lambda at: grid[at[0]][at[1]])

    assert argmax(out["heads"]) == argmax(card["induction_random_words"])
