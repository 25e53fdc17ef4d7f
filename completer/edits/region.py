"""The editable region of a next-edit suggestion: whole lines around the cursor that the model
rewrites (issue 24 item 2). `above` lines above the cursor's line and `below` below it, inside the
innermost enclosing definition (function, class: the syntax layer's `definitions` query), and
never ending inside a statement: the line after the region starts a statement of a block (or the
file ends there), else the region grows to the statement's end within `max_lines`, else shrinks
to before it. This mirrors the regions the embedded pair was fine-tuned on
(draft_models/edit_data.py random_region: 0–3 lines above, 4–30 below, clipped to the enclosing
def or class). Without a syntax tree (plain text, a file too large to parse) only the line counts
apply. A region over `max_chars` loses its longer edge line until it fits; a cursor line
longer than that alone (a 1 MB line) is a RegionError: no suggestion there, never a crash.

Lines end at \\r\\n, \\r or \\n, as in completer/documents. Torch-free."""
from __future__ import annotations

import bisect

from tree_sitter import Tree

from ..documents import PositionError, Snapshot, line_starts, snapshot_around
from ..syntax.lang import captures

MAX_CHARS = 8000  # a region of 40 lines of code is ≈1.5 KB; 8 KB leaves room for long lines


class RegionError(ValueError):
    """No region can be made here (the cursor's line alone is longer than max_chars)."""


def editable_region(text: str, line: int, *, above: int = 3, below: int = 20, max_lines: int = 40,
                    max_chars: int = MAX_CHARS, language: str | None = None, tree: Tree | None = None,
                    starts: list[int] | None = None) -> tuple[int, int]:
    """Lines [lo, hi) of `text` (0-based) to rewrite for a cursor on `line`. `tree` is the
    parse of `text` in `language` when the caller has one (an open document); else a language
    has the text parsed around the cursor. PositionError for a line outside the text."""
    starts = line_starts(text) if starts is None else starts
    n = len(starts)
    if not 0 <= line < n:
        raise PositionError(f"line {line} is out of range: the text has {n} lines (0-based)")
    max_lines = max(max_lines, 1)
    lo, hi = max(0, line - max(above, 0)), min(n, line + 1 + max(below, 0))
    snap, base = _parsed(text, starts[line], language, tree)
    if snap is not None:
        s, e = _enclosing(snap, base, starts, line)
        lo, hi = max(lo, s), min(hi, e)
    lo = max(lo, line + 1 - max_lines)  # the cursor's line stays in
    hi = min(hi, lo + max_lines)
    if snap is not None:
        hi = _statement_end(snap, base, starts, line, lo, hi, max_lines)
    return _within_chars(text, starts, line, lo, hi, max_chars)


def _end(text: str, starts: list[int], i: int) -> int:
    """Char offset where line i begins (the text's end past the last line)."""
    return starts[i] if i < len(starts) else len(text)


def _parsed(text: str, offset: int, language: str | None, tree: Tree | None) -> tuple[Snapshot | None, int]:
    """(a parsed snapshot, where it starts in `text`), or (None, 0) without a tree."""
    if tree is not None:
        return Snapshot(text, language, tree), 0
    if language is None:
        return None, 0
    snap, base = snapshot_around(text, language, offset)
    return (snap, base) if snap.tree is not None else (None, 0)


def _enclosing(snap: Snapshot, base: int, starts: list[int], line: int) -> tuple[int, int]:
    """Lines [first, last + 1) of the innermost definition holding the cursor's line, else all."""
    a = snap.byte_at(starts[line] - base)
    b = snap.byte_at(min(_end(snap.text, starts, line + 1) - base, len(snap.text)))
    inner = None
    for d in captures(snap, "definitions", a, max(b, a + 1)).get("definition", []):
        if d.start_byte < max(b, a + 1) and d.end_byte > a and (inner is None or d.start_byte >= inner.start_byte):
            inner = d
    if inner is None:
        return 0, len(starts)
    first = _line_of(starts, base + snap.char_at(inner.start_byte))
    last = _line_of(starts, base + max(snap.char_at(inner.end_byte) - 1, 0))
    return first, last + 1


def _line_of(starts: list[int], offset: int) -> int:
    return max(bisect.bisect_right(starts, offset) - 1, 0)


def _statement_end(snap: Snapshot, base: int, starts: list[int], line: int, lo: int, hi: int,
                   max_lines: int) -> int:
    """`hi` moved so that line `hi` starts a statement of a block: down within max_lines, else
    up (never above the cursor's line)."""
    def clean(h: int) -> bool:
        return h >= len(starts) or _boundary(snap, starts[h] - base)

    if clean(hi):
        return hi
    for h in range(hi + 1, min(lo + max_lines, len(starts)) + 1):
        if clean(h):
            return h
    for h in range(hi - 1, line, -1):
        if clean(h):
            return h
    return hi


def _boundary(snap: Snapshot, cut: int) -> bool:
    """Whether a line break just before char `cut` separates statements: the smallest node that
    holds both the break and the next char is a block (or the file), or there is none."""
    if cut <= 0 or cut >= len(snap.text):
        return True
    b = snap.byte_at(cut)
    root = snap.tree.root_node
    node = root.descendant_for_byte_range(b - 1, b + 1)
    if node is None or node == root:
        return True
    # the query over the node's first byte only: it meets the node and the few blocks around it
    # (over the node's whole range, a cut inside a 5 000-line class would list all its blocks)
    blocks = {n.id for ns in captures(snap, "blocks", node.start_byte, node.start_byte + 1).values() for n in ns}
    return node.id in blocks


def _within_chars(text: str, starts: list[int], line: int, lo: int, hi: int, max_chars: int) -> tuple[int, int]:
    size = lambda a, b: _end(text, starts, b) - starts[a]
    if size(line, line + 1) > max_chars:
        raise RegionError(f"line {line} has {size(line, line + 1)} characters, more than a next-edit region "
                          f"holds ({max_chars})")
    while size(lo, hi) > max_chars:  # the longer edge line goes first
        if lo < line and (hi == line + 1 or size(lo, lo + 1) >= size(hi - 1, hi)):
            lo += 1
        else:
            hi -= 1
    return lo, hi
