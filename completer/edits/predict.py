"""The next-edit prediction (issue 24 item 2): the editable region around the cursor, the edit
history and the model's rewrite of the region, diffed into edits of the file, or dropped with the
reason. The engine is any `EngineClient` (its `rewrite`), so the language server, the CLI, the
WebSocket service and bench/next_edit.py share this one function.

Dropped (`NextEdit.dropped`, the edits empty): "no_history" (nothing to go on), "binary",
"too_long" (a cursor line longer than a region holds, or an answer cut by the token limit),
"cancelled", "untrained" (the model was not taught next edits: the shipped pair; set
next_edit_format to ask it anyway), "malformed" (the answer held no region), "no_change", "undo" (the rewrite turns the
user's last edit back: its new text into its old), "syntax" (the file with the edits applied
parses with more errors than it does now), "unsure" (the engine's confidence gate: a token of the
answer below next_edit_min_confidence; NextEdit.confidence is that token's probability).

History comes in two shapes: the language server's edit events (`from_events`: each event's
changed lines as whole lines) and two versions of a file (`from_versions`: the CLI's and the
WebSocket's OLD → FILE, one item per changed hunk). Torch-free."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..client import Chunk, EngineClient, StopReason
from ..documents import is_binary, language_for, line_starts, offset_at, snapshot_around
from ..syntax.postprocess import error_count
from .diff import TextEdit, opcodes, region_edits
from .follow import Place, detect, places
from .formats import EditPrompt, HistoryItem
from .history import Event
from .region import RegionError, editable_region
from .rename import propagate

CONTEXT_CHARS = 1500  # text before and after the region a format may show (Zeta's excerpt)
RENAME_AFTER = ("untrained", "malformed", "too_long", "no_change", "syntax", "unsure")  # answers a rename may stand in for
SYNTAX_REACH = 64 * 1024  # the syntax check parses this far around the region (a 1 MB file costs what 128 KB does)


class HistoryError(ValueError):
    """The history cannot be made (OLD is not an earlier version of FILE)."""


@dataclass
class NextEdit:
    """A next-edit suggestion: edits of the file (empty when dropped, `dropped` says why), the
    region rewritten (lines [lo, hi)), the model's answer and the engine's numbers."""
    edits: list[TextEdit] = field(default_factory=list)
    region: tuple[int, int] = (0, 0)
    new_tokens: int = 0
    target_forwards: int = 0
    accepted_per_forward: float = 0.0
    total_ms: float = 0.0
    speculative: bool = False
    dropped: str | None = None
    text: str = ""          # the region as the model rewrote it
    format: str | None = None
    source: str = "model"   # or "rename": the syntax tree's rename propagation (rename.py); follow.py's kinds
    model_dropped: str | None = None  # with source "rename": why the model's own answer was dropped
    jump: Place | None = None  # the next place past the region a change at a definition needs (follow.py)
    confidence: float | None = None  # the model's answer's score (confidence.score of its tokens), if it gave one

    def to_json(self) -> dict:
        out = {"edits": [e.to_json() for e in self.edits], "new_tokens": self.new_tokens,
               "target_forwards": self.target_forwards, "accepted_per_forward": round(self.accepted_per_forward, 4),
               "total_ms": round(self.total_ms, 3), "speculative": self.speculative,
               "region": {"start_line": self.region[0], "end_line": self.region[1]}, "format": self.format,
               "source": self.source}
        if self.dropped is not None:
            out["reason"] = self.dropped
        if self.model_dropped is not None:
            out["model_reason"] = self.model_dropped
        if self.confidence is not None:
            out["confidence"] = round(self.confidence, 4)
        if self.jump is not None:
            j = self.jump
            out["jump"] = {"start_line": j.line, "start_col": j.col, "end_line": j.end_line, "end_col": j.end_col,
                           "edits": [e.to_json() for e in j.edits]}
        return out


# -- history ---------------------------------------------------------------------------------
def _line_part(before: str, after: str) -> tuple[str, str]:
    """The start of the line an event begins on and the rest of the line it ends on."""
    head = before[max(before.rfind("\n"), before.rfind("\r")) + 1:]
    nl = after.find("\n")
    return head, after[:nl + 1] if nl >= 0 else after


def from_events(events: Sequence[Event], path_of=lambda uri: uri) -> list[HistoryItem]:
    """The language server's edit events (oldest first) as history items of whole lines;
    `path_of(uri)` names the file as the prompt shows it."""
    out = []
    for ev in events:
        head, tail = _line_part(ev.before, ev.after)
        out.append(HistoryItem(path_of(ev.uri), head + ev.old + tail, head + ev.new + tail))
    return out


def from_versions(old: str, new: str, path: str) -> list[HistoryItem]:
    """The changed hunks from `old` to `new` (a file before and after the recent edits) as
    history items, in file order (the last is taken as the latest). HistoryError when the two
    have no line in common (OLD is not an earlier version of the file); identical texts give []."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    if a and b and set(a).isdisjoint(b):
        raise HistoryError("the old version has no line in common with the file: it is not an earlier version of it")
    return [HistoryItem(path, "".join(a[i1:i2]), "".join(b[j1:j2]))
            for tag, i1, i2, j1, j2 in opcodes(a, b) if tag != "equal"]


# -- the prediction ------------------------------------------------------------------------------
def predict(engine: EngineClient, text: str, line: int, col: int, history: Sequence[HistoryItem], *,
            path: str, language: str | None = None, fmt: str = "auto", speculative: bool = True,
            doc_key: str = "_default", cancel: threading.Event | None = None, above: int = 3,
            below: int = 20, max_lines: int = 40, tree=None, chunks: Sequence[Chunk] = (),
            rename: bool = True, rename_first: bool = True, jumps: bool = True) -> NextEdit:
    """The next edit at (line, col) (0-based, col in characters) of `text`, the file at `path`,
    after the edits `history` (oldest first). `language` (an LSP languageId or grammar name;
    default: from the path) enables the syntax rules; `tree` is the text's parse when the caller
    has one; `chunks` are other files' snippets for a format that shows them (Sweep's). `rename`: a
    rename in the last edit is carried to the region's other places from the syntax tree
    (rename.py): before the model is asked when `rename_first` (milliseconds, exact, the engine's
    time saved), else only where the model's answer is dropped as untrained, malformed, too_long,
    no_change, syntax or unsure. `jumps` (with `rename`): a definition renamed or its parameters changed
    by the last edit (follow.py) also names the next place past the region in this file
    (`NextEdit.jump`, with its edit; the language server follows it through the workspace
    itself). PositionError for a position outside the text; EngineError from the engine."""
    offset = offset_at(text, line, col, exact=True)
    if is_binary(text):
        return NextEdit(dropped="binary")
    if not history:
        return NextEdit(dropped="no_history")
    lang = language_for(language, path)
    starts = line_starts(text)
    try:
        lo, hi = editable_region(text, line, above=above, below=below, max_lines=max_lines, language=lang,
                                 tree=tree, starts=starts)
    except RegionError:
        return NextEdit(region=(line, line + 1), dropped="too_long")
    a, b = starts[lo], starts[hi] if hi < len(starts) else len(text)
    region = text[a:b]
    adds_errors = _ErrorCheck(text, a, b, lang)
    if rename and rename_first:
        t0 = time.perf_counter()
        carried = _carried(text, a, b, offset, history, path, lang, tree, adds_errors)
        followed = _followed(text, path, lang, offset, history, lo, hi) if jumps else None
        if carried is not None:
            return NextEdit(edits=region_edits(region, carried, lo), region=(lo, hi), text=carried, source="rename",
                            total_ms=(time.perf_counter() - t0) * 1e3, jump=followed and followed[1])
        if followed is not None:
            return NextEdit(edits=followed[0], region=(lo, hi), source=followed[2], jump=followed[1],
                            total_ms=(time.perf_counter() - t0) * 1e3)
    # The models read and write \n: a \r\n file is shown to them with \n, and the answer gets
    # the file's line ends back (else every line of the region would differ by its end).
    crlf = "\r\n" in region
    lf = (lambda s: s.replace("\r\n", "\n")) if crlf else (lambda s: s)
    items = [HistoryItem(h.path, lf(h.old), lf(h.new)) for h in history]
    req = EditPrompt(tuple(items), path, lf(region), len(lf(region[:offset - a])),
                     lf(_tail_lines(text[max(0, a - CONTEXT_CHARS):a])), lf(_head_lines(text[b:b + CONTEXT_CHARS])),
                     tuple(chunks))
    c = engine.rewrite(req, fmt=fmt, doc_key=doc_key, speculative=speculative, cancel=cancel)
    got = NextEdit(region=(lo, hi), new_tokens=c.new_tokens, target_forwards=c.target_forwards,
                   accepted_per_forward=c.accepted_per_forward, total_ms=c.total_ms, speculative=c.speculative,
                   text=c.text, format=c.edit_format, confidence=c.confidence)
    new = c.text
    if not req.region.endswith("\n") and new.endswith("\n"):  # a region at a file end without a newline
        new = new[:-1]
    got.dropped = ("untrained" if c.stop_reason == StopReason.UNTRAINED else
                   _dropped(c.stop_reason, c.malformed, req.region, new, items[-1], path))
    if crlf:
        new = lf(new).replace("\n", "\r\n")
    if got.dropped is None and adds_errors(new):
        got.dropped = "syntax"
    if got.dropped in RENAME_AFTER and rename and not rename_first:  # (first: it was tried before the model)
        carried = _carried(text, a, b, offset, history, path, lang, tree, adds_errors)
        if carried is not None:
            got.model_dropped, got.dropped, got.source, got.text, new = got.dropped, None, "rename", carried, carried
    if got.dropped is None:
        got.edits = region_edits(region, new, lo)
    return got


def _followed(text: str, path: str, language: str | None, offset: int, history: Sequence[HistoryItem],
              lo: int, hi: int) -> tuple[list[TextEdit], Place | None, str] | None:
    """A change at a definition in the last edit, followed in this file (follow.py): the region's
    edits, the next place past it, the kind; None when there is none or nothing past the region."""
    ch = detect(text, path, offset, history, language)
    if ch is None:
        return None
    here = places(ch, path, text)
    later = [p for p in here if p.line >= hi or (p.line >= lo and not p.edits)] + [p for p in here if p.line < lo]
    if not later:
        return None
    return [e for p in here if lo <= p.line < hi and p.edits for e in p.edits], later[0], ch.kind


def _carried(text: str, a: int, b: int, offset: int, history: Sequence[HistoryItem], path: str,
             language: str | None, tree, adds_errors: _ErrorCheck) -> str | None:
    """The region text[a:b] with the last edit's rename carried on (rename.py), unless there is
    none or it would add parse errors."""
    carried = propagate(text, a, b, offset, history, path, language, tree)
    return None if carried is None or adds_errors(carried[0]) else carried[0]


def _dropped(stop_reason: StopReason, malformed: bool, region: str, new: str, last: HistoryItem, path: str) -> str | None:
    if stop_reason in (StopReason.CANCELLED, StopReason.SUPERSEDED):
        return "cancelled"
    if stop_reason == StopReason.UNSURE:
        return "unsure"
    if stop_reason in (StopReason.LENGTH, StopReason.CONTEXT):
        return "too_long"
    if malformed:
        return "malformed"
    if new == region:
        return "no_change"
    if last.path == path and _undoes(region, new, last):
        return "undo"
    return None


def _undoes(region: str, new: str, last: HistoryItem) -> bool:
    """Whether the rewrite turns the last edit's new text back into its old text: the new
    lines occur fewer times in it (when there are any) and the old lines more (likewise)."""
    if last.old == last.new:
        return False
    fewer = not last.new or new.count(last.new) < region.count(last.new)
    more = not last.old or new.count(last.old) > region.count(last.old)
    return fewer and more


class _ErrorCheck:
    """Whether the text with text[a:b] replaced by `new` parses with more errors than `text`
    (both parsed within SYNTAX_REACH of the region; the text's own count once, however many
    answers are checked). Never with no grammar for the language."""

    def __init__(self, text: str, a: int, b: int, language: str | None):
        self.text, self.a, self.b, self.language = text, a, b, language
        self.before: int | None = None

    def __call__(self, new: str) -> bool:
        if self.language is None:
            return False
        t, a, b = self.text, self.a, self.b
        after, _ = snapshot_around(t[:a] + new + t[b:], self.language, a, SYNTAX_REACH)
        if after.tree is None:
            return False
        if self.before is None:
            before, _ = snapshot_around(t, self.language, a, SYNTAX_REACH)
            self.before = -1 if before.tree is None else error_count(before.tree)
        return self.before >= 0 and error_count(after.tree) > self.before


def _tail_lines(s: str) -> str:
    """`s` from its first whole line (a context window never opens inside a line)."""
    i = s.find("\n")
    return s if i < 0 or len(s) < CONTEXT_CHARS else s[i + 1:]


def _head_lines(s: str) -> str:
    i = s.rfind("\n")
    return s if i < 0 or len(s) < CONTEXT_CHARS else s[:i + 1]
