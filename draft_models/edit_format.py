"""The embedded pair's own next-edit format, as its fine-tune renders samples
(draft_models/edit_data.py) and the engine renders requests (completer/edits/formats.py, which
imports this: the recipe owns what the pair learned):

    <fim_prefix>{history}<fim_suffix>{region}<fim_middle>{the region rewritten}<|endoftext|>

`history` is the recent edit events, oldest first, each as its changed lines only (`-old`,
`+new`, no context and no hunk headers: line numbers would change with every edit and the
region is right there), preceded by `# path` when the event is in another file. The region is
tokenized on its own, as the answer is. Torch-free."""
from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryItem:
    """One edit event as whole lines: `old` → `new` in the file at `path` (text, newline-ended)."""
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Piece:
    text: str
    special: bool = False  # a special token spelled `text` (never read from a document)


def changed_lines(old: str, new: str) -> str:
    """`-old` / `+new` lines of what changed between two texts (no context, no headers)."""
    out = []
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        out += ["-" + ln for ln in a[i1:i2]] + ["+" + ln for ln in b[j1:j2]]
    return "".join(ln + "\n" for ln in out)


def own_history(history: Sequence[HistoryItem], path: str) -> str:
    parts = []
    for h in history:
        body = changed_lines(h.old, h.new)
        if body:
            parts.append(("" if h.path == path else f"# {h.path}\n") + body)
    return "".join(parts)


def own_prompt(history: Sequence[HistoryItem], path: str, region: str) -> list[Piece]:
    return [Piece("<fim_prefix>", True), Piece(own_history(history, path)),
            Piece("<fim_suffix>", True), Piece(region), Piece("<fim_middle>", True)]
