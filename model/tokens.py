"""Text -> tokens with character spans and display strings people can read.

A byte-level BPE token may hold only part of a character (a CJK character is three
UTF-8 bytes, an emoji four, and either may be split over tokens). Every character
belongs to exactly one token — the one that holds its *last* byte — so the tokens'
spans never overlap and, joined, rebuild the text exactly once. A token that holds
bytes of a character finished by a later token shows those bytes as a marker such as
``‹e6 88›``; it never repeats the whole character.
"""

from __future__ import annotations

import codecs
import threading
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

# BPE / SentencePiece / WordPiece markers, as the raw vocabulary spells them
_MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}


@dataclass(frozen=True)
class Token:
    index: int
    id: int
    text: str  # what a person sees: markers cleaned; partial characters as ‹hex› bytes
    start: int  # character offsets of the characters this token completes; start == end when none
    end: int
    special: bool = False  # a special token (<|endoftext|>, [CLS]): it covers no text
    partial: bool = False  # holds bytes of a character that a later token completes


@dataclass(frozen=True)
class Piece:
    """One token's share of a text: the characters it completes and how to show it."""

    text: str  # the characters whose last byte is in this token ("" for none)
    display: str
    special: bool
    partial: bool


def display(raw: str) -> str:
    if raw.startswith("##"):
        return raw[2:]
    return "".join(_MARKERS.get(ch, ch) for ch in raw)


def byte_marker(data: bytes) -> str:
    return "‹" + " ".join(f"{b:02x}" for b in data) + "›"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted: stand-in char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and "ByteLevel" in repr(decoder)


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "all_special_ids", [])}


def token_bytes(tokenizer: PreTrainedTokenizerBase, raw: str) -> bytes | None:
    """The bytes a byte-level token stands for (None when it is not spelled in byte stand-ins)."""
    table = _byte_decoder()
    try:
        return bytes(table[ch] for ch in raw)
    except KeyError:
        return None


class TextAssembler:
    """Feeds token ids one at a time and says which characters each one completes.

    Byte-level tokenizers go through an incremental UTF-8 decoder; others (SentencePiece,
    WordPiece) decode the growing prefix and keep what stopped changing.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.byte_level = is_byte_level(tokenizer)
        self.special = _special_ids(tokenizer)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._ids: list[int] = []
        self._done = ""  # text committed so far (non-byte-level path)
        self.text = ""  # every committed character, in order

    def push(self, tid: int, raw: str | None = None) -> Piece:
        if raw is None:
            raw = str(self.tokenizer.convert_ids_to_tokens([tid])[0])
        if tid in self.special:
            return Piece(text="", display=raw, special=True, partial=False)
        if self.byte_level:
            data = token_bytes(self.tokenizer, raw)
            if data is not None:
                owned = self._utf8.decode(data)
                pending = self._utf8.getstate()[0]
                own_pending = pending[-len(data):] if pending else b""
                self.text += owned
                shown = owned + (byte_marker(own_pending) if own_pending else "")
                return Piece(text=owned, display=shown, special=False, partial=bool(own_pending))
        return self._push_by_prefix(tid, raw)

    def _push_by_prefix(self, tid: int, raw: str) -> Piece:
        self._ids.append(tid)
        full = self._decode()
        stable = full.rstrip("\ufffd")
        owned = stable[len(self._done):] if stable.startswith(self._done) else ""
        if stable.startswith(self._done):
            self._done = stable
        self.text += owned
        partial = len(stable) < len(full)
        shown = owned or display(raw)
        return Piece(text=owned, display=shown + ("…" if partial and owned else ""), special=False, partial=partial)

    def _decode(self) -> str:
        text = self.tokenizer.decode(self._ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if not isinstance(text, str):  # decode returns a list only for a batch of sequences
            raise TypeError(f"the tokenizer decoded {len(self._ids)} ids to {type(text).__name__}, not str")
        return text

    def finish(self) -> str:
        """Characters still incomplete at the end (shown as U+FFFD), for the last token."""
        if self.byte_level:
            rest = self._utf8.decode(b"", final=True)
        else:
            full = self._decode()
            rest = full[len(self._done):]
            self._done = full
        self.text += rest
        return rest


def _tokens_from_pieces(ids: list[int], pieces: list[Piece]) -> list[Token]:
    tokens: list[Token] = []
    cursor = 0
    for i, (tid, p) in enumerate(zip(ids, pieces, strict=True)):
        end = cursor + len(p.text)
        tokens.append(Token(index=i, id=int(tid), text=p.display, start=cursor, end=end,
                            special=p.special, partial=p.partial))
        cursor = end
    return tokens


def _tokens_by_offsets(tokenizer: PreTrainedTokenizerBase, text: str, ids: list[int], raws: list[str],
                       offsets: list[tuple[int, int]]) -> list[Token]:
    """Spans from the tokenizer's offsets when the bytes cannot be read: each character
    goes to the last token whose offsets cover it; characters no token covers (the
    spaces WordPiece drops) go to the next token that owns any, so spans stay contiguous."""
    special = _special_ids(tokenizer)
    unk = tokenizer.unk_token_id  # a character the vocabulary lacks: the model sees this token, not it
    owner = [-1] * len(text)
    for i, (s, e) in enumerate(offsets):
        for c in range(s, min(e, len(text))):
            owner[c] = i
    last_owned = {i: c for c, i in enumerate(owner) if i >= 0}  # later characters overwrite earlier
    owners = sorted(last_owned)
    tokens: list[Token] = []
    cursor = 0
    for i, (tid, raw, (s, e)) in enumerate(zip(ids, raws, offsets, strict=True)):
        end = last_owned[i] + 1 if i in last_owned else cursor
        if owners and i == owners[-1]:
            end = len(text)  # trailing characters no token covers go to the last owner
        end = max(end, cursor)
        is_special = int(tid) in special and e <= s
        partial = e > s and (i not in last_owned or last_owned[i] + 1 < e)
        if unk is not None and int(tid) == unk and not is_special:
            shown = display(raw)  # "[UNK]": the span keeps the characters it stands for
        elif end > cursor:
            shown = text[max(cursor, s):end]  # the span may also hold a gap no token covers (a space)
        else:
            shown = display(raw) if is_special or not partial else f"‹{display(raw)}›"
        tokens.append(Token(index=i, id=int(tid), text=shown, start=cursor, end=end,
                            special=is_special, partial=partial))
        cursor = end
    return tokens


def tokenize(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool = True) -> list[Token]:
    """Tokens of ``text`` as the model sees them (special tokens included), with spans
    that never overlap and rebuild ``text`` exactly once. ``add_special_tokens=False`` for
    text that already spells them (a rendered chat template)."""
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_special_tokens)
    ids: list[int] = [int(i) for i in enc["input_ids"]]
    raws = [str(r) for r in tokenizer.convert_ids_to_tokens(ids)]
    offsets = [(int(s), int(e)) for s, e in enc["offset_mapping"]]
    if is_byte_level(tokenizer):
        asm = TextAssembler(tokenizer)
        pieces = []
        for tid, raw, (s, e) in zip(ids, raws, offsets, strict=True):
            if tid in asm.special and e > s:  # the prompt spells a special token out: it covers that text
                asm.text += text[s:e]
                pieces.append(Piece(text=text[s:e], display=text[s:e], special=False, partial=False))
            else:
                pieces.append(asm.push(tid, raw))
        if asm.finish() == "" and asm.text == text:
            return _tokens_from_pieces(ids, pieces)
    return _tokens_by_offsets(tokenizer, text, ids, raws, offsets)


class _DecodedCache:
    """Each vocabulary entry decoded once per tokenizer (the vocabulary bounds its size)."""

    def __init__(self) -> None:
        self._by_tokenizer: dict[int, dict[int, str]] = {}
        self._lock = threading.Lock()

    def strings(self, tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
        with self._lock:
            known = self._by_tokenizer.setdefault(id(tokenizer), {})
            missing = [i for i in dict.fromkeys(ids) if i not in known]
        decoded = {i: _out_of_context(tokenizer, i) for i in missing}
        with self._lock:
            known.update(decoded)
            return [known[i] for i in ids]


def _decode_one(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    text = tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
    if not isinstance(text, str):  # decode returns a list only for a batch of sequences
        raise TypeError(f"the tokenizer decoded id {token_id} to {type(text).__name__}, not str")
    return text


def _out_of_context(tokenizer: PreTrainedTokenizerBase, tid: int) -> str:
    """One vocabulary entry on its own; bytes that are not whole characters as ‹hex›."""
    text = _decode_one(tokenizer, tid)
    if "\ufffd" in text and is_byte_level(tokenizer):
        data = token_bytes(tokenizer, str(tokenizer.convert_ids_to_tokens([tid])[0]))
        if data is not None and "\ufffd" not in data.decode("utf-8", "ignore"):
            return _mixed(data)
    return text


def _mixed(data: bytes) -> str:
    """Whole characters as text, stray bytes as one marker each run."""
    out, run = [], b""
    i = 0
    while i < len(data):
        for size in (1, 2, 3, 4):
            try:
                ch = data[i:i + size].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if run:
                out.append(byte_marker(run))
                run = b""
            out.append(ch)
            i += size
            break
        else:
            run += data[i:i + 1]
            i += 1
    if run:
        out.append(byte_marker(run))
    return "".join(out)


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
