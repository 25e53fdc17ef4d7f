"""Degenerate output: text a small model emits once it has lost the thread — a unit repeated in a
row (`_R_R_R_R`, `not not not`), the same line or block of lines over and over, a run of blank
lines, the line before the cursor echoed back. Pure text functions (no torch), cheap enough to run
on every decode step inside the syntax stop (`syntax/stop.py`), so the engine stops paying for
tokens as soon as the output turns and post-processing never shows it.

Thresholds are set so that real code does not trigger (`'-' * 40`, `# -----`, `))))`,
`0, 0, 0, 0`, `b'\\x00\\x00\\x00\\x00'`, `'%s %s %s'`, `(m, m, m, m, m, m, m)`, `self.a = a` /
`self.b = b`; the tables in tests/test_degenerate.py). Measured by taking real code after every
line start and mid-line as a 240-char "completion": 1.2 % of positions flag on the held-out
stdlib (email/, json/, asyncio/ with their tests, mostly literal test data: rows repeated,
`xxxx xxxx`), 0.3 % on a sample of the training split; the pair's junk on held-out holes
(bench/holes.py) goes from 10.5 % of shown completions to 0.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

RUN = re.compile(r"([^\n]{1,40}?)\1{2,}")  # a unit (no newline) followed by ≥ 2 copies of itself
WORDS = re.compile(r"\b([A-Za-z_]\w*)(?:[ \t]+\1\b){2,}(?=\W)")  # `not not not` (the last word complete)
BLANK = re.compile(r"\n(?:[ \t]*\n){3,}")  # ≥ 3 blank lines in a row (PEP 8 never asks for more than 2)
WORDY = re.compile(r"[A-Za-z_]")
DIGIT = re.compile(r"\d")
ESCAPE = re.compile(r"[\\%{]")  # escapes (`\x00`), format fields (`%s`, `{}`): runs of them are real


@dataclass(frozen=True)
class Degenerate:
    kind: str   # run | words | lines | blank | echo
    start: int  # where the degenerate part starts in the text
    keep: int   # length of the text to keep (0: drop it all)


def find(text: str, head: str = "", prev: str = "", seen: str = "") -> Degenerate | None:
    """The earliest degenerate part of a completion `text`, or None.

    `head`: the cursor's line before the cursor; `prev`: the last non-empty line above it. The
    prompt's last line (the cursor's line once completed, or `prev` when `head` is blank)
    repeated as a later line is an echo. `seen`: document text near the cursor; a run that
    appears there verbatim is the document's own idiom, not degeneration."""
    found = [d for d in (_run(text, seen), _words(text), _lines(text), _blank(text), _echo(text, head, prev))
             if d is not None]
    return min(found, key=lambda d: d.start) if found else None


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _drop_line(kind: str, text: str, i: int) -> Degenerate:
    """The line holding position i has gone bad: keep the lines before it."""
    s = _line_start(text, i)
    return Degenerate(kind, i, len(text[:s].rstrip()))


def _min_repeats(unit: str) -> int | None:
    """Copies in a row that make a run of `unit` degenerate; None when no run of it is."""
    if not WORDY.search(unit):
        if len(unit) == 1 or not unit.strip():
            return None  # rulers `-----`, closers `))))`, alignment
        return 16 if DIGIT.search(unit) else 6  # `0, 0, 0, 0` is data; `#  #  #  #` is not
    if ESCAPE.search(unit):
        return 16  # `\x00\x00...`, `%s %s ...`: real code repeats these a few times
    if len(unit.strip(" ,")) <= 1:
        return 12  # `XXXX`, `aaaa`, `m, m, m, m, m, m` are real; twelve of a letter are not
    if unit.rstrip().endswith(","):
        return 6  # list items: `None, None, None, None`, `m, m, m, m, m` are real arguments
    return 4 if len(unit) <= 8 else 3


def _run(text: str, seen: str) -> Degenerate | None:
    pos = 0
    while (m := RUN.search(text, pos)) is not None:
        unit = m.group(1)
        need = _min_repeats(unit)
        copies = len(m.group(0)) // len(unit)
        if need is not None and copies >= need and m.group(0) not in seen:
            return _drop_line("run", text, m.start())
        pos = m.start() + 1  # an overlapping later run may still be degenerate
    return None


def _words(text: str) -> Degenerate | None:
    m = WORDS.search(text)
    return _drop_line("words", text, m.start()) if m else None


def _lines(text: str) -> Degenerate | None:
    """A line three times in a row, or a block of 2–4 lines twice in a row (complete lines only:
    the last line may still grow). Keeps the first copy."""
    lines = text.split("\n")[:-1]
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln) + 1)
    for i in range(len(lines)):
        for p in (1, 2, 3, 4):
            block, copies = lines[i:i + p], 3 if p == 1 else 2
            if i + copies * p > len(lines) or not any(ln.strip() for ln in block):
                continue
            if all(lines[i + c * p:i + (c + 1) * p] == block for c in range(1, copies)):
                s = starts[i + p]
                return Degenerate("lines", s, len(text[:s].rstrip()))
    return None


def _blank(text: str) -> Degenerate | None:
    m = BLANK.search(text)
    return Degenerate("blank", m.start(), len(text[:m.start()].rstrip())) if m else None


def _echo(text: str, head: str, prev: str) -> Degenerate | None:
    """The prompt's last line repeated as the next line: the cursor's line (as the completion's
    first line completes it) when `head` has text, else `prev` repeated by the first line."""
    lines = (head + text).split("\n")
    k = 1 if head.strip() else 0  # the line that would repeat the reference
    if k + 1 >= len(lines):
        return None  # not complete yet
    ref = lines[0] if k else prev
    if len(ref.strip()) < 4 or not WORDY.search(ref) or lines[k].strip() != ref.strip():
        return None
    pos = len(lines[0]) + 1 - len(head) if k else 0  # the echo's offset in `text`
    return Degenerate("echo", pos, len(text[:pos].rstrip()))
