"""completer/edits/history.py: edit sequences → the edit events they coalesce into (tables), the
bounds under random edits, the work a 1 MB line costs (counted), and didChange through the real
`completer-lsp` process showing up in `completer/stats`."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

from completer.documents import Document
from completer.edits import history as h
from completer.edits.history import Change, EditHistory, change_from_lsp

ROOT = Path(__file__).resolve().parents[1]
A, B = "file:///a.py", "file:///b.py"
TEXT = "".join(f"line {i}\n" for i in range(40))


def run(steps, docs=None):
    """Apply `steps` — (uri, seconds, Change | whole new text) — to `docs` (uri → text, TEXT by
    default) through one EditHistory; returns (history, final texts)."""
    docs = dict(docs or {A: TEXT, B: TEXT})
    hist = EditHistory()
    for uri, now, change in steps:
        old = docs[uri]
        hist.record(uri, old, change, now)
        docs[uri] = change if isinstance(change, str) else old[:change.start] + change.text + old[change.end:]
    return hist, docs


def typed(uri, at, word, t0=0.0, dt=0.1):
    """Typing `word` one char at a time from offset `at`."""
    return [(uri, t0 + i * dt, Change(at + i, at + i, ch)) for i, ch in enumerate(word)]


def backspaces(uri, at, n, t0=0.0, dt=0.1):
    """n backspaces from offset `at` (the cursor) leftwards."""
    return [(uri, t0 + i * dt, Change(at - i - 1, at - i, "")) for i in range(n)]


def summary(hist):
    return [(e.uri, e.old, e.new) for e in hist.recent(100, 10**9)]


L5 = TEXT.index("line 5\n") + len("line 5")  # end of line 5 (before its \n)
L30 = TEXT.index("line 30\n")

CASES = {
    "typing a word is one event": (typed(A, L5, " = 1"), [(A, "", " = 1")]),
    "a pause splits": (typed(A, L5, "ab") + typed(A, L5 + 2, "cd", t0=5.0), [(A, "", "ab"), (A, "", "cd")]),
    "a jump splits": (typed(A, L5, "ab") + typed(A, L30, "cd", t0=0.3), [(A, "", "ab"), (A, "", "cd")]),
    "a nearby line joins (within JUMP_LINES)": (
        typed(A, L5, "ab") + typed(A, L5 + 8, "cd", t0=0.3), [(A, "\nline ", "ab\nline cd")]),
    "typing leftwards (home, then type) joins": (
        typed(A, L5, "b") + typed(A, L5, "a", t0=0.2), [(A, "", "ab")]),
    "two documents interleaved": (
        typed(A, L5, "ab") + typed(B, L5, "x", t0=0.3) + typed(A, L5 + 2, "c", t0=0.4),
        [(A, "", "ab"), (B, "", "x"), (A, "", "c")]),
    "delete + retype": (backspaces(A, L5, 6) + typed(A, L5 - 6, "row 5", t0=0.7), [(A, "line 5", "row 5")]),
    "delete + retype the same text cancels": (backspaces(A, L5, 2) + typed(A, L5 - 2, " 5", t0=0.3), []),
    "typing then backspacing it all cancels": (typed(A, L5, "abc") + backspaces(A, L5 + 3, 3, t0=0.4), []),
    "undo after a pause cancels the event it undoes": (
        typed(A, L5, "abc") + [(A, 5.0, Change(L5, L5 + 3, ""))] + typed(B, 0, "z", t0=5.1), [(B, "", "z")]),
    "undo restores the whole text (a full-text change)": (
        typed(A, L5, "abc") + [(A, 0.5, TEXT)], []),
    "a selection replaced": ([(A, 0.0, Change(L5 - 1, L5, "five"))], [(A, "5", "five")]),
    "an empty change records nothing": ([(A, 0.0, Change(3, 3, ""))], []),
    "a full-text change finds its span": ([(A, 0.0, TEXT.replace("line 7", "line seven"))], [(A, "7", "seven")]),
}


@pytest.mark.parametrize("name", CASES)
def test_coalescing(name):
    steps, want = CASES[name]
    hist, _ = run(steps)
    assert summary(hist) == want


def test_event_diff_has_context_and_region():
    hist, _ = run(typed(A, L5, " = 1"))
    (ev,) = hist.recent()
    assert ev.before.endswith("line 2\nline 3\nline 4\nline 5") and ev.after == "\nline 6\nline 7\nline 8\n"
    assert ev.diff.splitlines() == [
        f"--- {A}", f"+++ {A}", "@@ -1,7 +1,7 @@", " line 2", " line 3", " line 4", "-line 5", "+line 5 = 1",
        " line 6", " line 7", " line 8"]


def test_crlf_document():
    """Line breaks are \r\n: the jump counts them as lines, the diff shows lines without \r."""
    text = TEXT.replace("\n", "\r\n")
    at = text.index("line 5\r\n") + len("line 5")
    near = text.index("line 7\r\n") + 2  # after "ab": 2 line breaks from the region, joins
    far = text.index("line 12\r\n") + 3  # after "abc": 4 line breaks from it, a jump
    hist, _ = run(typed(A, at, "ab") + typed(A, near, "c", t0=0.3) + typed(A, far, "d", t0=0.4), {A: text})
    events = hist.recent()
    assert [(e.old, e.new) for e in events] == [("\r\nline 6\r\n", "ab\r\nline 6\r\nc"), ("", "d")]
    assert events[0].diff.splitlines()[2:] == ["@@ -1,9 +1,9 @@", " line 2", " line 3", " line 4", "-line 5",
                                               "+line 5ab", " line 6", "-line 7", "+cline 7", " line 8", " line 9",
                                               " line 10"]
    assert "\r" not in events[0].diff


def test_recent_is_bounded_and_newest_last():
    steps = [s for i in range(10) for s in typed(A, TEXT.index(f"line {3 * i}\n"), f"w{i}", t0=2.0 * i)]
    hist, _ = run(steps)
    assert len(hist) == 10
    assert [e.new for e in hist.recent(3)] == ["w7", "w8", "w9"]
    budget = sum(len(e.diff) for e in hist.recent(2))
    assert [e.new for e in hist.recent(10, budget)] == ["w8", "w9"]
    assert hist.recent(10, len(hist.recent(1)[0].diff) - 1) == []  # the newest does not fit: nothing


def test_forget_drops_a_documents_events_only():
    hist, _ = run(typed(A, L5, "ab") + typed(B, L5, "x", t0=0.3) + typed(A, L5 + 2, "c", t0=0.4))
    hist.forget(A)
    assert summary(hist) == [(B, "", "x")]
    hist.forget("file:///never.py")
    assert len(hist) == 1


def test_bounds_hold_under_random_edits():
    rng = random.Random(0)
    text, hist, now = TEXT * 5, EditHistory(), 0.0
    for _ in range(10_000):
        uri = rng.choice([A, B, "file:///c.py"])
        s = rng.randrange(len(text) + 1)
        e = min(len(text), s + rng.choice([0, 0, 1, 3, 50]))
        ins = rng.choice(["", "x", "ab\n", "\r\n", "é😀", "y" * rng.choice([1, 5000, 20_000])])
        now += rng.choice([0.05, 0.05, 0.5, 3.0])
        hist.record(uri, text, Change(s, e, ins), now)
        text = text[:s] + ins + text[e:]
        if len(text) > 200_000:
            text = TEXT * 5
        assert len(hist) <= h.MAX_EVENTS + 1
        for ev in ([hist.open] if hist.open else []):
            assert len(ev.old) <= h.MAX_EVENT_CHARS and len(ev.new) <= h.MAX_EVENT_CHARS
    held = [*hist.events, *([hist.open] if hist.open else [])]
    assert len(held) == len(hist) == h.MAX_EVENTS + (hist.open is not None)
    limit = 2 * h.MAX_EVENT_CHARS + 40  # a clipped text: both halves and the marker line
    assert all(len(ev.old) <= limit and len(ev.new) <= limit for ev in held)
    assert all(len(ev.before) <= h.CONTEXT_CHARS and len(ev.after) <= h.CONTEXT_CHARS for ev in held)
    assert sum(len(e.diff) for e in hist.recent(8, 5000)) <= 5000


class Counted(str):
    """A text that counts the chars its slices, searches and counts cover."""
    work = 0

    def __getitem__(self, k):
        out = str.__getitem__(self, k)
        Counted.work += len(out) if isinstance(k, slice) else 1
        return out

    def _span(self, args):
        lo, hi = (list(args[1:]) + [0, len(self)])[:2] if len(args) > 1 else (0, len(self))
        Counted.work += max(0, min(hi, len(self)) - lo)

    def find(self, *a):
        self._span(a)
        return str.find(self, *a)

    def rfind(self, *a):
        self._span(a)
        return str.rfind(self, *a)

    def count(self, *a):
        self._span(a)
        return str.count(self, *a)


def test_a_1mb_line_stays_cheap():
    """Typing, jumping and deleting in a 1 MB line touches a few KB per edit, not the line."""
    line = "x = [" + "1, " * 350_000 + "]\n"
    hist, text = EditHistory(), line
    for i, (at, ins, n) in enumerate([(500_000, "a", 0), (500_001, "b", 0), (900_000, "c", 0), (10, "", 3)]):
        Counted.work = 0
        hist.record(A, Counted(text), Change(at, at + n, ins), 0.1 * i)
        assert Counted.work < 4 * h.JUMP_CHARS + 4 * h.CONTEXT_CHARS + 100, (i, Counted.work)
        text = text[:at] + ins + text[at + n:]
    assert [(e.old, e.new) for e in hist.recent()] == [("", "ab"), ("", "c"), (" 1,", "")]
    assert all(len(e.diff) < 4 * h.CONTEXT_CHARS + 200 for e in hist.recent())  # the line, twice, clipped


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8", "utf-32"])
def test_change_from_lsp_uses_the_documents_encoding(encoding):
    doc = Document(A, "a😀b\nc\n", "python", encoding=encoding)
    col = {"utf-16": 3, "utf-8": 5, "utf-32": 2}[encoding]  # just after the emoji
    assert change_from_lsp(doc, ((0, col), (0, col + 1)), "B") == Change(2, 3, "B")
    assert change_from_lsp(doc, ((1, 1), (0, col)), "") == Change(2, 5, "")  # reversed: the same span
    assert change_from_lsp(doc, None, "new") == "new"




@pytest.mark.slow
@pytest.mark.asyncio
async def test_did_change_shows_in_stats(client: LanguageClient, tiny_pair):
    """Through the real server: typing a word, then a jump, then another document: 3 events."""
    target, draft = tiny_pair
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        initialization_options={"target": str(target), "draft": str(draft), "device": "cpu", "warmup": False}))
    for uri in (A, B):
        client.text_document_did_open(t.DidOpenTextDocumentParams(
            text_document=t.TextDocumentItem(uri=uri, language_id="python", version=1, text=TEXT)))
    version = 1

    def type_at(uri, line, col, text):
        nonlocal version
        version += 1
        at = t.Position(line=line, character=col)
        client.text_document_did_change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text=text)]))

    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.edit_events == 0
    for i, ch in enumerate("abc"):
        type_at(A, 5, 6 + i, ch)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.edit_events == 1
    type_at(A, 30, 0, "x")
    type_at(B, 0, 0, "y")
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.edit_events == 3
    client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=A)))
    await asyncio.sleep(0)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.edit_events == 3 and stats.documents == 1  # a closed document keeps its past events
