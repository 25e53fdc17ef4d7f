"""Per-language facts the syntax layer needs: the .scm queries (loaded once, run only over a byte
range around the cursor) and the few lexical conventions no query can express (block openers,
line comments, quotes)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tree_sitter import Node, Query, QueryCursor

from ..documents import Snapshot, ts_language

QUERY_DIR = Path(__file__).parent / "queries"
# Folders searched for a language's query, first hit wins: TSX shares TypeScript's node names, and
# TypeScript's grammar extends JavaScript's, so a query the two write alike lives once, in javascript/.
QUERY_FOLDERS = {"tsx": ("typescript", "javascript"), "typescript": ("typescript", "javascript")}


@dataclass(frozen=True)
class LangSpec:
    openers: str = "{"          # a line ending with one of these opens a block
    indent_blocks: bool = False  # blocks end by dedent (Python) rather than by a closer
    line_comment: str = "//"
    quotes: str = "\"'`"
    # stands in for a sibling definition's body, after its signature (which keeps its own `{`);
    # `{indent}` is the definition's indentation
    elided_body: str = " /* ... */ }"
    header_keywords: frozenset[str] = frozenset()  # a line starting so opens a block (unparsed)


SPECS = {
    "python": LangSpec(openers=":", indent_blocks=True, line_comment="#", quotes="\"'",
                       elided_body="\n{indent}    ...",
                       header_keywords=frozenset(["def", "class", "if", "elif", "else", "for", "while", "try", "except", "finally", "with", "async", "match", "case"])),
    "javascript": LangSpec(), "typescript": LangSpec(), "tsx": LangSpec(),
    "go": LangSpec(quotes="\"'`"), "rust": LangSpec(quotes="\""),
}
PLAIN = LangSpec(openers="{:", line_comment="", quotes="\"'")

CLOSERS = {")": "(", "]": "[", "}": "{"}
OPENERS = {v: k for k, v in CLOSERS.items()}


def spec(language: str | None) -> LangSpec:
    return SPECS.get(language or "", PLAIN)


@cache
def query(language: str, name: str) -> Query | None:
    for folder in QUERY_FOLDERS.get(language, (language,)):
        path = QUERY_DIR / folder / f"{name}.scm"
        if path.is_file():
            return Query(ts_language(language), path.read_text())
    return None


def captures(snap: Snapshot, name: str, lo: int, hi: int) -> dict[str, list[Node]]:
    """Captures of query `name` over byte range [lo, hi) of the snapshot's tree, each list in
    document order. tree-sitter 0.26 returns a capture's nodes in an order that can change
    between two parses of the same text; the header packs imports greedily in this order, so an
    unsorted list made the prompt differ at every keystroke (bench/context.py --lsp: 190 prompt
    tokens recomputed per keystroke at p50, 1 once sorted)."""
    if snap.tree is None or snap.language is None:
        return {}
    q = query(snap.language, name)
    if q is None:
        return {}
    qc = QueryCursor(q)
    qc.set_byte_range(max(lo, 0), max(hi, lo, 0))
    return {k: sorted(v, key=lambda n: (n.start_byte, n.end_byte))
            for k, v in qc.captures(snap.tree.root_node).items()}


def node_at(snap: Snapshot, byte: int) -> Node | None:
    """The smallest node that contains the byte just before `byte` (the token the cursor
    touches from the left), or the root."""
    if snap.tree is None:
        return None
    root = snap.tree.root_node
    b = max(byte - 1, 0)
    return root.descendant_for_byte_range(b, b + 1) or root


_EOL = re.compile(r"[\r\n]")


def line_bounds(text: str, offset: int) -> tuple[int, int]:
    """(start, end) char offsets of the line holding `offset`, end before its terminator. Costs
    the line's length, not the document's (a minified file is one line)."""
    s = text.rfind("\n", 0, offset) + 1
    r = text.rfind("\r", s, offset)
    m = _EOL.search(text, offset)
    return max(s, r + 1), m.start() if m else len(text)


def indent_width(s: str, tab: int = 4) -> int:
    """Visual width of the leading whitespace of `s`."""
    w = 0
    for ch in s:
        if ch == " ":
            w += 1
        elif ch == "\t":
            w += tab - w % tab
        else:
            break
    return w
