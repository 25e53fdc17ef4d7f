"""Next-edit prompt formats (a table, like completer/fim.py's FIM table): how the edit history
and the editable region are written for a model, and how its answer is read back.

The embedded pair's own format ("completer") reuses its FIM tokens, as it was fine-tuned on
(draft_models/edit_data.py renders training samples with this same function):

    <fim_prefix>{history}<fim_suffix>{region}<fim_middle>{the region rewritten}<|endoftext|>

`history` is the recent edit events, oldest first, each as its changed lines only (`-old`,
`+new`, no context and no hunk headers: line numbers would change with every edit and the
region is right there), preceded by `# path` when the event is in another file. The region is
tokenized on its own, as the answer is: an unchanged line is the same tokens in both, which is
what the speculative-edit drafter (engine/drafters.EditDrafter) copies from.

Torch-free: the language server and the training recipe import it.
"""
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


@dataclass(frozen=True)
class EditFormat:
    """One model family's next-edit format. `prompt(history, path, region)` gives the prompt as
    pieces; the answer is the region rewritten, ended by one of `stops`."""
    name: str
    prompt: object  # Callable[[Sequence[HistoryItem], str, str], list[Piece]]
    stops: tuple[str, ...]
    marks: tuple[str, ...] = ()  # special tokens whose presence in a tokenizer selects this format


EDIT_FORMATS: dict[str, EditFormat] = {
    "completer": EditFormat("completer", own_prompt, ("<|endoftext|>",), ("<fim_middle>",)),
}
