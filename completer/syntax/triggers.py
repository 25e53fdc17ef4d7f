"""Warmup triggers: syntax events in an edit after which a completion request is likely (a finished
block header, a new line in a block, `return `, `=`, `(`, `.`), so the caller prefills the
engine's KV cache (`engine.warmup`) before the debounce fires."""
from __future__ import annotations

import re

from ..documents import Snapshot
from .gate import block_header
from .lang import line_bounds

# event → pattern on the cursor line's text before the cursor (after an edit that typed there)
LINE_TRIGGERS = (
    ("return", re.compile(r"\breturn $")),
    ("assign", re.compile(r"[^=!<>:+\-*/%&|^]=\s?$")),
    ("call", re.compile(r"\w\($")),
    ("member", re.compile(r"\w\.$")),
)


def detect(snap: Snapshot, offset: int, inserted: str) -> list[str]:
    """Events at `offset` (the end of `inserted`, just applied to `snap`)."""
    if not inserted or len(inserted) > 200:  # deletions and pastes: wait for the request
        return []
    text = snap.text
    s, e = line_bounds(text, offset)
    before = text[s:offset]
    events = []
    if "\n" in inserted and not before.strip() and not text[offset:e].strip():
        ps, _ = line_bounds(text, max(s - 1, 0))
        prev_end = s - 1 - (text[s - 2:s] == "\r\n")
        events.append("block_start" if s > 0 and block_header(snap, max(prev_end, ps)) else "newline")
    elif inserted.rstrip()[-1:] in (":", "{") and block_header(snap, offset):
        events.append("header")
    else:
        events += [name for name, pat in LINE_TRIGGERS if pat.search(before)]
    return events
