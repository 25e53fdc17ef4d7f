"""Open documents: text, incremental edits in LSP positions (UTF-16 by default, UTF-8/UTF-32 when
negotiated), and a tree-sitter tree edited with each edit and re-parsed incrementally when it is
next read (once for all the changes of a didChange).

Offsets are Python string indices ("char offsets"); positions are (line, character) in the
negotiated encoding; tree-sitter works in UTF-8 bytes. `Snapshot` is an immutable view handed to
worker threads: edits never mutate a tree a snapshot holds (the old tree is copied before
`Tree.edit`). Parsers are one per language per thread (`parser_for`), never one per document; a
text that is not an open document is parsed only around the cursor when it is large
(`snapshot_around`); a text known in an earlier version is parsed from that version's parse
(`parse_from`: the workspace index's re-indexes).
"""
from __future__ import annotations

import bisect
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

from tree_sitter import Language, Parser, Point, Range, Tree

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
# A text that is not an open document (CLI, `completer serve`) and is longer than this is parsed
# only in a window around the cursor: a 1 MB parse costs ≈0.35 s of CPU with the GIL held.
WINDOW_CHARS = 128 * 1024
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


_local = threading.local()
_made_lock = threading.Lock()
_made = 0


def parser_for(language: str) -> Parser:
    """The calling thread's parser for `language`: a Parser is not thread-safe, and one per
    document (≈40 KB each) grew with every file an editor ever opened."""
    global _made
    parsers = _local.__dict__.setdefault("parsers", {})
    if language not in parsers:
        parsers[language] = Parser(ts_language(language))
        with _made_lock:
            _made += 1
    return parsers[language]


def parser_count() -> int:
    """Parsers made so far in this process: one per language per thread that parsed."""
    return _made


def encode(text: str) -> bytes:
    # JSON allows lone surrogates ("\ud800"); keep them byte-for-byte instead of failing.
    return text.encode("utf-8", "surrogatepass")


def is_binary(data: str | bytes) -> bool:
    """The one binary-file rule (the CLI's file check, the gate, the parse, the workspace index):
    a NUL in the first 8 KB, as git and grep decide."""
    return ("\x00" if isinstance(data, str) else b"\x00") in data[:8192]


def line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in _EOL.finditer(text)]


def line_of(text: str, offset: int, start: int = 0) -> int:
    """The one char offset → line rule: line breaks in text[start:offset] (\\r\\n, a lone \\r
    and \\n each once, as line_starts), i.e. the 0-based line of `offset` counted from the line
    holding `start`. Counts without building a line table (a 1 MB text costs three scans)."""
    return text.count("\n", start, offset) + text.count("\r", start, offset) - text.count("\r\n", start, offset)


def offset_at(text: str, line: int, character: int, encoding: str = "utf-32", *, strict: bool = False,
              exact: bool = False, starts: list[int] | None = None) -> int:
    """The one line/column → char offset rule (the language server's documents, the CLI, the
    pipeline): lines end at `\r\n`, `\r` or `\n`; `character` counts code units of `encoding`
    (utf-32: chars). A character past the line end means the line end (as LSP says) unless
    `exact`; a line past the end is the text's end; both raise PositionError if `strict`/`exact`."""
    starts = line_starts(text) if starts is None else starts
    if line < 0 or character < 0:
        if strict or exact:
            raise PositionError(f"negative position ({line}, {character})")
        line, character = max(line, 0), max(character, 0)
    if line >= len(starts):
        if strict or exact:
            raise PositionError(f"line {line} is out of range: the text has {len(starts)} lines (0-based)")
        return len(text)
    end = starts[line + 1] if line + 1 < len(starts) else len(text)
    row = text[starts[line]:end].rstrip("\r\n")
    n = _chars(row, character, encoding)
    if exact and _units(row[:n], encoding) != character:
        raise PositionError(f"column {character} is out of range: line {line} has {_units(row, encoding)} "
                            f"{'characters' if encoding == 'utf-32' else encoding + ' code units'}")
    return starts[line] + n


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

    @cached_property
    def _ascii(self) -> bool:
        return self.text.isascii()

    @cached_property
    def _block_bytes(self) -> list[int]:
        """Byte offset of every _BLOCK-th char, so that a conversion encodes at most one block
        (the syntax layer converts a few dozen offsets per request, in documents of any size)."""
        out, b = [0], 0
        for i in range(_BLOCK, len(self.text) + 1, _BLOCK):
            b += len(encode(self.text[i - _BLOCK:i]))
            out.append(b)
        return out

    def byte_at(self, offset: int) -> int:
        if self._ascii:
            return offset
        k = offset // _BLOCK
        return self._block_bytes[k] + len(encode(self.text[k * _BLOCK:offset]))

    def char_at(self, byte: int) -> int:
        """The char offset of a byte offset on a char boundary (a node's start or end)."""
        if self._ascii:
            return byte
        k = bisect.bisect_right(self._block_bytes, byte) - 1
        return k * _BLOCK + len(self.source[self._block_bytes[k]:byte].decode("utf-8", "surrogatepass"))


_BLOCK = 4096


def parse_snapshot(text: str, language: str | None) -> Snapshot:
    """A snapshot of text that is not open as a document (CLI, benchmarks)."""
    tree = None
    if language is not None and not is_binary(text):
        src = encode(text)
        if len(src) <= MAX_PARSE_BYTES:
            tree = parser_for(language).parse(src)
    return Snapshot(text, language, tree)


def parse_from(src: bytes, language: str, old: tuple[bytes, Tree] | None = None) -> Tree:
    """`src` parsed: whole, or incrementally from `old` = (an earlier source, its tree) with one
    edit over what lies between their common prefix and suffix, so tree-sitter parses again only
    around it (a line typed in 120 KB: ≈7 ms against ≈30 ms whole, the GIL held either way). The
    old tree is left as it was (a snapshot may hold it)."""
    if old is None:
        return parser_for(language).parse(src)
    old_src, old_tree = old
    start, tail = shared_ends(old_src, src)
    old_end, new_end = len(old_src) - tail, len(src) - tail
    tree = old_tree.copy()
    tree.edit(start_byte=start, old_end_byte=old_end, new_end_byte=new_end,
              start_point=_byte_point(old_src, start), old_end_point=_byte_point(old_src, old_end),
              new_end_point=_byte_point(src, new_end))
    return parser_for(language).parse(src, tree)


def parse_ranges(src: bytes, language: str, starts: Sequence[int], spans: Sequence[tuple[int, int]],
                 members: Mapping[int, Sequence[int]] | None = None) -> Tree:
    """`src` parsed only where its top-level statements hold one of `spans` (byte ranges):
    `starts` are where its top-level statements that begin a line start, from a whole parse of
    this very `src` (the workspace index's outline); `members`, for a Python class among them
    (by its start), where the lines of its body's statements start: of such a class only its
    header and the statements holding a span are parsed. Each statement is parsed as in the
    whole file (same nodes, same offsets: a statement is a syntax unit of its own; a class's
    header with some of its statements is still a class) and the rest is skipped: a rename's
    importer costs a few statements, not the file (the 20 renames of bench/next_edit.py
    --latency parse 43 % of their importers' bytes)."""
    keep: list[tuple[int, int]] = []
    for lo, hi in spans:
        first = max(bisect.bisect_right(starts, lo) - 1, 0)
        for k in range(first, max(bisect.bisect_left(starts, hi), first + 1)):
            a = starts[k] if starts else 0
            b = starts[k + 1] if k + 1 < len(starts) else len(src)
            lines = members.get(a) if members else None
            if not lines:
                keep.append((a, b))
                continue
            keep.append((a, lines[0]))  # the class's header (decorators, `class C(B):`)
            for u, m in enumerate(lines):
                e = lines[u + 1] if u + 1 < len(lines) else b
                if m < hi and lo < e:
                    keep.append((m, e))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(keep):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        elif b > a:
            merged.append((a, b))
    parser = parser_for(language)
    parser.included_ranges = [Range(_byte_point(src, a), _byte_point(src, b), a, b) for a, b in merged] \
        or [Range(Point(0, 0), Point(0, 0), 0, 0)]
    try:
        return parser.parse(src)
    finally:
        parser.included_ranges = []


def shared_ends(a: bytes, b: bytes) -> tuple[int, int]:
    """(prefix, suffix): the lengths of the longest common prefix of `a` and `b` and of their
    longest common suffix that does not overlap it."""
    head = _shared(a, b, min(len(a), len(b)), False)
    return head, _shared(a, b, min(len(a), len(b)) - head, True)


def _shared(a: bytes, b: bytes, limit: int, from_end: bool) -> int:
    """How many bytes `a` and `b` agree on from their start (or end), at most `limit`: slices of
    doubling length compared until one differs, then halved (≈2 × the answer bytes compared, a
    few dozen slices: no byte-by-byte Python loop)."""
    def same(i: int, j: int) -> bool:  # bytes [i, j) counted from the start, or from the end
        return a[i:j] == b[i:j] if not from_end else a[len(a) - j:len(a) - i] == b[len(b) - j:len(b) - i]

    lo, step = 0, 64
    while lo < limit:
        hi = min(lo + step, limit)
        if not same(lo, hi):
            break
        lo, step = hi, step * 2
    else:
        return limit
    while hi - lo > 1:  # [0, lo) agree, [lo, hi) does not
        mid = (lo + hi) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def _byte_point(src: bytes, b: int) -> Point:
    """tree-sitter's point (row, byte column) of byte `b`: rows count `\\n` only, as it does."""
    return Point(src.count(b"\n", 0, b), b - (src.rfind(b"\n", 0, b) + 1))


_TOP_LEVEL_LINE = re.compile(r"(?:\r\n|\r|\n)(?=\S)")
_SPACE = re.compile(r"\s")


def snapshot_around(text: str, language: str | None, offset: int,
                    reach: int = WINDOW_CHARS) -> tuple[Snapshot, int]:
    """(snapshot, start): `text` parsed whole when it is at most 2 × `reach` chars, else only
    `text[start:end]` within about `reach` of `offset`, so that a request on a text that is not
    an open document costs the same for 10 KB or 10 MB. The start moves in steps of reach/2
    (stable while the user types: the prompt built from it stays cached) and then to the next
    top-level line, else any line, else whitespace (a window never opens inside a token)."""
    if len(text) <= 2 * reach:
        return parse_snapshot(text, language), 0
    step = max(reach // 2, 1)
    lo = max((offset - reach) // step * step, 0)
    if lo:
        m = (_TOP_LEVEL_LINE.search(text, lo, offset) or _EOL.search(text, lo, offset)
             or _SPACE.search(text, lo, offset))
        lo = m.end() if m else lo
    hi = min(offset + reach, len(text))
    nl = text.rfind("\n", offset, hi)
    hi = nl + 1 if nl >= 0 and hi < len(text) else hi
    return parse_snapshot(text[lo:hi], language), lo


class Document:
    def __init__(self, uri: str, text: str, language: str | None, version: int = 0,
                 encoding: str = "utf-16"):
        self.uri, self.version, self.encoding = uri, version, encoding
        self.language = language
        self.parses = 0  # tree-sitter parses of this document (tests count them)
        self.set_text(text)

    # -- whole-text state ---------------------------------------------------------------------
    def set_text(self, text: str) -> None:
        text = well_formed(text)  # a lone surrogate → U+FFFD (the tokenizer cannot take one)
        self.text = text
        self.lines = line_starts(text)
        self._ascii = text.isascii()  # chars are bytes (an edit's byte offsets cost nothing)
        self._cr = "\r" in text       # a lone \r may be in it (see _point); both stay set once set
        self._tree: Tree | None = None
        self._stale = False
        if self._parseable():
            self._parse()

    @property
    def tree(self) -> Tree | None:
        """The syntax tree of the text, parsed once for all the edits since it was last read."""
        if self._stale:
            self._parse()
        return self._tree

    def _parse(self) -> None:
        """Parse the text: from the edited tree of the last parse, else whole."""
        self._stale = False
        self.parses += 1
        src, parser = encode(self.text), parser_for(self.language)
        self._tree = parser.parse(src) if self._tree is None else parser.parse(src, self._tree)

    def parse(self) -> None:
        """After `drop_tree`: parse again when the tree is next read (nothing to do when the tree
        is there or cannot be)."""
        if self._tree is None and self._parseable():
            self._stale = True

    def drop_tree(self) -> None:
        """Free the tree (≈35× the text's size) of a document that is not being edited."""
        self._tree, self._stale = None, False

    def _parseable(self) -> bool:
        return (self.language is not None and len(self.text) <= MAX_PARSE_BYTES and not is_binary(self.text)
                and (self._ascii or len(encode(self.text)) <= MAX_PARSE_BYTES))

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
        """Char offset of an LSP position in the document's position encoding (offset_at below)."""
        return offset_at(self.text, line, character, self.encoding, strict=strict, starts=self.lines)

    def position_at(self, offset: int) -> tuple[int, int]:
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.lines, offset) - 1
        return line, _units(self.text[self.lines[line]:offset], self.encoding)

    # -- edits --------------------------------------------------------------------------------
    def apply(self, start: int, end: int, new: str) -> None:
        """Replace chars [start, end) by `new`: splice the line table and edit the tree; the tree
        is parsed again when it is next read, once for all the edits before (one didChange of
        2 000 changes on a 1.2 MB document parsed 2 000 times: 13 of the 17 ms per change)."""
        new = well_formed(new)
        old_text = self.text
        if self._tree is not None:  # where the edit is in the old text, in tree-sitter's units
            if self._ascii:
                sb, old_eb = start, end
            else:
                sb = len(encode(old_text[:start]))
                old_eb = sb + len(encode(old_text[start:end]))
            start_point, old_end_point = self._point(start), self._point(end)
        self.text = old_text[:start] + new + old_text[end:]
        self._splice_lines(old_text, start, end, new)
        self._ascii = self._ascii and new.isascii()
        self._cr = self._cr or "\r" in new
        if not self._parseable():
            self._tree, self._stale = None, False
            return
        if self._tree is not None:
            if not self._stale:
                self._tree = self._tree.copy()  # snapshots may still hold the parsed tree
            self._tree.edit(start_byte=sb, old_end_byte=old_eb, new_end_byte=sb + len(encode(new)),
                            start_point=start_point, old_end_point=old_end_point,
                            new_end_point=self._point(start + len(new)))
        self._stale = True

    def _point(self, offset: int) -> Point:
        """tree-sitter's point (row, byte column) of a char offset. Its rows count only `\\n`: the
        line table's rows, unless the text may hold a lone `\\r` (then counted: 0.7 ms in 1.2 MB,
        three times per edit)."""
        if self._cr:
            row, ls = self.text.count("\n", 0, offset), self.text.rfind("\n", 0, offset) + 1
        else:
            row = bisect.bisect_right(self.lines, offset) - 1
            ls = self.lines[row]
        return Point(row, offset - ls if self._ascii else len(encode(self.text[ls:offset])))

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


class Documents:
    """The open documents of one client, keyed by URI: at most `max_open` of them (opening one
    more drops the least recently used and tells `on_evict(uri)`), and trees for the
    `max_parsed` most recently used (another is parsed again when it is used). Mutated on one
    thread (the LSP loop); workers read `Snapshot`s."""

    def __init__(self, encoding: str = "utf-16", max_open: int | None = None,
                 on_evict: Callable[[str], None] = lambda uri: None, max_parsed: int | None = None):
        self.encoding, self.max_open, self.on_evict, self.max_parsed = encoding, max_open, on_evict, max_parsed
        self._docs: OrderedDict[str, Document] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def open(self, uri: str, text: str, language_id: str | None = None, version: int = 0) -> Document:
        doc = Document(uri, text, language_for(language_id, uri), version, self.encoding)
        evicted = []
        with self._lock:
            self._docs[uri] = doc
            self._used(uri)
            while self.max_open is not None and len(self._docs) > self.max_open:
                evicted.append(self._docs.popitem(last=False)[0])
        for old in evicted:
            self.on_evict(old)
        return doc

    def get(self, uri: str) -> Document | None:
        doc = self._docs.get(uri)
        if doc is not None:
            self._used(uri)
            doc.parse()
        return doc

    def _used(self, uri: str) -> None:
        """`uri` becomes the most recently used; the tree that falls out of the last
        `max_parsed` is freed."""
        self._docs.move_to_end(uri)
        if self.max_parsed is not None:
            for d in itertools.islice(reversed(self._docs.values()), self.max_parsed, None):
                d.drop_tree()  # ≈0.1 ms for 2 000 documents, once per edit

    def uris(self) -> list[str]:
        return list(self._docs)

    def parsed(self) -> int:
        """Documents holding a syntax tree (one edited since its parse counts)."""
        return sum(d._tree is not None for d in self._docs.values())

    def close(self, uri: str) -> None:
        with self._lock:
            self._docs.pop(uri, None)

    def __len__(self) -> int:
        return len(self._docs)
