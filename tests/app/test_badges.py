"""Head badges mean what they say, on the bundled model (issue 27 §2).

The induction score counts only evidence of copying (``model.analysis.INDUCTION_RULE``): on
everyday sentences with a repeated word it is null (too few repeats far enough back) and no head
is called an induction head; on a repeated passage the heads that copy score, the bundled model's
induction head (layer 4 head 0, the model card's) first. The previous-token and first-token
badges (drawn by static/js/views/headgrid.js) are checked in tests/web/test_badges_browser.py; the
numbers their rule reads are checked here against the same rule, written once in Python below."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.scores.analysis import INDUCTION_MIN_QUERIES
from attnscope.model.services.engine import Engine

EVERYDAY = [
    "I think that the dog and the cat are friends.",
    "In the morning the children go up to the hill.",
    "The man saw the woman and the woman saw the man.",
    "She said that she would go to the store and buy some bread for the family.",
    "My friend told me that the book was better than the film, but I liked the film.",
]
PASSAGES = [
    "The cat sat on the mat. The cat sat on the mat.",
    "Alice and Bob went to the market. Alice bought apples and Bob bought pears. Alice and Bob went home.",
    "我爱人工智能，我爱学习，我爱人工智能。",
]
IND, MIN_ROWS = 0.3, 4  # headgrid.js: the "I" threshold, and the rows P and S need
SINK_COMMON, SINK_FEW = 0.25, 3  # headgrid.js: more sinks than this share (and count) are counted, not badged


def chance(n: int) -> float:
    """What an evenly spread causal head scores on the previous (or first) token over n tokens."""
    return sum(1 / (i + 1) for i in range(1, n)) / (n - 1)


def badges(heads: list[dict], n: int) -> dict[str, list[tuple[int, int]]]:
    """headgrid.js's badgesFor, over a run's heads."""
    c = chance(n)
    enough = n - 1 >= MIN_ROWS
    sinks = [(h["layer"], h["head"]) for h in heads if enough and h["first_token"] >= max(0.6, (1 + c) / 2)]
    return {
        "prev": [(h["layer"], h["head"]) for h in heads if enough and h["prev_token"] >= max(0.5, (1 + c) / 2)],
        # a pretrained model's heads mostly rest on token 0: where most do, no cell is badged S
        "sink": [] if len(sinks) > SINK_FEW and len(sinks) > SINK_COMMON * len(heads) else sinks,
        "ind": [(h["layer"], h["head"]) for h in heads if h["induction"] is not None and h["induction"] >= IND],
    }


@pytest.fixture(scope="module")
def bundled(bundled_engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(models={}, default_model="attnscope-tiny"), bundled_engine)) as c:
        yield c


def analysed(client: TestClient, text: str) -> tuple[dict, list[dict]]:
    run = client.post("/api/runs", json={"text": text})
    assert run.status_code == 201, run.text
    body = run.json()
    heads = client.get(f"/api/runs/{body['run_id']}/heads", params={"wait": 60}).json()
    assert heads["scores_pending"] == []
    return body, heads["heads"]


@pytest.fixture(scope="module")
def previous_token_heads(bundled: TestClient) -> set[tuple[int, int]]:
    """The heads that put at least half their attention on the previous token over 300+ tokens of
    everyday English, where short rows no longer lift every score."""
    text = (Path(__file__).parents[1] / "data" / "everyday_english.txt").read_text()[:1500]
    run, heads = analysed(bundled, text)
    assert len(run["tokens"]) > 300
    return {(h["layer"], h["head"]) for h in heads if h["prev_token"] >= 0.5}


@pytest.mark.parametrize("text", EVERYDAY)
def test_everyday_sentences_call_no_head_an_induction_head(bundled: TestClient, text: str,
                                                           previous_token_heads: set[tuple[int, int]]) -> None:
    run, heads = analysed(bundled, text)
    assert run["induction_min_queries"] == INDUCTION_MIN_QUERIES
    assert run["induction_queries"] < INDUCTION_MIN_QUERIES  # one repeated word: too little evidence
    assert all(h["induction"] is None for h in heads)
    got = badges(heads, len(run["tokens"]))
    assert len(got["ind"]) == 0
    # only heads that read the previous token on long text too (the model card's L1H7 and L3H6 among
    # them), not every head that short rows lift
    assert {(1, 7), (3, 6)} <= previous_token_heads and len(previous_token_heads) <= 4
    assert set(got["prev"]) <= previous_token_heads and len(got["prev"]) <= 3, got["prev"]
    assert len(got["sink"]) <= 3, got["sink"]  # heads that rest on token 0 of this prompt: a few, not most


@pytest.mark.parametrize("text", PASSAGES)
def test_a_repeated_passage_badges_the_heads_that_copy(bundled: TestClient, text: str) -> None:
    run, heads = analysed(bundled, text)
    assert run["induction_queries"] >= INDUCTION_MIN_QUERIES
    scores = {(h["layer"], h["head"]): h["induction"] for h in heads}
    assert all(v is not None for v in scores.values())
    best = max(scores, key=lambda key: scores[key])
    assert best == (4, 0)  # the model card's induction head
    got = badges(heads, len(run["tokens"]))["ind"]
    assert (4, 0) in got and len(got) <= 3
    assert all(layer > 0 for layer, _ in got)  # copying needs a previous-token head's output first
    # a layer-0 head can only match positions and tokens: it never shows copying evidence
    assert max(v for (layer, _), v in scores.items() if layer == 0) < IND


# ---- SmolLM2-135M (issue 37 §6): 30 layers x 9 heads, where resting on token 0 is the norm ----------

@pytest.fixture(scope="module")
def smollm2() -> Iterator[TestClient]:
    from attnscope.model.load.models import load_model
    from attnscope.model.load.sources import known_file
    from tests.support.tiny import make_engine

    if known_file("smollm2-135m") is None:
        pytest.skip("SmolLM2-135M's GGUF file is not on this machine")
    engine = make_engine({"smollm2-135m": load_model("smollm2-135m", "smollm2-135m")}, "smollm2-135m")
    with TestClient(create_app(Settings(models={}, default_model="smollm2-135m"), engine)) as c:
        yield c


@pytest.mark.parametrize("text", EVERYDAY)
def test_smollm2_badges_stay_informative(smollm2: TestClient, text: str) -> None:
    """The S rule passes 100-180 of SmolLM2's 270 heads on an everyday sentence: counted, not badged.
    P stays a handful of heads and I none, so those badges keep their rule."""
    run, heads = analysed(smollm2, text)
    n = len(run["tokens"])
    c = chance(n)
    passing = [h for h in heads if h["first_token"] >= max(0.6, (1 + c) / 2)]
    assert len(passing) > SINK_COMMON * len(heads)  # most heads: the model's resting state
    got = badges(heads, n)
    assert got["sink"] == []
    assert 1 <= len(got["prev"]) <= 6, got["prev"]
    assert got["ind"] == []
