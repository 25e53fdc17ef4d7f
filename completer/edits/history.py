"""The workspace's edit history (issue 24 item 1): every `didChange` is recorded here and
coalesced into edit events — a burst of typing in one place. An event ends when the user pauses
longer than PAUSE_S, jumps more than JUMP_LINES lines (or JUMP_CHARS chars) away, edits another
document, or the event grows past MAX_EVENT_CHARS; an edit that restores the text from before the
event cancels it. Events are kept newest last as the region's text before/after plus a few lines
of context, rendered as unified diffs, and `recent` hands out the newest within an event and
char budget (chars stand in for tokens: ≈3–4 chars a token in code).

Offsets are Python string indices (char offsets) in the document as it was before the change.
Work per change is bounded by the change, the open event and the context windows, never by the
document: a 1 MB line costs what a short one does. Torch-free (the language server imports it)."""
from __future__ import annotations

import difflib
import time
from collections import deque
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Protocol

from ..documents import line_of

# No options yet (issue 24 item 2 will read them); the values are chosen, not measured.
PAUSE_S = 1.0            # seconds: a pause longer than this ends the event
JUMP_LINES = 2           # an edit more than this many lines from the event's region starts a new one
JUMP_CHARS = 2000        # ... or more than this many chars away (a jump along one long line)
CONTEXT_LINES = 3        # unchanged lines around the region in an event's diff
CONTEXT_CHARS = 300      # each side at most: context in a 1 MB line is clipped
MAX_EVENT_CHARS = 8000   # an event's text before or after past this is closed and clipped
MAX_EVENTS = 64          # events kept across the workspace: the oldest are dropped


@dataclass(frozen=True)
class Change:
    """One edit in char offsets: text[start:end] replaced by `text`."""
    start: int
    end: int
    text: str


class _Doc(Protocol):
    text: str

    def offset_at(self, line: int, character: int) -> int: ...


def change_from_lsp(doc: _Doc, range_: tuple[tuple[int, int], tuple[int, int]] | None, text: str) -> Change | str:
    """An LSP content change on `doc` (before it is applied) as `record` takes it: positions go
    through the document's own conversion (its negotiated encoding); no range = the whole text."""
    if range_ is None:
        return text
    a, b = doc.offset_at(*range_[0]), doc.offset_at(*range_[1])
    return Change(min(a, b), max(a, b), text)  # a reversed range edits the same span, as Document does


@dataclass(frozen=True)
class Event:
    """A burst of edits to one region of one document. `old` is the region's text before the
    event, `new` its text now; `before`/`after` are the unchanged lines around it (whole lines
    unless clipped at CONTEXT_CHARS). `start` is the region's char offset in the document as of
    the event's last edit. `clipped`: old/new were cut to MAX_EVENT_CHARS."""
    uri: str
    start: int
    old: str
    new: str
    before: str
    after: str
    first: float  # time of the first and last edit (the `now` given to record)
    last: float
    clipped: bool = False

    @cached_property
    def diff(self) -> str:
        a = (self.before + self.old + self.after).splitlines()
        b = (self.before + self.new + self.after).splitlines()
        return "\n".join(difflib.unified_diff(a, b, self.uri, self.uri, n=CONTEXT_LINES, lineterm="")) + "\n"


class EditHistory:
    """The edit events of one workspace, newest last: at most MAX_EVENTS closed ones plus the open
    one (the one typing still extends). Documents closed or deleted keep their events until
    `forget`. Used on one thread (the LSP loop)."""

    def __init__(self) -> None:
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self.open: Event | None = None

    def record(self, uri: str, old_text: str, change: Change | str, now: float | None = None) -> None:
        """`change` applied to `old_text` (the document before it): a Change, or the whole new
        text (its changed span is found by comparing the two)."""
        now = time.monotonic() if now is None else now
        if isinstance(change, str):
            change = _span(old_text, change)
        s, e, ins = change.start, change.end, change.text
        if s == e and not ins:
            return
        ev = self.open
        if ev is not None and (ev.uri != uri or now - ev.last > PAUSE_S or _far(old_text, ev, s, e)):
            self._close()
            ev = None
        if ev is None:
            lo, hi, old = s, e, old_text[s:e]
            first = now
        else:
            rend = ev.start + len(ev.new)
            lo, hi = min(s, ev.start), max(e, rend)
            old = old_text[lo:ev.start] + ev.old + old_text[rend:hi]
            first = ev.first
        new = old_text[lo:s] + ins + old_text[e:hi]
        if new == old:  # undone: the region reads as before the event
            self.open = None
            return
        self.open = Event(uri, lo, old, new, _lines_before(old_text, lo), _lines_after(old_text, hi), first, now)
        if len(old) > MAX_EVENT_CHARS or len(new) > MAX_EVENT_CHARS:
            self.open = replace(self.open, old=_clip(old), new=_clip(new), clipped=True)
            self._close()

    def _close(self) -> None:
        ev, self.open = self.open, None
        prev = self.events[-1] if self.events else None
        if (prev is not None and not ev.clipped and prev.uri == ev.uri and prev.start == ev.start
                and prev.new == ev.old and prev.old == ev.new):
            self.events.pop()  # an undo after a pause: the two cancel
            return
        self.events.append(ev)

    def recent(self, max_events: int = 8, max_chars: int = 4000) -> list[Event]:
        """The newest events, newest last, at most `max_events` whose diffs together take at most
        `max_chars` (the newest that does not fit ends the list, so the result is contiguous)."""
        out: list[Event] = []
        for ev in self._all_newest_first():
            if len(out) >= max_events or len(ev.diff) > max_chars:
                break
            max_chars -= len(ev.diff)
            out.append(ev)
        return out[::-1]

    def _all_newest_first(self):
        if self.open is not None:
            yield self.open
        yield from reversed(self.events)

    def forget(self, uri: str) -> None:
        """Drop every event of `uri` (a document the user wants out of the history)."""
        if self.open is not None and self.open.uri == uri:
            self.open = None
        kept = [ev for ev in self.events if ev.uri != uri]
        self.events.clear()
        self.events.extend(kept)

    def __len__(self) -> int:
        return len(self.events) + (self.open is not None)


def _far(text: str, ev: Event, s: int, e: int) -> bool:
    """Whether an edit of text[s:e] is a jump from the event's region: more than JUMP_LINES line
    breaks or JUMP_CHARS chars between them (counted only inside that gap)."""
    rend = ev.start + len(ev.new)
    lo, hi = (rend, s) if s > rend else (e, ev.start) if e < ev.start else (0, 0)
    return hi - lo > JUMP_CHARS or line_of(text, hi, lo) > JUMP_LINES


def _lines_before(text: str, pos: int) -> str:
    """The CONTEXT_LINES whole lines before the line holding `pos`, and that line up to `pos`."""
    floor, p = max(0, pos - CONTEXT_CHARS), pos
    for _ in range(CONTEXT_LINES + 1):
        j = text.rfind("\n", floor, p)
        if j < 0:
            return text[floor:pos]
        p = j
    return text[p + 1:pos]


def _lines_after(text: str, pos: int) -> str:
    """The rest of the line holding `pos` and the CONTEXT_LINES lines after it."""
    ceil, p = min(len(text), pos + CONTEXT_CHARS), pos
    for _ in range(CONTEXT_LINES + 1):
        j = text.find("\n", p, ceil)
        if j < 0:
            return text[pos:ceil]
        p = j + 1
    return text[pos:p]


def _clip(s: str) -> str:
    if len(s) <= MAX_EVENT_CHARS:
        return s
    half = MAX_EVENT_CHARS // 2
    return f"{s[:half]}\n… {len(s) - 2 * half} chars …\n{s[-half:]}"


def _span(old: str, new: str, block: int = 4096) -> Change:
    """The one Change that turns `old` into `new`: their common prefix and suffix stay. Blocks
    compare in C; only the block that differs is walked char by char."""
    n = min(len(old), len(new))
    p = 0
    while p + block <= n and old[p:p + block] == new[p:p + block]:
        p += block
    while p < n and old[p] == new[p]:
        p += 1
    m = n - p  # the suffix may not overlap the prefix
    q = 0
    while q + block <= m and old[len(old) - q - block:len(old) - q] == new[len(new) - q - block:len(new) - q]:
        q += block
    while q < m and old[len(old) - q - 1] == new[len(new) - q - 1]:
        q += 1
    return Change(p, len(old) - q, new[p:len(new) - q])
