"""The bundled model's training script: its pieces, and a few steps end to end on a toy corpus."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = Path(__file__).parent / "data" / "heldout_sample.txt"


def load_script():
    spec = importlib.util.spec_from_file_location("train_bundled", ROOT / "scripts" / "train_bundled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = load_script()


def neighbour_cosine(table: torch.Tensor, i: int) -> float:
    return float(torch.nn.functional.cosine_similarity(table[i], table[i - 1], dim=0))


def test_mixed_sinusoids_tell_neighbours_apart() -> None:
    geometric = train.sinusoids(1024, 256, "geometric")
    mixed = train.sinusoids(1024, 256, "mixed")
    assert geometric.shape == mixed.shape == (1024, 256)
    assert neighbour_cosine(geometric, 300) > 0.9  # the original frequencies: neighbours look alike
    assert neighbour_cosine(mixed, 300) < 0.6
    # a position's predecessor is a fixed rotation of it: the same angle at every position
    assert torch.allclose(mixed[301] @ mixed[300], mixed[801] @ mixed[800], atol=1e-3)


def test_random_rows_repeat_with_a_period() -> None:
    data = torch.arange(10_000) % 5000
    gen = torch.Generator().manual_seed(0)
    x = train.get_batch(data, 6, 64, gen, repeat_share=0.0, random_share=1.0, vocab=8192)  # (6, 65)
    for row in x:
        periods = [p for p in range(8, 33) if torch.equal(row[p:], row[:-p])]
        assert periods, row
        assert int(row.min()) >= 256  # no byte-level tokens


def test_guide_loss_rewards_looking_one_token_back() -> None:
    t = 16
    previous = torch.zeros(1, 2, t, t)
    previous[0, :, torch.arange(1, t), torch.arange(t - 1)] = 1.0
    previous[0, :, 0, 0] = 1.0
    uniform = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]
    uniform = uniform.expand(1, 2, t, t)
    assert train.guide_loss((previous,), [(0, 1)]) < 1e-4
    assert train.guide_loss((uniform,), [(0, 1)]) > 1.0
    assert train.guide_weight(0, 100, 0.5) == 0.5 and train.guide_weight(50, 100, 0.5) == 0.25
    assert train.guide_weight(100, 100, 0.5) == 0.0 and train.guide_weight(5, 0, 0.5) == 0.0


def test_a_few_steps_end_to_end(tmp_path: Path, monkeypatch: object) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = HELDOUT.read_text(encoding="utf-8")
    (corpus / "train.txt").write_text(text * 3, encoding="utf-8")
    (corpus / "heldout.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "model"
    monkeypatch.setattr(sys, "argv", [
        "train_bundled.py", "--corpus", str(corpus), "--out", str(out), "--vocab", "400", "--layers", "1",
        "--heads", "2", "--d-model", "32", "--positions", "1024", "--seq", "64", "--batch", "2", "--steps", "4",
        "--eval-every", "2", "--warmup", "1", "--position-spread", "mixed", "--sinusoid-init", "0.1",
        "--random-share", "0.5", "--guide-steps", "2", "--guide-heads", "0:1", "--threads", "1"])
    train.main()
    record = json.loads((out / "training.json").read_text())
    assert [c["step"] for c in record["curve"]] == [2, 4]
    assert all(len(c["prev_token_top2"]) == 2 and 0 <= c["prev_token_top2"][0] <= 1 for c in record["curve"])
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.n_layer == 1 and len(tok) == 400

    # a resumed phase keeps the model's 1,024 positions (and says so to the tokenizer) even though
    # --positions is left at its default of 512, and keeps the earlier phase's record
    resumed = tmp_path / "resumed"
    monkeypatch.setattr(sys, "argv", [
        "train_bundled.py", "--corpus", str(corpus), "--out", str(resumed), "--resume", str(out), "--seq", "128",
        "--batch", "1", "--steps", "2", "--eval-every", "2", "--warmup", "1", "--probe-seq", "128", "--threads", "1"])
    train.main()
    record = json.loads((resumed / "training.json").read_text())
    assert record["args"]["probe_seq"] == "128" and record["previous"]["curve"][-1]["step"] == 4
    assert GPT2LMHeadModel.from_pretrained(resumed).config.n_positions == 1024
    assert AutoTokenizer.from_pretrained(resumed).model_max_length == 1024
