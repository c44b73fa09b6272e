"""The generation service: validate a request once, admit what its recording will keep, then step
token by token with the KV cache; a recorded generation ends as an ordinary stored run.

The HTTP route streams ``Generation.step()`` as Server-Sent Events; the Python door runs it to the
end (``Scope.generate``). Each step takes the model's lock itself (another request may get in
between two steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnscope.model.capture.generation import GenerationSession, SamplingParams, Step
from attnscope.model.errors import BadInput
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import Token, ids_tensor
from attnscope.model.scores import live
from attnscope.model.services.analyse import RunResult
from attnscope.model.services.engine import Engine

DEFAULT_MAX_NEW_TOKENS = 256


@dataclass
class Generation:
    """One generation in progress: ``step()`` until ``done``, then ``finish()``."""

    engine: Engine
    lm: LoadedModel
    prompt: str
    tokens: list[Token]  # the prompt's
    session: GenerationSession
    watch: tuple[int, int] | None  # (layer, head) whose new attention rows each step reports
    steps: list[Step] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.session.done

    def step(self) -> Step:
        """One new token (the first step is the prefill: the whole prompt in one pass)."""
        made = self.session.step()
        self.steps.append(made)
        return made

    def new_rows(self) -> list[list[float]] | None:
        """The watched head's attention rows recorded since the last call (None: nothing watched)."""
        if self.watch is None or self.session.recorder is None:
            return None
        rows: list[list[float]] = self.session.recorder.new_rows(*self.watch)
        return rows

    def finish(self) -> Finished:
        """The generated text and why it stopped; a recorded generation is stored as a run first."""
        text = self.session.finish_text()
        run = None
        if self.session.recorder is not None:
            acts, heads = live.scored_recording(self.session)
            new = self.session.ids[len(self.tokens):].tolist()
            run = self.engine.analyser.store_generation(self.lm, self.prompt, self.tokens, new, acts, heads)
        return Finished(text=text, n_new=self.session.steps, stop=self.session.stop_reason, run=run)


@dataclass(frozen=True)
class Finished:
    text: str  # the generated characters (a character left incomplete: U+FFFD)
    n_new: int
    stop: str  # "eos" or "length"
    run: RunResult | None  # the recorded run (prompt + generated tokens), when recording


def start(engine: Engine, *, text: str, model: str | None = None, max_new_tokens: int = 20,
          temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop_at_eos: bool = True,
          record: bool = True, watch_layer: int | None = None, watch_head: int | None = None,
          max_new_limit: int = DEFAULT_MAX_NEW_TOKENS, top_k_kept: int = 10) -> Generation:
    """Check a generation request (every range once) and start it; nothing runs yet."""
    if max_new_tokens > max_new_limit:
        raise BadInput(f"max_new_tokens {max_new_tokens} is more than this server's limit of {max_new_limit} "
                       "(ATTNSCOPE_MAX_NEW_TOKENS)", code="max_new_tokens_too_large",
                       params={"max_new_tokens": max_new_tokens, "limit": max_new_limit})
    if max_new_tokens < 1:
        raise BadInput(f"max_new_tokens {max_new_tokens} is out of range: at least 1", code="value_out_of_range",
                       params={"name": "max_new_tokens", "value": max_new_tokens, "min": 1, "max": max_new_limit})
    lm = engine.model(model)
    tokens = engine.tokenize(lm, text)
    limit = engine.token_limit(lm)
    if len(tokens) + max_new_tokens > limit:
        raise BadInput(f"prompt ({len(tokens)} tokens) + max_new_tokens ({max_new_tokens}) "
                       f"exceeds this model's limit of {limit} tokens", code="generate_too_long",
                       params={"tokens": len(tokens), "max_new_tokens": max_new_tokens, "limit": limit})
    if not lm.info.has_lm_head:
        raise BadInput(f"model {lm.info.name!r} is an encoder without an LM head: it cannot generate",
                       code="encoder_no_lm_head", params={"model": lm.info.name})
    watch = None
    if watch_layer is not None or watch_head is not None:
        if not record:
            raise BadInput("watch_layer and watch_head need record: true", code="watch_needs_record")
        layer, head = watch_layer or 0, watch_head or 0
        if not (0 <= layer < lm.info.n_layers and 0 <= head < lm.info.n_heads):
            raise BadInput(f"watch layer/head out of range: layers 0..{lm.info.n_layers - 1}, "
                           f"heads 0..{lm.info.n_heads - 1}", code="watch_out_of_range",
                           params={"max_layer": lm.info.n_layers - 1, "max_head": lm.info.n_heads - 1})
        watch = (layer, head)
    if record:  # the recorded run is kept like an analysed one: refuse now what could never be kept
        engine.admit(lm, len(tokens) + max_new_tokens, top_k_kept)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=seed, stop_at_eos=stop_at_eos)
    session = GenerationSession(lm, ids_tensor(tokens), params, record=record)
    return Generation(engine=engine, lm=lm, prompt=text, tokens=tokens, session=session, watch=watch)
