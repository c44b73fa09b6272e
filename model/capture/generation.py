"""Serial, autoregressive generation with the KV cache, one step at a time.

Each ``step()`` is one forward over the single newest token (the keys and values of
the earlier ones come from the cache), so a caller can stream tokens as they are
made and stop the moment its client goes away.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from attnscope.model.capture.forward import RESIDUAL, Captures, Filter, LayerListener, hooked, last_logits_only
from attnscope.model.capture.recording import Recorder
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import TextAssembler, token_strings


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float  # 0 = greedy
    top_k: int  # 0 = no top-k filter
    top_p: float  # 1 = no nucleus filter
    seed: int
    show_top: int = 5  # how many alternatives each step reports
    stop_at_eos: bool = True  # False: keep going past end-of-text (it is then an ordinary token)


@dataclass(frozen=True)
class Step:
    index: int
    id: int
    token: str  # display string: a special token's name, a partial character as ‹hex› bytes
    text: str  # the characters this token completes ("" for a special token or a partial character)
    special: bool
    partial: bool
    prob: float  # probability of the chosen token under the (filtered) sampling distribution: 1 when greedy
    model_prob: float  # the model's own probability of the chosen token at temperature 1
    top: list[tuple[int, str, float]]  # the model's own top alternatives at temperature 1
    ms: float


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(V,) -> (V,) with -inf outside the top-k / nucleus."""
    out = logits.clone()
    if top_k > 0 and top_k < out.shape[-1]:
        kth = out.topk(top_k).values[-1]
        out[out < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = out.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p  # keep the token that crosses top_p
        out[order[drop]] = float("-inf")
    return out


def tempered_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(V,) -> (V,) float64 (logits - max) / temperature: softmax of it is softmax(logits / temperature),
    valid for any temperature > 0. The largest logit is subtracted *before* dividing, so every scaled
    logit is <= 0 and the largest exactly 0 (a temperature of 1e-39 sends the rest to -inf, i.e. greedy,
    where dividing first overflowed float32 to inf - inf = NaN)."""
    return (logits.double() - logits.max().double()) / temperature


def sampling_distribution(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """(V,) -> (V,) float64 softmax(logits / temperature) after the top-k / nucleus filter."""
    return filter_logits(tempered_logits(logits, p.temperature), p.top_k, p.top_p).softmax(-1)


class GenerationSession:
    """Holds the KV cache between steps. Each step takes the model's lock itself."""

    def __init__(self, lm: LoadedModel, prompt_ids: torch.Tensor, params: SamplingParams, record: bool = False,
                 names: Filter = RESIDUAL) -> None:
        self.lm = lm
        self.params = params
        self.ids = prompt_ids.clone()  # (n,)
        self.cache = None  # the KV cache, grown one position per step
        self.generator = torch.Generator().manual_seed(params.seed)
        self.steps = 0
        self.eos = lm.tokenizer.eos_token_id
        self.recorder = Recorder() if record else None
        self.names = names  # what a recording captures by name (the residual stream; attention as Q and K)
        self.assembler = TextAssembler(lm.tokenizer)  # the generated ids as text, token by token

    def _forward(self, new_ids: torch.Tensor) -> torch.Tensor:
        """Feed the tokens the cache has not seen; returns the next-token logits (V,)."""
        ids = new_ids[None, :].to(self.lm.input_device)  # (1, q)
        extra = last_logits_only(self.lm)
        with self.lm.lock, torch.inference_mode():
            if self.recorder is None:
                out = self.lm.model(input_ids=ids, cache=self.cache, use_cache=True, **extra)
            else:
                with hooked(self.lm, self.names) as acts:
                    out = self.lm.model(input_ids=ids, cache=self.cache, use_cache=True, **extra)
                self.recorder.add(acts)
        self.cache = out.cache
        logits: torch.Tensor = out.logits[0, -1]  # (V,)
        return logits.float().cpu()  # sampling runs on the CPU with its own generator

    @property
    def at_eos(self) -> bool:
        return self.steps > 0 and self.eos is not None and int(self.ids[-1]) == self.eos

    @property
    def done(self) -> bool:
        return self.steps >= self.params.max_new_tokens or (self.params.stop_at_eos and self.at_eos)

    @property
    def stop_reason(self) -> str:
        """Why a finished session stopped: "eos" (end-of-text, when asked to stop there) or "length"."""
        return "eos" if self.params.stop_at_eos and self.at_eos else "length"

    def finish_text(self) -> str:
        """The generated text: every character the steps completed, plus bytes of a
        character the last step left incomplete (as U+FFFD). Special tokens add nothing."""
        self.assembler.finish()
        return self.assembler.text

    def step(self) -> Step:
        t0 = time.perf_counter()
        # the first step is the prefill: the whole prompt in one parallel pass
        logits = self._forward(self.ids if self.cache is None else self.ids[-1:])
        p = self.params
        if not bool(torch.isfinite(logits).any()) or bool(logits.isnan().any()):
            raise ValueError(f"the model's next-token scores at step {self.steps} are not numbers (NaN or all "
                             "-inf): the model or its weights are broken")
        if p.temperature <= 0:
            choice = int(logits.argmax())
            prob = 1.0
        else:
            dist = sampling_distribution(logits, p)
            choice = int(torch.multinomial(dist, 1, generator=self.generator))
            prob = float(dist[choice])
        natural = logits.softmax(-1)
        top = natural.topk(min(p.show_top, natural.shape[-1]))
        top_ids = top.indices.tolist()
        strings = token_strings(self.lm.tokenizer, top_ids)
        piece = self.assembler.push(choice)
        self.ids = torch.cat([self.ids, torch.tensor([choice])])
        self.steps += 1
        return Step(index=self.steps - 1, id=choice, token=piece.display, text=piece.text, special=piece.special,
                    partial=piece.partial, prob=prob, model_prob=float(natural[choice]),
                    top=list(zip(top_ids, strings, top.values.tolist(), strict=True)),
                    ms=1e3 * (time.perf_counter() - t0))

    def finish_recording(self, listener: LayerListener | None = None) -> Captures:
        """Feed the last sampled token too, so the record covers every token; returns the
        activations of the whole text under run_with_cache's names and each layer's kept
        attention (``listener``: what hears its sweep; ``model.scores.live.scored_recording``)."""
        assert self.recorder is not None, "this session does not record"
        if self.recorder.n < len(self.ids):
            self._forward(self.ids[-1:])
        with self.lm.lock, torch.inference_mode():
            return self.recorder.assemble(self.lm, listener)
