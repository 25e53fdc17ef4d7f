"""The in-loop stop: `stop_text(text) -> int | None` for Engine.complete, returning how much of
the completion to keep as soon as it closes the syntax node it started in, so that no token is
spent past it:

- single line: the end of the line, or a closer the completion did not open when the text after
  the cursor has one (it belongs there, e.g. the `)` of `print(|)`);
- multi-line: a line dedented below the block the cursor is in (Python), a closer of the
  enclosing block (kept when the suffix does not close it already), a blank line before a new
  top-level statement, or `max_lines` lines;
- either: degenerate output (`syntax/degenerate.py`: a unit or line repeated in a row, blank
  lines, the prompt's last line echoed), cut where it starts, so no token is spent on it.

The stop `make_stop` returns (a client.TextStop) records why it fired in `reason`: None until then, "syntax" or
"degenerate" after (the first reason sticks: the pipeline asks again on the final text).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..client import StopReason, TextStop
from ..config import SyntaxOptions
from ..documents import Snapshot
from . import degenerate
from .gate import Mode, block_header
from .lang import CLOSERS, OPENERS, indent_width, line_bounds, spec


@dataclass(frozen=True)
class StopRule:
    mode: Mode
    floor: int             # a completion line indented less than this has left the block
    suffix_closes: bool    # the suffix's next line closes the enclosing block already
    tail_closers: str      # closers in the text after the cursor on its line
    line_comment: str
    quotes: str
    max_lines: int


def stop_rule(snap: Snapshot, offset: int, mode: Mode, opts: SyntaxOptions = SyntaxOptions()) -> StopRule:
    text = snap.text
    s, e = line_bounds(text, offset)
    before = text[s:offset]
    sp = spec(snap.language)
    if mode is Mode.MULTI and block_header(snap, offset):
        floor = indent_width(before) + 1
    elif not before.strip():
        floor = indent_width(before) or indent_width(_prev_nonblank(text, s))
    else:
        floor = indent_width(before)
    nxt = _next_nonblank(text, e)
    suffix_closes = bool(nxt.strip()) and nxt.strip()[0] in CLOSERS and indent_width(nxt) < floor
    tail = "".join(ch for ch in text[offset:e] if ch in CLOSERS)
    return StopRule(mode, floor, suffix_closes, tail, sp.line_comment, sp.quotes, opts.max_lines)


def _prev_nonblank(text: str, line_start: int) -> str:
    end = line_start
    while end > 0:
        s, _ = line_bounds(text, end - 1)
        line = text[s:end].rstrip("\r\n")
        if line.strip():
            return line
        end = s
    return ""


def _next_nonblank(text: str, line_end: int) -> str:
    i = line_end
    while i < len(text):
        j = i + (2 if text.startswith("\r\n", i) else 1)
        _, e = line_bounds(text, j)
        line = text[j:e]
        if line.strip():
            return line
        i = e
        if e >= len(text):
            break
    return ""


SEEN_CHARS = 20_000  # document text either side of the cursor in which a run is the document's own idiom
# The cursor's line and the line above as the echo check sees them: their last ECHO_CHARS (it runs
# after every token; a completion line never repeats a longer one, and a 1 MB line cost 1 ms a token)
ECHO_CHARS = 4096


class Stop(TextStop):
    """`stop(text) -> int | None` for Engine.complete: the syntax stop, and the degenerate stop
    judging what the syntax stop would keep. `reason` says which fired first; `generated` keeps
    the text it was last asked about in full (an engine returns only what the stop kept)."""

    def __init__(self, rule: StopRule, head: str, prev: str, seen: str, degenerate_stop: bool = True):
        self.rule, self.head, self.prev, self.seen = rule, head, prev, seen
        self.degenerate_stop = degenerate_stop and rule.mode is not Mode.EMPTY
        self.reason: str | None = None
        self.degenerate: degenerate.Degenerate | None = None
        self.generated = ""  # the longest text judged: what was generated before the stop cut it

    def __call__(self, text: str) -> int | None:
        if len(text) > len(self.generated):
            self.generated = text
        cut = stop_at(self.rule, text)
        kept = text if cut is None else text[:cut]
        d = degenerate.find(kept, self.head, self.prev, self.seen) if self.degenerate_stop else None
        if d is not None:
            self.degenerate = self.degenerate or d
            self.reason = self.reason or StopReason.DEGENERATE
            return d.keep
        if cut is not None:
            self.reason = self.reason or StopReason.SYNTAX
        return cut


def make_stop(snap: Snapshot, offset: int, mode: Mode, opts: SyntaxOptions = SyntaxOptions()) -> Stop:
    text = snap.text
    s, _ = line_bounds(text, offset)
    seen = text[max(offset - SEEN_CHARS, 0):offset + SEEN_CHARS]
    return Stop(stop_rule(snap, offset, mode, opts), text[max(s, offset - ECHO_CHARS):offset],
                _prev_nonblank(text, s)[-ECHO_CHARS:], seen, opts.stop_degenerate)


def stop_at(rule: StopRule, text: str) -> int | None:
    """Length of `text` to keep if the completion is finished, else None."""
    if rule.mode is Mode.EMPTY:
        return 0
    unopened = unopened_closer(text, rule)
    if rule.mode is Mode.SINGLE:
        nl = text.find("\n")
        if unopened is not None and (nl < 0 or unopened < nl) and text[unopened] in rule.tail_closers:
            return _trim_end(text, unopened)
        return nl if nl >= 0 else None
    return _multi_stop(rule, text, unopened)


def unopened_closer(text: str, rule: StopRule) -> int | None:
    """Index of the first closer in `text` that `text` itself did not open (strings and line
    comments skipped), or None."""
    stack: list[str] = []
    quote, i = None, 0
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 1
            elif ch == quote or ch == "\n":
                quote = None
        elif ch in rule.quotes:
            quote = ch
        elif rule.line_comment and text.startswith(rule.line_comment, i):
            nl = text.find("\n", i)
            if nl < 0:
                return None
            i = nl
            continue
        elif ch in OPENERS:
            stack.append(ch)
        elif ch in CLOSERS:
            if not stack:
                return i
            stack.pop()
        i += 1
    return None


def _multi_stop(rule: StopRule, text: str, unopened: int | None) -> int | None:
    lines = text.split("\n")
    if unopened is not None and unopened <= len(lines[0]) and text[unopened] in rule.tail_closers:
        return _trim_end(text, unopened)
    pos = len(lines[0]) + 1  # char offset of lines[k]
    for k in range(1, len(lines)):
        line, complete = lines[k], k < len(lines) - 1
        body = line.strip()
        closer_here = unopened is not None and pos <= unopened < pos + len(line)
        if body and (indent_width(line) < rule.floor or closer_here):
            if closer_here and line[: unopened - pos].strip() and rule.suffix_closes:
                return _trim_end(text, unopened)  # `    b)`: the suffix closes the call already
            if (body[0] in CLOSERS or closer_here) and not rule.suffix_closes:
                # the completion closes the block the suffix leaves open: keep that line whole
                return pos + len(line) if complete else None
            return _trim_end(text, pos - 1)
        if body and rule.floor == 0 and k >= 2 and not lines[k - 1].strip() and not line[0].isspace():
            return _trim_end(text, pos - 1)  # a blank line, then a new top-level statement
        if complete and k + bool(lines[0].strip()) >= rule.max_lines:
            return _trim_end(text, pos + len(line))
        pos += len(line) + 1
    return None


def _trim_end(text: str, n: int) -> int:
    """Keep text[:n] without trailing whitespace."""
    return len(text[:n].rstrip())
