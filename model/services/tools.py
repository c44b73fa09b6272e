"""Services for the causal tools: direct logit attribution, head ablation (one set, or every head
alone), activation patching.

Each validates its inputs once, reserves the memory its batched forwards need from the engine's
budget, takes the model's lock (the tools in ``model.tools`` assume their caller holds it), and
returns the tools' typed results (``model.tools``: declared once, with their field descriptions; the
routes return them as they are).
"""

from __future__ import annotations

import threading
from typing import Literal

from attnscope.model.errors import BadInput
from attnscope.model.load.tokens import ids_tensor
from attnscope.model.services.engine import Engine
from attnscope.model.services.runs import check_position, check_top_k
from attnscope.model.tools import ablation, attribution, patching, qk
from attnscope.model.tools.ablation import Ablation, Scan
from attnscope.model.tools.attribution import Attribution
from attnscope.model.tools.intervene import batch_bytes, require_decoder
from attnscope.model.tools.patching import Patch, PatchExample
from attnscope.model.tools.qk import QKAttribution

Mode = Literal["zero", "mean"]


def _mode(mode: str) -> Mode:
    if mode not in ("zero", "mean"):
        raise BadInput(f"mode {mode!r} is not one of zero, mean", params={"mode": mode})
    return "zero" if mode == "zero" else "mean"


def attribute(engine: Engine, *, run_id: str, position: int, token: int | None = None,
              token_b: int | None = None) -> Attribution:
    record = engine.run(run_id)
    lm = engine.model_of(record)
    check_position(record, position)
    with engine.budget.reserve(batch_bytes(lm, position + 1, position + 1)), lm.lock:
        chosen = ablation.default_token(record, lm, position) if token is None else token
        return attribution.attribute(lm, record, position, chosen, token_b)


def qk_bytes(n_components: int, n_keys: int, d_model: int, positions: int, d_head: int) -> int:
    """What one QK attribution holds beside the forward: the layer's inputs and gradients, each chunk of
    component vectors at every key, and the (keys, components) results, float64 where it sums."""
    return 8 * (4 * positions * d_model + 2 * n_keys * n_components + n_keys * d_model * max(d_head, 8)
                + n_components * n_components)


def qk_attribution(engine: Engine, *, run_id: str, layer: int, head: int, query: int,
                   key: int | None = None) -> QKAttribution:
    """Head ``head`` of ``layer``: its pre-softmax logit from ``query`` to ``key`` (None: every key the query
    sees), split into query-side x key-side terms by upstream component (``model.tools.qk``)."""
    record = engine.run(run_id)
    lm = engine.model_of(record)
    check_position(record, query, "query")
    if key is not None:
        check_position(record, key, "key")
    engine.check_layer_head(record, layer, head)
    components = 3 + layer * (lm.info.n_heads + 2)
    keys = 1 if key is not None else query + 1
    need = batch_bytes(lm, query + 1, 1) + qk_bytes(components, keys, lm.info.d_model, query + 1,
                                                   lm.info.d_model // max(1, lm.info.n_heads))
    with engine.budget.reserve(need), lm.lock:
        return qk.qk_attribution(lm, record, layer, head, query, key)


def ablate(engine: Engine, *, run_id: str, heads: list[tuple[int, int]], mode: str = "zero",
           top_k: int = 5) -> Ablation:
    record = engine.run(run_id)
    lm = engine.model_of(record)
    checked = _mode(mode)
    check_top_k(top_k)
    pairs = [(int(layer), int(head)) for layer, head in heads]
    with engine.budget.reserve(batch_bytes(lm, record.n, record.n)), lm.lock:
        return ablation.ablate(lm, record, pairs, checked, top_k)


def ablate_scan(engine: Engine, *, run_id: str, position: int, token: int | None = None,
                mode: str = "zero") -> Scan:
    record = engine.run(run_id)
    lm = engine.model_of(record)
    checked = _mode(mode)
    check_position(record, position)
    with engine.budget.reserve(batch_bytes(lm, position + 1, 1)), lm.lock:
        chosen = ablation.default_token(record, lm, position) if token is None else token
        attribution.check_token(lm, chosen, "token")
        return ablation.scan(lm, record, position, chosen, checked)


_examples: dict[tuple[str, int], PatchExample] = {}  # by model name and id(model): a few forwards each, once


def patch_example(engine: Engine, *, model: str | None = None) -> PatchExample:
    lm = engine.model(model)
    key = (lm.info.name, id(lm.model))
    if key in _examples:
        return _examples[key]
    require_decoder(lm, "activation patching")
    best: PatchExample | None = None
    for pair in patching.PAIRS:
        clean_tokens, corrupted_tokens = engine.tokenize(lm, pair.clean), engine.tokenize(lm, pair.corrupted)
        try:
            answer_id = patching.single_token(lm, pair.answer, "answer")
            wrong_id = patching.single_token(lm, pair.wrong, "wrong")
        except BadInput:
            continue
        if len(clean_tokens) != len(corrupted_tokens):
            continue
        clean_ids, corrupted_ids = ids_tensor(clean_tokens), ids_tensor(corrupted_tokens)
        with engine.budget.reserve(batch_bytes(lm, len(clean_tokens), 1)), lm.lock:
            clean_m, corrupted_m, per_row = patching.separates(lm, clean_ids, corrupted_ids, answer_id, wrong_id)
        forwards, flops = patching.cost(lm, clean_ids, corrupted_ids)
        found = PatchExample(model=lm.info.name, clean=pair.clean, corrupted=pair.corrupted, answer=pair.answer,
                             wrong=pair.wrong, clean_metric=clean_m, corrupted_metric=corrupted_m,
                             separated=clean_m > 0 and clean_m - corrupted_m >= patching.MIN_GAP,
                             forwards=forwards, tflop=flops / 1e12, seconds=per_row * forwards)
        if found.separated:
            best = found
            break
        if best is None or found.clean_metric - found.corrupted_metric > best.clean_metric - best.corrupted_metric:
            best = found
    if best is None:
        raise BadInput(f"none of the example pairs fits {lm.info.name!r}'s tokenizer (same token count, one-token "
                       "answers): type a pair of your own", code="patch_no_example", params={"model": lm.info.name})
    _examples[key] = best
    return best


def patch(engine: Engine, *, clean: str, corrupted: str, answer: str, wrong: str, position: int | None = None,
          model: str | None = None, stop: threading.Event | None = None) -> Patch:
    lm = engine.model(model)
    clean_tokens = engine.tokenize(lm, clean)
    corrupted_tokens = engine.tokenize(lm, corrupted)
    answer_id = patching.single_token(lm, answer, "answer")
    wrong_id = patching.single_token(lm, wrong, "wrong")
    if answer_id == wrong_id:
        raise BadInput(f"answer and wrong are the same token ({answer!r}): the metric would always be 0",
                       code="patch_same_token", params={"answer": answer})
    with engine.budget.reserve(batch_bytes(lm, len(clean_tokens), 1)), lm.lock:
        return patching.patch(lm, clean_tokens, corrupted_tokens, answer_id, wrong_id, position, stop=stop,
                              texts=(clean, corrupted))
