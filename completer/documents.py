"""Open documents: text, incremental edits in LSP positions (UTF-16 by default, UTF-8/UTF-32 when
negotiated), and a tree-sitter tree re-parsed incrementally after each edit.

Offsets are Python string indices ("char offsets"); positions are (line, character) in the
negotiated encoding; tree-sitter works in UTF-8 bytes. `Snapshot` is an immutable view handed to
worker threads: edits never mutate a tree a snapshot holds (the old tree is copied before
`Tree.edit`).
"""
from __future__ import annotations

import bisect
import re
import threading
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

from tree_sitter import Language, Parser, Point, Tree

from .wellformed import well_formed

# LSP languageId / file extension → canonical grammar name.
LANGUAGE_IDS = {
    "python": "python", "javascript": "javascript", "javascriptreact": "javascript",
    "typescript": "typescript", "typescriptreact": "tsx", "tsx": "tsx", "go": "go", "rust": "rust",
}
EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript",
    ".cjs": "javascript", ".jsx": "javascript", ".ts": "typescript", ".mts": "typescript",
    ".cts": "typescript", ".tsx": "tsx", ".go": "go", ".rs": "rust",
}
# Above this size a document is kept as plain text: a first parse of 10 MB costs ≈1.5 s and a
# completion never needs more than a few KB around the cursor.
MAX_PARSE_BYTES = 2_000_000
_EOL = re.compile(r"\r\n|\r|\n")
ENCODINGS = ("utf-16", "utf-8", "utf-32")


class PositionError(ValueError):
    """A position outside the document (a line past the end)."""


def language_for(language_id: str | None = None, path: str | None = None) -> str | None:
    """Canonical grammar name from an LSP languageId or a file name; None = plain text."""
    if language_id and language_id.lower() in LANGUAGE_IDS:
        return LANGUAGE_IDS[language_id.lower()]
    if path:
        return EXTENSIONS.get(Path(path.split("?")[0]).suffix.lower())
    return None


@cache
def ts_language(name: str) -> Language:
    if name == "python":
        import tree_sitter_python as m
        return Language(m.language())
    if name == "javascript":
        import tree_sitter_javascript as m
        return Language(m.language())
    if name in ("typescript", "tsx"):
        import tree_sitter_typescript as m
        return Language(m.language_typescript() if name == "typescript" else m.language_tsx())
    if name == "go":
        import tree_sitter_go as m
        return Language(m.language())
    if name == "rust":
        import tree_sitter_rust as m
        return Language(m.language())
    raise KeyError(name)


def encode(text: str) -> bytes:
    # JSON allows lone surrogates ("\ud800"); keep them byte-for-byte instead of failing.
    return text.encode("utf-8", "surrogatepass")


def is_binary(text: str) -> bool:
    return "\x00" in text[:8192]


def line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in _EOL.finditer(text)]


def _units(s: str, encoding: str) -> int:
    """Length of `s` in code units of `encoding`."""
    if encoding == "utf-32" or s.isascii():
        return len(s)
    if encoding == "utf-8":
        return len(encode(s))
    return len(s) + sum(1 for ch in s if ord(ch) > 0xFFFF)


def _chars(s: str, units: int, encoding: str) -> int:
    """Number of chars of `s` covering `units` code units (clamped; never splits a char)."""
    if encoding == "utf-32" or s.isascii():
        return min(units, len(s))
    n = 0
    for i, ch in enumerate(s):
        w = 1 if encoding == "utf-16" and ord(ch) <= 0xFFFF else (
            2 if encoding == "utf-16" else len(encode(ch)))
        if n + w > units:
            return i
        n += w
    return len(s)


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of a document for the syntax layer and worker threads."""
    text: str
    language: str | None
    tree: Tree | None
    version: int = 0

    @cached_property
    def source(self) -> bytes:
        return encode(self.text)

    def byte_at(self, offset: int) -> int:
        return offset if self.text.isascii() else len(encode(self.text[:offset]))


def parse_snapshot(text: str, language: str | None) -> Snapshot:
    """A snapshot of text that is not open as a document (CLI, benchmarks)."""
    tree = None
    if language is not None and not is_binary(text):
        src = encode(text)
        if len(src) <= MAX_PARSE_BYTES:
            tree = Parser(ts_language(language)).parse(src)
    return Snapshot(text, language, tree)


class Document:
    def __init__(self, uri: str, text: str, language: str | None, version: int = 0,
                 encoding: str = "utf-16"):
        self.uri, self.version, self.encoding = uri, version, encoding
        self.language = language
        self._parser = Parser(ts_language(language)) if language else None
        self.set_text(text)

    # -- whole-text state ---------------------------------------------------------------------
    def set_text(self, text: str) -> None:
        text = well_formed(text)  # a lone surrogate → U+FFFD (the tokenizer cannot take one)
        self.text = text
        self.lines = line_starts(text)
        self.tree: Tree | None = None
        self._bytes: bytes | None = None
        if self._parseable():
            self._bytes = encode(text)
            self.tree = self._parser.parse(self._bytes)

    def _parseable(self) -> bool:
        return (self._parser is not None and len(self.text) <= MAX_PARSE_BYTES
                and not is_binary(self.text) and len(encode(self.text)) <= MAX_PARSE_BYTES)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.text, self.language if self.tree is not None else None, self.tree,
                        self.version)

    # -- positions ----------------------------------------------------------------------------
    def line_count(self) -> int:
        return len(self.lines)

    def line_text(self, line: int) -> str:
        """Line `line` without its terminator."""
        s = self.lines[line]
        e = self.lines[line + 1] if line + 1 < len(self.lines) else len(self.text)
        return self.text[s:e].rstrip("\r\n")

    def offset_at(self, line: int, character: int, strict: bool = False) -> int:
        """Char offset of an LSP position. A character past the line end means the line end
        (as the spec says); a line past the end is the document end, or PositionError if strict."""
        if line < 0 or character < 0:
            if strict:
                raise PositionError(f"negative position ({line}, {character})")
            line, character = max(line, 0), max(character, 0)
        if line >= len(self.lines):
            if strict:
                raise PositionError(f"line {line} is past the end ({len(self.lines)} lines)")
            return len(self.text)
        return self.lines[line] + _chars(self.line_text(line), character, self.encoding)

    def position_at(self, offset: int) -> tuple[int, int]:
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.lines, offset) - 1
        return line, _units(self.text[self.lines[line]:offset], self.encoding)

    # -- edits --------------------------------------------------------------------------------
    def apply(self, start: int, end: int, new: str) -> None:
        """Replace chars [start, end) by `new`: splice the line table, edit and re-parse the tree."""
        new = well_formed(new)
        old_text = self.text
        text = old_text[:start] + new + old_text[end:]
        self.text = text
        self._splice_lines(old_text, start, end, new)
        if not self._parseable():
            self.tree, self._bytes = None, None
            return
        if self.tree is None or self._bytes is None:
            self._bytes = encode(text)
            self.tree = self._parser.parse(self._bytes)
            return
        sb = len(encode(old_text[:start]))
        old_eb = sb + len(encode(old_text[start:end]))
        new_eb = sb + len(encode(new))
        tree = self.tree.copy()  # snapshots may still hold self.tree
        tree.edit(start_byte=sb, old_end_byte=old_eb, new_end_byte=new_eb,
                  start_point=_point(old_text, start), old_end_point=_point(old_text, end),
                  new_end_point=_point(text, start + len(new)))
        self._bytes = encode(text)
        self.tree = self._parser.parse(self._bytes, tree)

    def _splice_lines(self, old_text: str, start: int, end: int, new: str) -> None:
        """Update line starts for an edit without rescanning the document: rescan from the line
        before the edit (a `\\r` there may pair with a new `\\n`) to the first line start after
        the edit (text from the edit's end up to it is unchanged, so it stays a line start)."""
        ls = self.lines
        i = max(bisect.bisect_right(ls, start) - 2, 0)
        j = bisect.bisect_right(ls, end)
        lo = ls[i]
        old_hi = ls[j] if j < len(ls) else len(old_text)
        delta = len(new) - (end - start)
        hi = old_hi + delta
        fresh = [lo + m.end() for m in _EOL.finditer(self.text[lo:hi])]
        tail = [s + delta for s in ls[j:]]
        if fresh and tail and fresh[-1] == tail[0]:
            fresh.pop()
        self.lines = ls[: i + 1] + [s for s in fresh if s > lo] + tail

    def apply_change(self, range_: tuple[tuple[int, int], tuple[int, int]] | None, text: str) -> None:
        """One LSP content change: a range in positions, or None for the whole text."""
        if range_ is None:
            self.set_text(text)
            return
        (sl, sc), (el, ec) = range_
        start, end = self.offset_at(sl, sc), self.offset_at(el, ec)
        if end < start:  # a reversed range from a buggy client: still an edit of that span
            start, end = end, start
        self.apply(start, end, text)


def _point(text: str, offset: int) -> Point:
    """tree-sitter point (row, byte column) of a char offset; rows count only `\\n` like
    tree-sitter does."""
    row = text.count("\n", 0, offset)
    ls = text.rfind("\n", 0, offset) + 1
    return Point(row, len(encode(text[ls:offset])))


class Documents:
    """The open documents of one client, keyed by URI. Mutated on one thread (the LSP loop);
    workers read `Snapshot`s."""

    def __init__(self, encoding: str = "utf-16"):
        self.encoding = encoding
        self._docs: dict[str, Document] = {}
        self._lock = threading.Lock()

    def open(self, uri: str, text: str, language_id: str | None = None, version: int = 0) -> Document:
        doc = Document(uri, text, language_for(language_id, uri), version, self.encoding)
        with self._lock:
            self._docs[uri] = doc
        return doc

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def close(self, uri: str) -> None:
        with self._lock:
            self._docs.pop(uri, None)

    def __len__(self) -> int:
        return len(self._docs)
