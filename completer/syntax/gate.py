"""Gating: whether to complete at a cursor, and how much (Empty / SingleLine / MultiLine), from the
syntax node at the cursor and the text around it on its line."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config import SyntaxOptions
from ..documents import Snapshot, is_binary
from .lang import CLOSERS, captures, line_bounds, node_at, spec


class Mode(str, Enum):
    EMPTY = "empty"
    SINGLE = "single_line"
    MULTI = "multi_line"


@dataclass(frozen=True)
class Decision:
    mode: Mode
    reason: str


QUOTE_SCAN = 10_000  # chars before the cursor in which an unterminated quote is looked for
# After the cursor, these alone still leave the line open for a completion (auto-closed pairs).
_LINE_TAIL_OK = set(CLOSERS) | set("\"'`;:,. \t")


def _ident(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def literal_at(snap: Snapshot, offset: int) -> str | None:
    """"comment", "docstring", "string" or None for the literal that holds the cursor."""
    if snap.tree is None:
        return None
    b = snap.byte_at(offset)
    found = None
    for kind, nodes in captures(snap, "literals", max(b - 1, 0), b + 1).items():
        for n in nodes:
            inside = n.start_byte < b < n.end_byte or (kind == "comment" and n.start_byte < b == n.end_byte)
            if inside and (found is None or kind == "docstring"):
                found = kind
    if found is None:
        found = _unclosed_quote(snap, offset)
    return found


def _unclosed_quote(snap: Snapshot, offset: int) -> str | None:
    """An unterminated string parses as an ERROR somewhere: fall back to counting quotes on the
    line before the cursor."""
    if not snap.tree.root_node.has_error:
        return None
    s, _ = line_bounds(snap.text, offset)
    # a longer line is data or minified code: its last QUOTE_SCAN chars decide (a Python loop
    # over a 1 MB line would cost 0.1 s per request)
    s = max(s, offset - QUOTE_SCAN)
    open_q, i, before = None, 0, snap.text[s:offset]
    while i < len(before):
        ch = before[i]
        if open_q is None and ch in spec(snap.language).quotes:
            open_q = ch
        elif open_q is not None and ch == "\\":
            i += 1
        elif ch == open_q:
            open_q = None
        i += 1
    return "string" if open_q is not None else None


def block_header(snap: Snapshot, offset: int) -> bool:
    """Whether the text before the cursor ends with a block opener (`def f():`, `if (x) {`): by
    the tree when it parses (the opener borders a statement block, or ends a construct whose
    body is still missing), else by the line's first keyword."""
    s, _ = line_bounds(snap.text, offset)
    before = snap.text[s:offset].rstrip()
    sp = spec(snap.language)
    if not before or before[-1] not in sp.openers:
        return False
    if snap.tree is None:
        return True
    tok = node_at(snap, snap.byte_at(s + len(before)))
    parent = tok.parent
    if tok.is_error or parent is None or parent.is_error:
        words = before.split()
        return not sp.header_keywords or words[0].rstrip(":") in sp.header_keywords
    nxt = tok.next_sibling
    if nxt is None and sp.indent_blocks:
        return True  # `def f(x):` at the end of the text: the body is all that is missing
    return any(n is not None and _is_block(snap, n) for n in (parent, nxt))


def _is_block(snap: Snapshot, node) -> bool:
    caps = captures(snap, "blocks", node.start_byte, node.start_byte + 1)
    return any(n.id == node.id for ns in caps.values() for n in ns)


def node_kind(snap: Snapshot, offset: int) -> str | None:
    """What the cursor sits in, for per-kind draft lengths (the engine keeps acceptance history
    per kind): the keyword or punctuation just typed ("(", ",", "=", "return"), else the smallest
    named node around the cursor that is neither a leaf (an identifier says little) nor an ERROR
    (half-typed code is mostly ERROR nodes)."""
    while offset > 0 and snap.text[offset - 1] in " \t":  # "return |" is still after "return"
        offset -= 1
    node = node_at(snap, snap.byte_at(offset))
    if node is not None and not node.is_named and node.child_count == 0 and node.end_byte == snap.byte_at(offset):
        return node.type
    while node is not None and node.parent is not None and (
            not node.is_named or node.child_count == 0 or node.type == "ERROR"):
        node = node.parent
    return None if node is None else node.type


def gate(snap: Snapshot, offset: int, opts: SyntaxOptions = SyntaxOptions()) -> Decision:
    text = snap.text
    if is_binary(text):
        return Decision(Mode.EMPTY, "binary content")
    s, e = line_bounds(text, offset)
    before, after = text[s:offset], text[offset:e]
    kind = literal_at(snap, offset)
    if kind == "comment":
        return (Decision(Mode.SINGLE, "in a comment") if opts.complete_in_comments
                else Decision(Mode.EMPTY, "in a comment"))
    if kind == "docstring":
        if not opts.complete_in_docstrings:
            return Decision(Mode.EMPTY, "in a docstring")
        return Decision(Mode.MULTI if not before.strip() and opts.multiline else Mode.SINGLE,
                        "in a docstring")
    if kind == "string":
        return (Decision(Mode.SINGLE, "in a string") if opts.complete_in_strings
                else Decision(Mode.EMPTY, "in a string"))
    if after[:1] and _ident(after[0]):
        if before[-1:] and _ident(before[-1]):
            return Decision(Mode.EMPTY, "inside an identifier")
        return Decision(Mode.EMPTY, "an identifier follows the cursor")
    if not set(after) <= _LINE_TAIL_OK:
        return Decision(Mode.SINGLE, "text follows on the line")
    if after.strip():
        return Decision(Mode.SINGLE, "closers follow on the line")
    if not opts.multiline:
        return Decision(Mode.SINGLE, "multi-line disabled")
    if not before.strip():
        return Decision(Mode.MULTI, "empty line")
    if block_header(snap, offset):
        return Decision(Mode.MULTI, "after a block header")
    return Decision(Mode.SINGLE, "end of a line")
