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
import math
import re
import threading
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

import torch
from pydantic import Field
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

# BPE / SentencePiece / WordPiece markers, as the raw vocabulary spells them
_MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}


@dataclass(frozen=True)
class Token:
    index: int
    id: int
    text: Annotated[str, Field(description="display string (BPE markers cleaned)")]
    start: Annotated[int, Field(description="character offset of the first character this token completes")]
    end: Annotated[int, Field(description=(
        "character offset just past the last; start == end when it completes none. Spans never overlap: "
        "consecutive tokens are contiguous and rebuild the text once"))]
    special: Annotated[bool, Field(description=(
        "a special token (<|endoftext|>, [CLS]); it covers no text of a prompt (in a chat run: its spelling "
        "in the rendered template)"))] = False
    partial: Annotated[bool, Field(description=(
        "holds bytes of a character that a later token completes (text then shows those bytes, e.g. ‹e6 88›)"))] = False


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


def _tokens_from_pieces(ids: list[int], pieces: list[Piece], first_index: int = 0, first_char: int = 0) -> list[Token]:
    tokens: list[Token] = []
    cursor = first_char
    for i, (tid, p) in enumerate(zip(ids, pieces, strict=True), start=first_index):
        end = cursor + len(p.text)
        tokens.append(Token(index=i, id=int(tid), text=p.display, start=cursor, end=end,
                            special=p.special, partial=p.partial))
        cursor = end
    return tokens


def tokens_of(tokenizer: PreTrainedTokenizerBase, ids: list[int], first_index: int = 0,
              first_char: int = 0) -> tuple[str, list[Token]]:
    """The text ``ids`` spell and their tokens (ids without a text of their own: a generation's new tokens,
    ids a caller built), numbered from ``first_index`` with offsets from ``first_char`` (where they follow a
    prompt). Bytes of a character left incomplete at the end are shown as U+FFFD, on the last token."""
    assembler = TextAssembler(tokenizer)
    pieces = [assembler.push(int(tid)) for tid in ids]
    rest = assembler.finish()
    if rest and pieces:  # the last token owns the characters still open
        last = pieces[-1]
        pieces[-1] = Piece(text=last.text + rest, display=last.display, special=last.special, partial=last.partial)
    return assembler.text, _tokens_from_pieces(ids, pieces, first_index, first_char)


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


# ---- the first tokens of a long text, without tokenizing all of it ---------------------------------
#
# A 4 MB prompt is two million tokens: tokenizing all of it (ids, spans, display strings) takes
# minutes and gigabytes, only to refuse it. The tokenizer reads a growing beginning instead, and
# stops as soon as the tokens that beginning is sure to share with the whole text pass the limit.

UNREAD_CHARS_PER_TOKEN = 64  # a text longer than limit x this is not read by a tokenizer without a bound (below)
FIRST_CHARS_PER_TOKEN = 8  # the first beginning read: (limit + 1) x this many characters (English: ~4)
GROWTH = 4  # each further beginning is this many times longer: at most ~1.3x the final one, in all
_REGEX_LOOKAHEAD = 16  # characters past a pre-token's end its regex may read (contractions: 3)
_SPACES = (" ", "\n", "\t", "\r")


@dataclass(frozen=True)
class TokenCount:
    """How many tokens a text has, counted only as far as a limit needs.

    ``exact``: ``n`` is the whole text's count (special tokens included). Otherwise the text has
    *at least* ``n`` tokens, and ``n`` is already more than the limit it was counted against; only
    the first ``chars`` characters were tokenized to know it (0: known from the length alone)."""

    n: int
    exact: bool
    chars: int


@dataclass(frozen=True)
class Prefix:
    """The first tokens of a text: all of it when it fits the limit, else the beginning that does."""

    text: str  # the characters ``tokens`` cover: the whole text, or its beginning when ``cut``
    tokens: list[Token]  # tokenize(tokenizer, text): at most the limit
    cut: bool  # the whole text went on past ``text``


@dataclass(frozen=True)
class _Scan:
    ends: list[int]  # (k,) the character end of each content token sure to be the whole text's
    whole: bool  # the whole text was tokenized: ``ends`` are all its content tokens
    chars: int  # characters tokenized


def _spans(tokenizer: PreTrainedTokenizerBase, text: str) -> list[tuple[int, int]]:
    """(start, end) of each content token (no special tokens added), from the tokenizer's offsets."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    return [(int(s), int(e)) for s, e in enc["offset_mapping"]]


def _pre_token_cut(tokenizer: PreTrainedTokenizerBase, part: str) -> int:
    """The last boundary between the tokenizer's pre-tokens (its word split) that text after
    ``part`` cannot move, or 0: a boundary far enough from the end that the splitting regex
    never read past ``part`` to place it."""
    pre = getattr(getattr(tokenizer, "backend_tokenizer", None), "pre_tokenizer", None)
    if pre is None:
        return 0
    starts = [int(s) for _piece, (s, _e) in pre.pre_tokenize_str(part)]
    return max((s for s in starts if 0 < s <= len(part) - _REGEX_LOOKAHEAD), default=0)


def _space_cut(part: str) -> int:
    """Where the last run of whitespace in ``part`` starts, or 0. No token of the tokenizers
    here crosses into a run of whitespace from the word before it (GPT-2 style regexes attach a
    space to the *next* word; WordPiece drops it; SentencePiece pieces start with it)."""
    last = max(part.rfind(ch) for ch in _SPACES)
    while last > 0 and part[last - 1].isspace():
        last -= 1
    return max(last, 0)


def _stable_ends(spans: list[tuple[int, int]], cut: int) -> list[int]:
    """Ends of the leading tokens that lie wholly before ``cut``: the whole text's own tokens."""
    ends = []
    for s, e in spans:
        if s >= cut or e > cut:
            break
        ends.append(e)
    return ends


def _scan(tokenizer: PreTrainedTokenizerBase, text: str, need: int) -> _Scan:
    """Tokenize growing beginnings of ``text`` until ``need`` of their content tokens are sure to
    be the whole text's own first tokens, or the beginning is the whole text."""
    chars = min(len(text), FIRST_CHARS_PER_TOKEN * (need + 1) + 64)
    while True:
        part = text[:chars]
        spans = _spans(tokenizer, part)
        if chars >= len(text):
            return _Scan(ends=[e for _s, e in spans], whole=True, chars=chars)
        if len(spans) >= need:  # enough tokens, if enough of them are settled
            ends = _stable_ends(spans, _space_cut(part))
            if len(ends) < need:
                ends = max(ends, _stable_ends(spans, _pre_token_cut(tokenizer, part)), key=len)
            if len(ends) >= need:
                return _Scan(ends=ends, whole=False, chars=chars)
        chars = min(len(text), chars * GROWTH)


_ALLOWED_NORMALIZERS = {"Sequence", "NFC", "NFKC", "Prepend"}
_ALLOWED_PRE_TOKENIZERS = {"Sequence", "Split", "Regex", "String", "ByteLevel", "Digits", "Metaspace"}
_chars_per_token: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, int | None] = weakref.WeakKeyDictionary()
_chars_lock = threading.Lock()


def _names(component: object) -> set[str]:
    return set(re.findall(r"\b([A-Z]\w*)\(", repr(component)))


def max_chars_per_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The most characters one token can stand for (UTF-8 bytes, for a byte-level BPE), when every
    character of a text is sure to be in some token (a BPE over bytes, or with byte fallback, that
    drops nothing): a text of m characters (bytes) then has at least m / this tokens. None for a
    tokenizer that may drop characters or fold many into one (WordPiece drops spaces and turns a
    long word into one [UNK])."""
    with _chars_lock:
        if tokenizer in _chars_per_token:
            return _chars_per_token[tokenizer]
    bound = _chars_bound(tokenizer)
    with _chars_lock:
        _chars_per_token[tokenizer] = bound
    return bound


def _chars_bound(tokenizer: PreTrainedTokenizerBase) -> int | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    if backend is None or type(model).__name__ != "BPE":
        return None
    if not (is_byte_level(tokenizer) or getattr(model, "byte_fallback", False)):
        return None  # an unknown character may become one [UNK] for a whole run
    normalizer, pre = backend.normalizer, backend.pre_tokenizer
    norm = _names(normalizer) if normalizer is not None else set()
    replace_ok = 'Replace(pattern=String(" "), content="▁")' in repr(normalizer)  # SentencePiece's spaces
    if not (norm - {"Replace", "String"} <= _ALLOWED_NORMALIZERS and ("Replace" not in norm or replace_ok)):
        return None
    if pre is not None and (not _names(pre) <= _ALLOWED_PRE_TOKENIZERS or "Removed" in repr(pre)):
        return None
    fold = 4 if norm & {"NFC", "NFKC"} else 1  # composition folds at most 4 code points into one
    longest = max((len(str(raw)) for raw in tokenizer.get_vocab()), default=1)
    added = max((len(str(t)) for t in getattr(tokenizer, "added_tokens_encoder", {})), default=1)
    return max(longest, added, 1) * fold


def read_cap(tokenizer: PreTrainedTokenizerBase, limit: int) -> int | None:
    """The most characters worth reading for ``limit`` tokens, for a tokenizer whose tokens have no
    bound on the characters they hold (``max_chars_per_token`` is None): whitespace it drops and a
    long word it makes one [UNK] cost time to read but yield no tokens. None: no cap is needed."""
    return None if max_chars_per_token(tokenizer) is not None else limit * UNREAD_CHARS_PER_TOKEN


def _specials(tokenizer: PreTrainedTokenizerBase, add_special_tokens: bool) -> int:
    return int(tokenizer.num_special_tokens_to_add(pair=False)) if add_special_tokens else 0


def count_tokens(tokenizer: PreTrainedTokenizerBase, text: str, limit: int,
                 add_special_tokens: bool = True) -> TokenCount:
    """The number of tokens of ``text`` (as ``tokenize`` makes them), or, when it has more than
    ``limit``, a count above ``limit`` found from as little of the text as that takes: from its
    length alone where every token holds at most a known number of characters, else from a
    beginning whose settled tokens already pass the limit. The work is bounded by the limit, not
    by the text: a 4 MB text over a 1,024-token limit is refused in milliseconds."""
    specials = _specials(tokenizer, add_special_tokens)
    per_token = max_chars_per_token(tokenizer)
    size = len if not is_byte_level(tokenizer) else (lambda part: len(part.encode("utf-8", "surrogatepass")))
    if per_token is not None and math.ceil(size(text) / per_token) + specials > limit:
        return TokenCount(n=math.ceil(size(text) / per_token) + specials, exact=False, chars=0)
    scan = _scan(tokenizer, text, max(limit + 1 - specials, 1))
    if scan.whole:
        return TokenCount(n=len(scan.ends) + specials, exact=True, chars=scan.chars)
    settled = len(scan.ends)
    if per_token is not None:  # the rest of the text is tokens too: at least its length / per_token
        settled += math.ceil(size(text[scan.ends[-1]:]) / per_token)
    return TokenCount(n=settled + specials, exact=False, chars=scan.chars)


def first_tokens(tokenizer: PreTrainedTokenizerBase, text: str, limit: int,
                 add_special_tokens: bool = True) -> Prefix:
    """The first at most ``limit`` tokens of ``text`` (special tokens included) and the text they
    cover, without tokenizing more of the text than that takes. ``cut`` says whether the text went
    on; the tokens are ``tokenize`` of the beginning kept, so their spans rebuild it exactly.
    Only the first ``read_cap`` characters are read, where the tokenizer has one."""
    cap = read_cap(tokenizer, limit)
    if cap is not None and len(text) > cap:
        head = first_tokens(tokenizer, text[:cap], limit, add_special_tokens)
        return Prefix(text=head.text, tokens=head.tokens, cut=True)
    count = count_tokens(tokenizer, text, limit, add_special_tokens)
    if count.exact:
        tokens = tokenize(tokenizer, text, add_special_tokens)
        if len(tokens) <= limit:
            return Prefix(text=text, tokens=tokens, cut=False)
    budget = limit - _specials(tokenizer, add_special_tokens)
    if budget < 1:
        raise ValueError(f"a limit of {limit} tokens leaves no room for text next to the special tokens")
    ends = _scan(tokenizer, text, budget + 1).ends[:budget]
    # the beginning up to the budget-th token's end, tokenized on its own: a token at the cut may
    # split differently there, so drop a token at a time until it fits
    for k in range(len(ends), 0, -1):
        tokens = tokenize(tokenizer, text[:ends[k - 1]], add_special_tokens)
        if len(tokens) <= limit:
            return Prefix(text=text[:ends[k - 1]], tokens=tokens, cut=True)
    return Prefix(text="", tokens=tokenize(tokenizer, "", add_special_tokens), cut=True)


def ids_tensor(tokens: list[Token]) -> torch.Tensor:
    return torch.tensor([t.id for t in tokens], dtype=torch.long)  # (n,)
