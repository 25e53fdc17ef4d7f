"""The names used around the cursor, most valuable first: the callee of each call whose
arguments are being typed (innermost first), then the names of the current statement, then
those of the enclosing function's body so far, nearest first. Read lexically from the text (code
at the cursor is half-typed, where a tree has ERROR nodes); comments and strings are skipped."""
from __future__ import annotations

import re

from .outline import Outline

# `a.b.c`, `a::b`, `this.x`; strings and comments matched first so that their words are skipped
_TOKEN = re.compile(r"""(?P<skip>\"\"\".*?(?:\"\"\"|\Z)|'''.*?(?:'''|\Z)|\#[^\n]*|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`[^`]*`)"""
                    r"""|(?P<chain>(?<![\w$.])[A-Za-z_$][\w$]*(?:\s*(?:\.|::)\s*[A-Za-z_$][\w$]*)*)""", re.DOTALL)
_SEP = re.compile(r"\s*(?:\.|::)\s*")
_CALLEE = re.compile(r"([A-Za-z_$][\w$]*(?:\s*(?:\.|::)\s*[A-Za-z_$][\w$]*)*)\s*(?:<[^<>()]*>)?\s*\Z")  # `f`, `a.b`, `Vec::<T>`
KEYWORDS = frozenset(["and", "as", "assert", "async", "await", "break", "case", "catch", "class", "const", "continue", "def", "default", "del", "do", "elif", "else", "enum", "except", "export", "extends", "false", "False", "finally", "fn", "for", "from", "func", "function", "go", "if", "impl", "import", "in", "instanceof", "interface", "is", "lambda", "let", "loop", "match", "mod", "mut", "new", "nil", "None", "nonlocal", "not", "null", "or", "pass", "pub", "raise", "return", "self", "Self", "static", "struct", "super", "switch", "this", "throw", "trait", "true", "True", "try", "type", "typeof", "use", "var", "void", "where", "while", "with", "yield", "package", "defer", "chan", "map", "range", "select", "crate", "ref", "dyn", "unsafe", "extern", "print", "len", "str", "int", "float", "bool", "list", "dict", "set", "tuple", "object", "isinstance", "range"])
MAX_CHAINS = 48
BODY_LINES = 80   # the enclosing function's body is read at most this far back
STATEMENT_CHARS = 2000


def chains_at(text: str, offset: int, outline: Outline | None) -> tuple[list[list[str]], list[str]]:
    """(chains in priority order, the callees among them) for a cursor at char `offset`."""
    line = text.count("\n", 0, offset)
    start = _body_start(text, offset, line, outline)
    window = text[start:offset]
    masked = _mask(window)  # strings and comments blanked: their brackets do not count
    callees = _open_calls(masked[-STATEMENT_CHARS:])
    stmt = _statement_start(masked)
    ordered: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def add(chain: list[str]) -> None:
        key = tuple(chain)
        if key not in seen and (len(chain) > 1 or chain[0] not in KEYWORDS):
            seen.add(key)
            ordered.append(chain)

    for c in callees:
        add(c)
    for part in (window[stmt:], window[:stmt]):  # the statement, then the body so far, nearest first
        for c in reversed(_chains(part)):
            add(c)
    return ordered[:MAX_CHAINS], [".".join(c) for c in callees]


def _chains(s: str) -> list[list[str]]:
    return [_SEP.split(m.group("chain")) for m in _TOKEN.finditer(s) if m.group("chain")]


def _body_start(text: str, offset: int, line: int, outline: Outline | None) -> int:
    """Char offset where the enclosing function starts (from the file's outline), at most
    BODY_LINES back; without one, BODY_LINES // 4 lines back."""
    back = BODY_LINES // 4
    if outline is not None:
        fns = [d for d in outline.definitions if d.kind in ("function", "method")
               and d.start_line <= line <= d.end_line]
        if fns:
            back = min(line - max(d.start_line for d in fns), BODY_LINES)
    pos = offset
    for _ in range(back + 1):
        pos = text.rfind("\n", 0, pos)
        if pos < 0:
            return 0
    start = pos + 1
    for q in ('"""', "'''"):  # a window opening inside a docstring would read its end as an opening
        if text.count(q, 0, start) % 2:
            end = text.find(q, start, offset)
            start = end + 3 if end >= 0 else offset
    return start


def _open_calls(masked: str) -> list[list[str]]:
    """The callee chains of the calls still open at the (masked) text's end, innermost first."""
    depth, out = 0, []
    for i in range(len(masked) - 1, -1, -1):
        ch = masked[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth:
                depth -= 1
            elif ch == "(":
                m = _CALLEE.search(masked[max(i - 200, 0):i])
                if m:
                    out.append(_SEP.split(m.group(1)))
            if ch == "{":
                break  # a block: calls before it are not open any more
    return out


def _statement_start(masked: str) -> int:
    """Where the statement holding the (masked) text's end starts: after the last line break
    outside brackets."""
    depth = 0
    for i in range(len(masked) - 1, -1, -1):
        ch = masked[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                continue
            depth -= 1
        elif ch in "\n;" and depth == 0:
            return i + 1
    return 0


def _mask(s: str) -> str:
    """`s` with strings and comments blanked (same length), so brackets inside them do not count."""
    return _TOKEN.sub(lambda m: " " * len(m.group(0)) if m.group("skip") else m.group(0), s)
