"""QK attribution on every decoder family that goes through the capture point (tiny random configs built
in the test): the query-side, key-side and full-matrix terms sum to the logit the model computed (rotary,
ALiBi, grouped K/V heads, soft-capping, Q/K norms, OLMo's clipping), the keys are the ones the mask lets
the query see, and no hook is left behind; on the bundled model the induction head's key side is led by
a previous-token head."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import attnscope
from attnscope.model.errors import BadInput
from attnscope.model.tools import qk
from tests.model.tools.test_interventions_families import _hooks, _run
from tests.support.families import DECODERS, Family
from tests.support.induction import key_side_over_induction_cells

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
THROUGH_INTERFACE = [f for f in DECODERS if f.model_type not in ("gpt_neo", "bloom")]


@pytest.mark.parametrize("family", THROUGH_INTERFACE, ids=lambda f: f.id)
def test_terms_sum_to_the_models_logit(family: Family) -> None:
    lm, record = _run(family)
    hooks = _hooks(lm)
    layer, query = record.n_layers - 1, record.n - 1
    kept = record.attention[layer]
    for head in (0, record.n_heads - 1):  # two different K/V heads where they are grouped
        row = qk.qk_attribution(lm, record, layer, head, query)
        # the keys are exactly the ones the mask lets this query see (a sliding window: the last few)
        assert row.keys.tolist() == kept.visible(query, query + 1, 0, record.n)[0].nonzero()[:, 0].tolist()
        c = len(row.components)
        assert row.query_side.shape == row.key_side.shape == (len(row.keys), c)
        assert sum(comp.kind == "head" for comp in row.components) == layer * record.n_heads
        scale = 1.0 + float(row.logit.abs().max())
        assert float(row.error.abs().max()) <= 1e-4 * scale, (family.id, row.error)
        # the model's own logits and weights (the capped logit is what the softmax saw)
        z = kept.logits([head], query, query + 1, 0, record.n)[0, 0].double()
        assert torch.allclose(row.capped, z[row.keys], atol=1e-4 * scale)
        weights, _ = kept.rows(head, query, query + 1)
        assert torch.allclose(row.weight, weights[0, row.keys].double(), atol=1e-6)
        for side in (row.query_side, row.key_side):
            assert torch.allclose(side.sum(-1) + row.position_bias, row.logit, atol=1e-4 * scale)
        key = int(row.keys[len(row.keys) // 2])
        cell = qk.qk_attribution(lm, record, layer, head, query, key)
        assert cell.matrix is not None and cell.matrix.shape == (c, c)
        at = int((row.keys == key).nonzero()[0, 0])
        assert float(cell.matrix.sum() + cell.position_bias[0]) == pytest.approx(float(row.logit[at]), abs=1e-4 * scale)
        # the matrix's margins are the two sides of that key
        assert torch.allclose(cell.matrix.sum(1), row.query_side[at], atol=1e-4 * scale)
        assert torch.allclose(cell.matrix.sum(0), row.key_side[at], atol=1e-4 * scale)
    if family.options.get("alibi"):
        assert float(row.position_bias.abs().max()) > 0  # ALiBi's bias is its own entry, not hidden in a term
    if kept.softcap is not None:
        assert torch.allclose(row.capped, torch.tanh(row.logit / kept.softcap) * kept.softcap)
        assert not torch.allclose(row.capped, row.logit)
    assert _hooks(lm) == hooks


@pytest.mark.parametrize("family", [f for f in DECODERS if f.model_type in ("gpt_neo", "bloom")], ids=lambda f: f.id)
def test_families_read_from_their_module_are_refused_clearly(family: Family) -> None:
    lm, record = _run(family)
    with pytest.raises(BadInput) as caught:
        qk.qk_attribution(lm, record, 1, 0, record.n - 1)
    assert caught.value.code == "qk_unsupported"


def test_bad_positions_and_hidden_keys() -> None:
    lm, record = _run(next(f for f in DECODERS if f.model_type == "llama"))
    with pytest.raises(BadInput) as caught:
        qk.qk_attribution(lm, record, 1, 0, 3, key=5)  # a later key is masked for a causal query
    assert caught.value.code == "key_not_visible"
    for kwargs, code in (({"layer": 9}, "layer_out_of_range"), ({"head": 99}, "head_out_of_range"),
                         ({"query": record.n}, "position_out_of_range"), ({"key": -1}, "position_out_of_range")):
        args = {"layer": 1, "head": 0, "query": 3, "key": None, **kwargs}
        with pytest.raises(BadInput) as caught:
            qk.qk_attribution(lm, record, args["layer"], args["head"], args["query"], args["key"])
        assert caught.value.code == code


def test_the_bundled_induction_head_reads_a_previous_token_head_on_its_key_side() -> None:
    """On a repeated sentence the bundled model's strongest induction head attends from each token of the
    second copy to the token after its first occurrence; what makes the key there attractive is, above all,
    a head the scores call previous-token (the key's own previous token is the query's token)."""
    model = AutoModelForCausalLM.from_pretrained(attnscope.BUNDLED)
    scope = attnscope.Scope(model, AutoTokenizer.from_pretrained(attnscope.BUNDLED))
    sentence = "The quick brown fox jumps over the lazy dog near the old river bank."
    run = scope.run(sentence + " " + sentence)
    heads = run.heads()
    induction = max(heads, key=lambda h: h.induction or 0.0)
    assert (induction.induction or 0.0) > 0.3
    total, components, cells = key_side_over_induction_cells(run, induction.layer, induction.head)
    assert cells >= 5
    top = components[int(total.argmax())]
    assert top.kind == "head" and top.layer is not None and top.head is not None
    score = next(h for h in heads if (h.layer, h.head) == (top.layer, top.head))
    assert (score.prev_token or 0.0) >= 0.5, (top, score)
    assert top.layer < induction.layer
