"""The bundled model's training script: its pieces, and a few steps end to end on a toy corpus."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = Path(__file__).parents[1] / "data" / "heldout_sample.txt"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = load_script("train_bundled")


def test_pre_tokenizer_isolates_each_cjk_character() -> None:
    tok = train.build_tokenizer()
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("我爱AI，dog bites")]
    # every CJK character is a piece of its own (bytes shown as GPT-2's printable stand-ins)
    assert len(pieces) == 6 and pieces[2] == "AI" and pieces[-2:] == ["dog", "\u0120bites"]


def test_supplement_lists_word_forms_and_characters() -> None:
    text = "the cat and the dog. The dog bites. 我爱猫，猫爱我。"
    forms = train.supplement(text, ["weather", "mat"], words=3, chars=2)
    assert " the" in forms and "The" in forms and " The" in forms  # corpus words, capitalised too
    assert " weather" in forms and "weather" in forms and "Weather" not in forms  # everyday words
    assert forms[-2:] == ["我", "爱"]  # the most frequent characters, ties in order of appearance
    assert train.common_chars(text, 10, least=2) == ["我", "爱", "猫"]
    assert train.common_words("A dog, a Dog and a cat", 2) == ["a", "dog"]


def test_tokenizer_keeps_supplied_words_whole(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text(HELDOUT.read_text(encoding="utf-8") * 2, encoding="utf-8")
    (corpus / "everyday_words.txt").write_text("intelligence\nweather\n", encoding="utf-8")
    tok = train.train_tokenizer(corpus, 700, words=20, chars=30, weight=50)
    assert len(tok) == 700
    for word in (" intelligence", " weather", "weather"):
        assert len(tok(word)["input_ids"]) == 1, word
    assert tok.decode(tok("I love artificial intelligence 我")["input_ids"]) == "I love artificial intelligence 我"


def test_batch_rows_repeat_what_they_should() -> None:
    data = torch.arange(10_000) % 5000
    words = torch.arange(6000, 6100)
    gen = torch.Generator().manual_seed(0)
    x = train.get_batch(data, 6, 64, gen, repeat_share=0.0, random_share=1.0, vocab=8192)  # (6, 65)
    for row in x:
        periods = [p for p in range(8, 33) if torch.equal(row[p:], row[:-p])]
        assert periods and int(row.min()) >= 256, row  # a period, and no byte-level tokens
    x = train.get_batch(data, 6, 256, gen, repeat_share=0.0, words_share=1.0, words=words, vocab=8192)
    for row in x:
        inserted = ((row >= 6000) & (row < 6100)).nonzero().flatten()  # the run of words and its copies
        run = row[inserted]
        assert len(run) >= 16 and any(torch.equal(run[p:], run[:-p]) for p in range(8, len(run) // 2 + 1)), row
    x = train.get_batch(data, 4, 128, gen, repeat_share=1.0)
    for row in x:  # a segment of natural text appears twice
        assert len(set(row.tolist())) < len(row)


def test_window_schedule_keeps_tokens_per_step() -> None:
    args = train.parse_args(["--steps", "100", "--seq", "256", "--long-seq", "1024", "--batch", "8", "--long-from", "0.5"])
    assert train.window_at(0, args) == (8, 256) and train.window_at(49, args) == (8, 256)
    assert train.window_at(50, args) == (2, 1024) and train.window_at(99, args) == (2, 1024)


def test_lr_warms_up_then_decays() -> None:
    assert train.lr_at(0, 100, 10, 1e-3, 1e-4) == 1e-4
    assert train.lr_at(9, 100, 10, 1e-3, 1e-4) == 1e-3
    assert abs(train.lr_at(100, 100, 10, 1e-3, 1e-4) - 1e-4) < 1e-12


def test_a_cool_down_schedule_counts_from_its_own_start() -> None:
    # a resumed run annealed from 2e-4 to 0 over steps 9,200-12,800, no warm-up
    args = train.parse_args(["--steps", "12800", "--lr", "2e-4", "--min-lr", "0", "--warmup", "0",
                             "--schedule-from", "9200"])
    assert train.lr_of(9200, args) == 2e-4
    assert abs(train.lr_of(11000, args) - 1e-4) < 1e-12  # half-way down the cosine
    assert train.lr_of(12800, args) == 0.0
    assert train.lr_of(100, args) == 2e-4  # before its start it holds the peak, never a negative warm-up
    default = train.parse_args(["--steps", "100", "--lr", "1e-3", "--warmup", "10"])
    assert abs(train.lr_of(100, default) - 1e-4) < 1e-12  # the floor is a tenth of the peak unless told


def test_no_loss_on_attention_in_the_recipe() -> None:
    source = (ROOT / "scripts" / "train_bundled.py").read_text(encoding="utf-8")
    assert "guide" not in source.lower()
    args = train.parse_args([])
    assert not any("guide" in name for name in vars(args))


def test_a_few_steps_end_to_end_and_resume(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = HELDOUT.read_text(encoding="utf-8")
    (corpus / "train.txt").write_text(text * 3, encoding="utf-8")
    (corpus / "heldout.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "model"
    common = ["--corpus", str(corpus), "--out", str(out), "--vocab", "600", "--common-words", "20",
              "--common-chars", "20", "--layers", "1", "--heads", "2", "--d-model", "32", "--positions", "256",
              "--seq", "64", "--long-seq", "128", "--long-from", "0.5", "--batch", "2", "--eval-every", "2",
              "--warmup", "1", "--probe-seq", "128", "--threads", "1", "--bf16"]
    train.main([*common, "--steps", "4"])
    record = json.loads((out / "training.json").read_text())
    assert [c["step"] for c in record["curve"]] == [2, 4]
    assert [c["seq"] for c in record["curve"]] == [64, 128]
    assert all(len(c["prev_token_top2"]) == 2 and 0 <= c["induction_top"] <= 1 and c["heldout_bpb"] > 0
               for c in record["curve"])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(out)
    assert trained.config.model_type == "llama" and trained.config.num_hidden_layers == 1
    assert trained.config.tie_word_embeddings
    assert len(AutoTokenizer.from_pretrained(out)) == 600
    assert (out / train.STATE).exists()

    # resuming continues the step count, the curve and the token count from the checkpoint
    train.main([*common, "--steps", "6", "--resume"])
    record = json.loads((out / "training.json").read_text())
    assert [c["step"] for c in record["curve"]] == [2, 4, 6]
    assert record["curve"][-1]["tokens"] == 6 * 2 * 64  # long windows halve the batch: same tokens a step


def test_heldout_bits_per_byte_count_only_the_texts_bytes() -> None:
    """A model that gives every token the same probability scores ln(V) nats a token; the bytes it
    is divided by are the text's own, never the 13 bytes of an <|endoftext|> between documents."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "model" / "bundled" / "attnscope-tiny")
    docs = ["The cat sat on the mat.", "我爱人工智能", "Once upon a time there was a dog."]
    stream: list[int] = []
    for doc in docs:
        stream += tok(doc)["input_ids"] + [tok.eos_token_id]
    data = torch.tensor([tok.eos_token_id, *stream, tok.eos_token_id])  # one window: [eos] + stream
    vocab = len(tok)

    class Uniform(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> object:  # (1, T) -> logits (1, T, V) all equal
            return type("Out", (), {"logits": torch.zeros(*ids.shape, vocab)})()

        def train(self, mode: bool = True) -> Uniform:
            return self

    loss, bpb = train.evaluate(Uniform(), tok, data, seq=len(data) - 1, count=1)
    text_bytes = sum(len(d.encode("utf-8")) for d in docs)
    assert loss == pytest.approx(math.log(vocab))
    assert bpb == pytest.approx(math.log(vocab) * len(stream) / math.log(2) / text_bytes)
