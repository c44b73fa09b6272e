"""The Python door (``attnscope.Scope``) gives the HTTP door's numbers on every family of the family
table, and leaves the user's model as it found it: no hook, the same parameters, ``requires_grad``,
training flags and attention implementation, even after a call that raised."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

import attnscope
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.errors import BadInput, EngineError
from attnscope.model.load.models import wrap_model
from tests.support.families import FAMILIES, Family
from tests.support.tiny import make_engine
from tests.support.tinytok import tiny_tokenizer

TEXT = "the cat sat on the mat; the cat sat."
ATOL = 1e-5


def snapshot(model: nn.Module) -> dict[str, Any]:
    """Everything a call must leave as it was."""
    return {
        "impl": model.config._attn_implementation,
        "training": [m.training for m in model.modules()],
        "grad": [p.requires_grad for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
    }


def assert_unchanged(model: nn.Module, before: dict[str, Any]) -> None:
    after = snapshot(model)
    assert after["impl"] == before["impl"]
    assert after["training"] == before["training"]
    assert after["grad"] == before["grad"]
    assert after["hooks"] == before["hooks"] == 0
    assert all(torch.equal(a, b) for a, b in zip(after["params"], before["params"], strict=True))


def f32_head(client: TestClient, run_id: str, layer: int, head: int, n: int, causal: bool) -> np.ndarray:
    """A head's exact weights over HTTP (format=f32), unpacked to (n, n) with zeros where masked."""
    r = client.get(f"/api/runs/{run_id}/attention", params={"layer": layer, "head": head, "format": "f32"})
    assert r.status_code == 200, r.text
    flat = np.frombuffer(r.content, dtype="<f4")
    out = np.zeros((n, n), dtype=np.float32)
    if causal:
        out[np.tril_indices(n)] = flat
    else:
        out[:] = flat.reshape(n, n)
    return out


def user_model(family: Family) -> nn.Module:
    """The family's model as a user would hold it: with SDPA attention where the family has it."""
    try:
        return family.build("sdpa")
    except ValueError:  # a family without SDPA
        return family.build("eager")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.id)
def test_the_python_door_gives_the_http_doors_numbers(family: Family) -> None:
    model = user_model(family)
    model.train()  # a user's model may be in training mode: the door must not leave it in eval
    tokenizer = tiny_tokenizer()
    before = snapshot(model)

    scope = attnscope.Scope(model, tokenizer, name="tiny")
    run = scope.run(TEXT)
    n, info = len(run.tokens), scope.model.info
    layers = sorted({0, info.n_layers - 1})
    py_attention = {(layer, head): run.attention(layer=layer, head=head).numpy()
                    for layer in layers for head in range(info.n_heads)}
    py_heads = run.heads()
    py_residual = run.residual()
    with pytest.raises(BadInput):
        run.attention(layer=info.n_layers, head=0)  # a call that raised leaves nothing behind either
    assert_unchanged(model, before)

    decoder = info.has_lm_head
    calls: dict[str, Any] = {}
    if decoder:
        calls["next"] = lambda: run.next(position=3, temperature=0.7, top_k=5)
        calls["lens"] = lambda: run.lens(top_k=3)
        calls["ablate"] = lambda: run.ablate(heads=[(info.n_layers - 1, 0)], mode="zero", top_k=3)
        calls["attribute"] = lambda: run.attribute(position=4)
    py_results: dict[str, Any] = {}
    for key, call in calls.items():
        try:
            py_results[key] = call()
        except EngineError as exc:
            py_results[key] = ("error", exc.code)
    assert_unchanged(model, before)

    # the HTTP door over the same model object (it switches the model for good: a server owns its models)
    lm = wrap_model("tiny", model, tokenizer, source="test")
    settings = Settings(models={}, default_model="tiny", max_body_bytes=64 * 1024)
    with TestClient(create_app(settings, make_engine({"tiny": lm}, "tiny"))) as client:
        r = client.post("/api/runs", json={"text": TEXT})
        assert r.status_code == 201, r.text
        body = r.json()
        run_id = body["run_id"]
        assert [t["id"] for t in body["tokens"]] == [t.id for t in run.tokens]
        for (layer, head), weights in py_attention.items():
            np.testing.assert_allclose(weights, f32_head(client, run_id, layer, head, n, info.causal), atol=ATOL)
        heads = client.get(f"/api/runs/{run_id}/heads", params={"wait": 60}).json()["heads"]
        for mine, theirs in zip(py_heads, heads, strict=True):
            for field in ("entropy", "prev_token", "first_token", "max", "induction"):
                a, b = getattr(mine, field), theirs[field]
                assert (a is None) == (b is None), field
                if a is not None:
                    assert a == pytest.approx(b, abs=1e-4), (mine.layer, mine.head, field)
        resid = client.get(f"/api/runs/{run_id}/residual").json()
        np.testing.assert_allclose(py_residual.embed_norm, resid["embed_norm"], rtol=1e-5)
        np.testing.assert_allclose([x.resid_norm for x in py_residual.layers],
                                   [x["resid_norm"] for x in resid["layers"]], rtol=1e-5)
        if not decoder:
            return
        http = {
            "next": lambda: client.get(f"/api/runs/{run_id}/next",
                                       params={"position": 3, "temperature": 0.7, "top_k": 5}),
            "lens": lambda: client.get(f"/api/runs/{run_id}/logit-lens", params={"top_k": 3}),
            "ablate": lambda: client.post(f"/api/runs/{run_id}/ablate",
                                          json={"heads": [[info.n_layers - 1, 0]], "mode": "zero", "top_k": 3}),
            "attribute": lambda: client.get(f"/api/runs/{run_id}/attribution", params={"position": 4}),
        }
        for key, call in http.items():
            r = call()
            mine = py_results[key]
            if isinstance(mine, tuple):
                assert r.status_code != 200 and r.json()["code"] == mine[1], (key, r.text)
                continue
            assert r.status_code == 200, (key, r.text)
            theirs = r.json()
            if key == "next":
                assert [c.id for c in mine.top] == [c["id"] for c in theirs["top"]]
                np.testing.assert_allclose([c.prob for c in mine.top], [c["prob"] for c in theirs["top"]], atol=ATOL)
            elif key == "lens":
                assert [[[c.id for c in p.top] for p in s.positions] for s in mine.layers] == \
                       [[[c["id"] for c in p["top"]] for p in s["positions"]] for s in theirs["layers"]]
            elif key == "ablate":
                np.testing.assert_allclose([p.kl for p in mine.positions], [p["kl"] for p in theirs["positions"]],
                                           atol=ATOL)
            else:
                assert mine.token.id == theirs["token"]["id"]
                assert mine.logit == pytest.approx(theirs["logit"], abs=1e-4)
                np.testing.assert_allclose([t.value for t in mine.terms], [t["value"] for t in theirs["terms"]],
                                           atol=1e-4)


def test_a_peft_adapter_is_inspected_as_the_adapted_model_and_left_as_it_was() -> None:
    peft = pytest.importorskip("peft")
    family = next(f for f in FAMILIES if f.model_type == "llama")
    tokenizer = tiny_tokenizer()
    wrapped = peft.get_peft_model(family.build("sdpa"), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                        init_lora_weights=False))
    before = snapshot(wrapped)
    grads_before = [p.requires_grad for p in wrapped.parameters()]
    assert any(grads_before) and not all(grads_before)  # LoRA weights train, the base is frozen
    run = attnscope.Scope(wrapped, tokenizer).run(TEXT)
    adapted = [run.attention(layer=0, head=h) for h in range(4)]
    assert_unchanged(wrapped, before)

    merged = wrapped.merge_and_unload()  # the same function as one plain model
    plain = attnscope.Scope(merged, tokenizer).run(TEXT)
    for h in range(4):
        np.testing.assert_allclose(adapted[h].numpy(), plain.attention(layer=0, head=h).numpy(), atol=ATOL)
    base = attnscope.Scope(family.build("sdpa"), tokenizer).run(TEXT)
    assert not torch.allclose(adapted[0], base.attention(layer=0, head=0), atol=1e-3)  # the adapter counts


def test_a_tile_and_the_whole_head_agree() -> None:
    family = next(f for f in FAMILIES if f.model_type == "gpt2")
    run = attnscope.Scope(family.build("eager"), tiny_tokenizer()).run(TEXT)
    whole = run.attention(layer=1, head=2)
    tile = run.attention(layer=1, head=2, q0=4, q1=12, k0=0, k1=8)  # one bin a cell: exact
    expect = whole[4:12, 0:8].clone()
    expect[torch.ones_like(expect, dtype=torch.bool).triu(5)] = float("nan")  # keys after the query: masked
    torch.testing.assert_close(tile, expect, equal_nan=True, atol=ATOL, rtol=0)
    assert run.attention(layer=1, head=2, size=4).shape == (4, 4)
    with pytest.raises(BadInput, match="not a range"):
        run.attention(layer=1, head=2, q0=5, q1=3)



def test_the_learn_views_give_the_http_doors_numbers() -> None:
    """Scope.embedding, anatomy, positions, compare and Run.contributions, contribution_gaps give the
    Learn endpoints' numbers on a tiny GPT-2 with the bundled tokenizer (learned positions, fused
    values, a Conv1D W_O), and leave the model as they found it."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from tests.support.tiny import BUNDLED, tiny_config

    torch.manual_seed(0)
    model, tokenizer = GPT2LMHeadModel(tiny_config("gpt2")), AutoTokenizer.from_pretrained(BUNDLED)
    before = snapshot(model)
    scope = attnscope.Scope(model, tokenizer, name="tiny")
    a, b = scope.run("dog bites man"), scope.run("man bites dog")
    last = len(a.tokens) - 1
    py = {"contributions": a.contributions(layer=1, head=2, position=last),
          "gaps": a.contribution_gaps(position=last), "embedding": scope.embedding(id=173, top=5),
          "anatomy": scope.anatomy(), "positions": scope.positions(count=16), "compare": scope.compare(a, b)}
    with pytest.raises(BadInput) as refused:
        scope.embedding(id=7, top=0)
    assert refused.value.code == "value_out_of_range"
    assert_unchanged(model, before)

    lm = wrap_model("tiny", model, tokenizer, source="test")
    settings = Settings(models={}, default_model="tiny", max_body_bytes=64 * 1024)
    with TestClient(create_app(settings, make_engine({"tiny": lm}, "tiny"))) as client:
        ids = [client.post("/api/runs", json={"text": text}).json()["run_id"] for text in (a.text, b.text)]
        http = {
            "contributions": client.get(f"/api/runs/{ids[0]}/contributions",
                                        params={"layer": 1, "head": 2, "position": last}),
            "gaps": client.get(f"/api/runs/{ids[0]}/contribution-gaps", params={"position": last}),
            "embedding": client.get("/api/models/tiny/embedding", params={"id": 173, "top": 5}),
            "anatomy": client.get("/api/models/tiny/anatomy"),
            "positions": client.get("/api/models/tiny/positions", params={"count": 16}),
            "compare": client.get("/api/compare", params={"a": ids[0], "b": ids[1]}),
        }
    body = {key: r.json() for key, r in http.items() if r.status_code == 200}
    assert body.keys() == http.keys(), {key: r.text for key, r in http.items()}
    assert len(py["contributions"].weights) == last + 1 and len(py["gaps"].heads) == 2 * 4
    for key in ("contributions", "positions"):
        for field in ("weights", "value_norms", "contributions", "matrix", "similarity"):
            if field in body[key] and body[key][field] is not None:
                np.testing.assert_allclose(getattr(py[key], field), body[key][field], atol=ATOL)
    np.testing.assert_allclose([h.gap for h in py["gaps"].heads], [h["gap"] for h in body["gaps"]["heads"]],
                               atol=ATOL)
    assert [n.id for n in py["embedding"].neighbours] == [n["id"] for n in body["embedding"]["neighbours"]]
    assert [n.token for n in py["embedding"].neighbours] == [n["token"] for n in body["embedding"]["neighbours"]]
    np.testing.assert_allclose(py["embedding"].vector, body["embedding"]["vector"], atol=ATOL)
    assert py["anatomy"].total == body["anatomy"]["total"] == sum(p.numel() for p in model.parameters())
    assert [r.attention for r in py["anatomy"].per_layer] == [r["attention"] for r in body["anatomy"]["per_layer"]]
    np.testing.assert_allclose([t.cos for t in py["compare"].tokens if t.cos is not None],
                               [t["cos"] for t in body["compare"]["tokens"] if t["cos"] is not None], atol=ATOL)
    np.testing.assert_allclose([h.diff for h in py["compare"].heads], [h["diff"] for h in body["compare"]["heads"]],
                               atol=ATOL)
