"""The real pretrained decoder: SmolLM2-135M-Instruct from its GGUF file (Q4_1, de-quantized by
transformers; 30 layers x 9 heads, 3 K/V heads). Every reference is computed here from transformers'
own eager attention and ``generate`` on the same loaded weights, not written down."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
import torch

from attnscope.model.load.models import LoadedModel
from attnscope.model.scores.analysis import INDUCTION_NEAR
from attnscope.model.services.scope import Scope
from tests.support.induction import key_side_over_induction_cells

# ordinary words that SmolLM2's tokenizer keeps whole after a space
WORDS = ["apple", "river", "stone", "music", "garden", "window", "yellow", "doctor", "silver", "island", "market",
         "engine", "winter", "pencil", "forest", "butter", "camera", "planet", "rocket", "orange", "bridge",
         "candle", "mirror", "wallet", "ticket"]
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back into the forest to sleep."


@pytest.fixture(scope="module")
def scope(smollm2: LoadedModel) -> Iterator[Scope]:
    with Scope(smollm2.model, smollm2.tokenizer, name="smollm2-135m") as s:
        yield s


def repeated_words(seed: int = 0, count: int = 20) -> str:
    words = random.Random(seed).sample(WORDS, count)
    return " " + " ".join(words + words)


def eager(lm: LoadedModel, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """transformers' own eager attention on the same weights: L tensors (H, n, n)."""
    model = lm.model
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=ids[None], output_attentions=True)
    finally:
        model.set_attn_implementation(lm.spec.attn_implementation)
    return tuple(a[0].float() for a in out.attentions)


def test_the_gguf_model_is_what_the_file_says(smollm2: LoadedModel) -> None:
    info = smollm2.info
    assert (info.architecture, info.n_layers, info.n_heads, info.n_kv_heads, info.d_head) == ("llama", 30, 9, 3, 64)
    assert info.has_chat_template and info.vocab_size == 49152
    assert smollm2.model.lm_head.weight.data_ptr() == smollm2.model.model.embed_tokens.weight.data_ptr()  # tied


def test_sampled_heads_equal_transformers_eager_attention(scope: Scope, smollm2: LoadedModel) -> None:
    run = scope.run(TEXT)
    ids = run.record.input_ids
    ref = eager(smollm2, ids)
    heads = [(0, 0), (5, 8), (17, 5), (29, 8)] + [(random.Random(i).randrange(30), random.Random(-i).randrange(9))
                                                  for i in range(4)]
    for layer, head in heads:
        got = run.attention(layer, head)  # (n, n), rebuilt from the kept Q and K
        torch.testing.assert_close(got, ref[layer][head], atol=2e-5, rtol=0)
    for layer in (0, 29):  # the first-token score of every head of a layer is its eager mean
        expected = ref[layer][:, 1:, 0].mean(dim=1)
        got = torch.tensor([s.first_token for s in run.heads() if s.layer == layer])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_induction_scores_equal_the_rule_on_eager_attention_and_find_copying_heads(scope: Scope,
                                                                                    smollm2: LoadedModel) -> None:
    run = scope.run(repeated_words())
    ids = run.record.input_ids.tolist()
    n = len(ids)
    # each query's earlier copies far enough back (the rule: j + 1 < i - INDUCTION_NEAR): at most one here
    copies = {i: [j for j in range(i) if ids[j] == ids[i] and j + 1 < i - INDUCTION_NEAR] for i in range(n)}
    assert max(len(c) for c in copies.values()) == 1, "a word split into repeated pieces: the reference is ambiguous"
    queries = [(i, c[0]) for i, c in copies.items() if c]
    assert len(queries) >= 15
    ref = eager(smollm2, run.record.input_ids)
    expected = torch.stack([torch.stack([a[:, i, j + 1] - a[:, i, j] for i, j in queries]).mean(dim=0)
                            for a in ref])  # (L, H)
    got = torch.tensor([[s.induction for s in run.heads() if s.layer == layer] for layer in range(30)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # structure that is there: the best heads copy (most of a row on the token to copy), most heads do not
    assert float(expected.max()) > 0.5 > float(expected.median()) + 0.4
    # and the mean attention on the first token is far above what an even spread over the prefix gives
    first = torch.stack([a[:, 1:, 0].mean(dim=1) for a in ref])  # (L, H)
    even = sum(1 / (i + 1) for i in range(1, n)) / (n - 1)
    assert float(first.mean()) > 3 * even


def test_ablating_the_top_induction_head_lowers_the_repeated_tokens_probability(scope: Scope) -> None:
    run = scope.run(repeated_words(seed=1))
    best = max(run.heads(), key=lambda s: s.induction or -1.0)
    half = (run.record.n - 1) // 2
    result = run.ablate([(best.layer, best.head)])
    nexts = [(p.position, p.actual_next) for p in result.positions if p.actual_next]
    first = [c for pos, c in nexts if pos < half]  # nothing to copy yet
    second = [c for pos, c in nexts if pos > half + INDUCTION_NEAR]  # the next word occurred before

    def mean_log(probs: list[float]) -> float:
        return sum(math.log(max(p, 1e-12)) for p in probs) / len(probs)

    assert len(second) >= 10
    before = mean_log([c.prob_before for c in second])
    # the model copies: the repeated words are far likelier than the first time (measured: e^3.4 times)
    assert before > mean_log([c.prob_before for c in first]) + 2
    # and the head carries part of it (measured: ablated, the mean log probability falls by 1.5)
    assert mean_log([c.prob_after for c in second]) < before - 0.3


def test_greedy_generation_equals_transformers_generate(scope: Scope, smollm2: LoadedModel) -> None:
    prompt = "The capital of France is"
    ours = scope.generate(prompt, max_new_tokens=8, stop_at_eos=False)
    ids = smollm2.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        theirs = smollm2.model.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert [s.id for s in ours.steps] == theirs[0, ids.shape[1]:].tolist()


def test_a_chat_goes_through_the_models_template(scope: Scope, smollm2: LoadedModel) -> None:
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    result = scope.engine.analyse_chat(messages)
    record = scope.engine.run(result.run_id)
    expected = smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected_ids = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert record.input_ids.tolist() == list(expected_ids)
    specials = [t.text for t in record.summary.tokens if t.special]
    assert "<|im_start|>" in specials and "<|im_end|>" in specials
    # the assistant answers in words, and its greedy answer is transformers' own on the same ids
    answer = scope.generate(record.text, max_new_tokens=10, stop_at_eos=False)
    with torch.inference_mode():
        theirs = smollm2.model.generate(record.input_ids[None], max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert [s.id for s in answer.steps] == theirs[0, record.n:].tolist()
    assert not answer.steps[0].special and answer.text.strip()


def test_the_top_induction_heads_key_side_is_led_by_a_previous_token_head(scope: Scope) -> None:
    """QK attribution on the real model: from each token of a sentence's second copy to the token after its
    first occurrence, the strongest induction head's logit is led on the key side by an earlier head that
    the scores call previous-token (K-composition, as on the bundled model)."""
    sentence = ("The old lighthouse keeper walked along the rocky shore every morning before the sun rose over "
                "the quiet harbour.")
    run = scope.run(sentence + " " + sentence)
    heads = run.heads()
    top = max(heads, key=lambda h: h.induction or 0.0)
    assert (top.induction or 0.0) > 0.5
    total, components, _cells = key_side_over_induction_cells(run, top.layer, top.head)
    lead = components[int(total.argmax())]
    assert lead.kind == "head" and lead.layer is not None and lead.layer < top.layer
    score = next(h for h in heads if (h.layer, h.head) == (lead.layer, lead.head))
    assert (score.prev_token or 0.0) >= 0.5, (lead, score)
