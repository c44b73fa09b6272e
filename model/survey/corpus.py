"""A corpus file read as a stream of documents, never whole, trusting nothing.

Two layouts: JSON Lines (``.jsonl`` / ``.ndjson``, or a first line that opens a JSON object), one object
a line with a string field ``text``; or plain text, documents separated by blank lines. A line is read
with a cap (``MAX_LINE_BYTES``: a 1 GB line is refused after reading the cap, not held); every line must
be UTF-8; a NUL byte in the file's first block marks it binary. Each refusal names the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from attnscope.model.errors import BadInput

MAX_LINE_BYTES = 8 << 20  # one line (one JSON document) at most
MAX_DOCUMENT_CHARS = 8 << 20  # one plain-text document (lines between blank lines) at most
SNIFF_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Document:
    index: int  # 0-based, in the order of the file
    text: str
    end: int  # bytes of the file read once this document is complete (progress)


def _bad(path: Path, message: str, **params: str | int) -> BadInput:
    return BadInput(f"corpus {path.name}: {message}", code="bad_input", params={"file": path.name, **params})


def _lines(path: Path, f: BinaryIO) -> Iterator[tuple[int, str, int]]:
    """(1-based line number, the line decoded without its newline, bytes read so far)."""
    number, read = 0, 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        read += len(raw)
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise _bad(path, f"line {number} is longer than {MAX_LINE_BYTES >> 20} MiB; split the text into documents "
                             "(blank lines between them, or one JSON object a line)", line=number)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _bad(path, f"line {number} is not UTF-8 (byte {err.start + 1} of the line); save the file as "
                             "UTF-8", line=number) from None
        if number == 1:
            text = text.removeprefix("\ufeff")  # a byte-order mark some editors write
        yield number, text.rstrip("\r\n"), read


def is_jsonl(path: Path, head: bytes) -> bool:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    first = next((line.strip() for line in head.splitlines() if line.strip()), b"").removeprefix(b"\xef\xbb\xbf")
    if not first.startswith(b"{"):
        return False
    try:  # a text whose first line opens a brace (code) is text unless that line is a JSON object with "text"
        obj = json.loads(first)
    except ValueError:
        return len(first) >= SNIFF_BYTES - 1  # a first line longer than the sniff: judged by its opening brace
    return isinstance(obj, dict) and "text" in obj


def documents(path: str | Path, skip: int = 0) -> Iterator[Document]:
    """The file's documents in order (empty ones dropped), the first ``skip`` of them read but not yielded."""
    p = Path(path)
    if not p.is_file():
        raise _bad(p, "no such file")
    with p.open("rb") as f:
        head = f.read(SNIFF_BYTES)
        nul = head.find(b"\x00")
        if nul >= 0:
            raise _bad(p, f"looks binary (a NUL byte at offset {nul}); a corpus is UTF-8 text or JSON Lines")
        f.seek(0)
        index = 0
        if is_jsonl(p, head):
            for number, line, read in _lines(p, f):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise _bad(p, f"line {number} is not JSON ({err.msg})", line=number) from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise _bad(p, f"line {number} has no string field \"text\"", line=number)
                if obj["text"].strip():
                    if index >= skip:
                        yield Document(index, obj["text"], read)
                    index += 1
            return
        lines: list[str] = []
        size = 0
        read = 0
        for number, line, read in _lines(p, f):
            if line.strip():
                lines.append(line)
                size += len(line) + 1
                if size > MAX_DOCUMENT_CHARS:
                    raise _bad(p, f"the document ending at line {number} is longer than {MAX_DOCUMENT_CHARS >> 20} M "
                                  "characters; separate documents with blank lines", line=number)
                continue
            if lines:
                if index >= skip:
                    yield Document(index, "\n".join(lines), read)
                index += 1
                lines, size = [], 0
        if lines and index >= skip:
            yield Document(index, "\n".join(lines), read)
