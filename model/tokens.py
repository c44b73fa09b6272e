"""Text -> tokens with character offsets and display strings people can read."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

# BPE / SentencePiece / WordPiece markers, as the raw vocabulary spells them
_MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}


@dataclass(frozen=True)
class Token:
    index: int
    id: int
    text: str  # what a person sees: markers cleaned, whole characters
    start: int  # character offsets into the prompt; start == end for special tokens
    end: int


def display(raw: str) -> str:
    if raw.startswith("##"):
        return raw[2:]
    return "".join(_MARKERS.get(ch, ch) for ch in raw)


def tokenize(tokenizer: PreTrainedTokenizerBase, text: str) -> list[Token]:
    """Tokens of ``text`` as the model sees them (special tokens included).

    The display string is the prompt's own slice when the token covers characters,
    so that any Unicode round-trips; a byte-level token that holds only part of a
    character (an emoji split in bytes) shares its character's span.
    """
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
    ids: list[int] = enc["input_ids"]
    raws = tokenizer.convert_ids_to_tokens(ids)
    tokens = []
    for i, (tid, raw, (start, end)) in enumerate(zip(ids, raws, enc["offset_mapping"], strict=True)):
        shown = text[start:end] if end > start else display(raw)
        tokens.append(Token(index=i, id=int(tid), text=shown, start=int(start), end=int(end)))
    return tokens


def _decode_one(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
    if not isinstance(text, str):  # decode returns a list only for a batch of sequences
        raise TypeError(f"the tokenizer decoded id {token_id} to {type(text).__name__}, not str")
    return text


class _DecodedCache:
    """Each vocabulary entry decoded once per tokenizer (the vocabulary bounds its size)."""

    def __init__(self) -> None:
        self._by_tokenizer: dict[int, dict[int, str]] = {}
        self._lock = threading.Lock()

    def strings(self, tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
        with self._lock:
            known = self._by_tokenizer.setdefault(id(tokenizer), {})
            missing = [i for i in dict.fromkeys(ids) if i not in known]
        decoded = {i: _decode_one(tokenizer, i) for i in missing}
        with self._lock:
            known.update(decoded)
            return [known[i] for i in ids]


_DECODED = _DecodedCache()


def token_strings(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """Display strings for vocabulary ids out of context (predictions, logit lens)."""
    return _DECODED.strings(tokenizer, ids)


def token_map(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> dict[int, str]:
    """id -> display string for a set of vocabulary ids (each looked up once)."""
    unique = list(dict.fromkeys(ids))
    return dict(zip(unique, token_strings(tokenizer, unique), strict=True))


def ids_tensor(tokens: list[Token]) -> torch.Tensor:
    return torch.tensor([t.id for t in tokens], dtype=torch.long)  # (n,)
