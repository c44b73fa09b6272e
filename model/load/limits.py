"""The token-limit rules beside the tokenizer: how long a prompt or a chat a model takes, and the
refusals that name the numbers (counted without reading more of a long text than the limit needs)."""

from __future__ import annotations

from dataclasses import replace

from attnscope.model.errors import BadInput, Param
from attnscope.model.load.models import LoadedModel
from attnscope.model.load.tokens import Token, TokenCount, count_tokens, read_cap, tokenize


def token_limit(lm: LoadedModel, max_tokens: int) -> int:
    """The server's token limit (ATTNSCOPE_MAX_TOKENS), bounded only by the model's positions (ALiBi
    models have no bound)."""
    return max_tokens if lm.info.max_positions is None else min(max_tokens, lm.info.max_positions)


def prompt_tokens(lm: LoadedModel, text: str, limit: int) -> list[Token]:
    """A prompt's tokens, refused (BadInput, with the numbers) when it is empty or longer than ``limit``."""
    if not text.strip():
        raise BadInput("text is empty or only whitespace; type a prompt to analyse", code="empty")
    unread(lm, text, limit, "prompt")
    too_long(count_tokens(lm.tokenizer, text, limit), limit, "prompt", len(text))  # reads no more than it needs
    tokens = tokenize(lm.tokenizer, text)
    too_long(TokenCount(n=len(tokens), exact=True, chars=len(text)), limit, "prompt", len(text))
    return tokens


def chat_tokens(lm: LoadedModel, messages: list[dict[str, str]], limit: int) -> tuple[str, list[Token]]:
    """A chat rendered with the model's chat template (and its generation prompt); the template's special
    tokens stay visible and are marked special."""
    if not getattr(lm.tokenizer, "chat_template", None):
        raise BadInput(f'model {lm.info.name!r} has no chat template: send "text" instead of "messages"',
                       code="chat_template_missing", params={"model": lm.info.name})
    try:
        text = lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - a template raises whatever its Jinja code raises; all are bad input
        raise BadInput(f"the model's chat template rejected these messages: {exc}", code="chat_template_rejected",
                       params={"reason": str(exc)}) from None
    if not isinstance(text, str) or not text:
        raise BadInput("the model's chat template rendered nothing for these messages", code="chat_template_empty")
    special = {int(i) for i in getattr(lm.tokenizer, "all_special_ids", [])}
    unread(lm, text, limit, "chat")
    too_long(count_tokens(lm.tokenizer, text, limit, add_special_tokens=False), limit, "chat", len(text))
    tokens = [replace(t, special=True) if t.id in special else t
              for t in tokenize(lm.tokenizer, text, add_special_tokens=False)]
    too_long(TokenCount(n=len(tokens), exact=True, chars=len(text)), limit, "chat", len(text))
    return text, tokens


def unread(lm: LoadedModel, text: str, limit: int, what: str) -> None:
    """BadInput for a text longer than its tokenizer's ``read_cap`` (only tokenizers whose tokens
    have no bound on their characters, such as WordPiece's, have one)."""
    cap = read_cap(lm.tokenizer, limit)
    if cap is not None and len(text) > cap:
        raise BadInput(f"the {what} has {len(text):,} characters, more than this model reads for its limit of "
                       f"{limit} tokens ({cap:,}: {cap // limit} a token); send a shorter text",
                       code="too_long_chars", params={"what": what, "chars": len(text), "limit": limit})


def too_long(count: TokenCount, limit: int, what: str, total_chars: int) -> None:
    """BadInput naming the limit when ``count`` is over it; "at least" when only a beginning was counted."""
    if count.n <= limit:
        return
    if count.exact:
        raise BadInput(f"the {what} has {count.n} tokens, more than this model's limit of {limit}",
                       code="too_long", params={"what": what, "tokens": count.n, "limit": limit})
    read = (f"counted in its first {count.chars:,} of {total_chars:,} characters" if count.chars
            else f"from its length of {total_chars:,} characters alone")
    params: dict[str, Param] = {"what": what, "tokens": count.n, "limit": limit, "total_chars": total_chars}
    if count.chars:
        params["read_chars"] = count.chars
    raise BadInput(f"the {what} has at least {count.n} tokens, more than this model's limit of {limit} "
                   f"({read}; the rest was not read)",
                   code="too_long_at_least_read" if count.chars else "too_long_at_least_length", params=params)
