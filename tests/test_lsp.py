"""End to end: the real `completer-lsp` process over stdio, driven by pytest-lsp, on the tiny
recipe pair (and on the embedded default pair once it is built)."""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from helpers.lsp import URI, inline, open_doc, start, tiny_options, type_text
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.asyncio
async def test_open_type_complete_feedback(client: LanguageClient, parrot_pair):
    res = await start(client, tiny_options(parrot_pair))  # it answers `1` everywhere (helpers/parrot.py)
    caps = res.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.text_document_sync.change == t.TextDocumentSyncKind.Incremental
    tokens = [tok for tok, reports in client.progress_reports.items()
              if any(isinstance(r, t.WorkDoneProgressEnd) for r in reports)]
    assert tokens, "model loading reports $/progress begin … end"

    open_doc(client)
    type_text(client, 9, 0, "    y = ", 2)
    got = await client.text_document_inline_completion_async(inline(9, 8))
    assert isinstance(got, t.InlineCompletionList)
    assert [(i.insert_text, i.range.start) for i in got.items] == [("1", t.Position(line=9, character=8))]
    stats = await client.protocol.send_request_async("completer/stats", {})
    shown, empty, chars = (getattr(stats, k, 0) for k in ("shown", "empty", "shown_chars"))  # counters start absent
    assert stats.engine_stats.requests == 1 and shown + empty == 1  # the engine ran: shown or empty
    assert (shown, chars) == (len(got.items), sum(len(i.insert_text) for i in got.items))

    # gated off: inside a comment, unknown document, a line past the end
    type_text(client, 9, 8, "1\n# a comment", 3)
    assert not (await client.text_document_inline_completion_async(inline(10, 5))).items
    assert not (await client.text_document_inline_completion_async(inline(0, 0, "file:///nope.py"))).items
    assert not (await client.text_document_inline_completion_async(inline(999, 0))).items

    client.protocol.notify("completer/feedback", {"uri": URI, "text": "z = 1", "accepted": True})
    client.protocol.notify("completer/feedback", {"uri": URI, "text": "abcd", "accepted": True,
                                                  "acceptedChars": 2})
    client.protocol.notify("completer/feedback", {"uri": URI, "text": "q", "accepted": False})
    client.protocol.notify("completer/feedback", {"uri": 3, "accepted": "yes"})  # ignored
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.engine == "ready"
    assert (stats.accepted, stats.rejected, stats.accepted_chars) == (2, 1, 7)
    assert stats.requests == 4 and stats.unknown_document == 1 and stats.bad_position == 1
    assert stats.kv_cached_documents == 1  # the document's KV cache, kept between requests

    client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=URI)))
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.kv_cached_documents == 0 and stats.documents == 0  # closing frees it


@pytest.mark.asyncio
async def test_bad_input_and_options(client: LanguageClient, tiny_pair):
    await start(client, tiny_options(tiny_pair, debounce_ms="soon", bogus=1, top_p=7.0))
    warnings = [m.message for m in client.messages if m.type == t.MessageType.Warning]
    assert len(warnings) == 3 and any("debounce_ms" in w for w in warnings)

    big = "x = 1\n" * (10 * 2**20 // 6)  # 10 MB: kept as text, never parsed
    open_doc(client, big, "file:///big.py")
    type_text(client, 5, 5, "  # é😀", 2, "file:///big.py")
    info = await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///big.py"})
    assert info.parsed is False and info.length == len(big) + 6
    got = await client.text_document_inline_completion_async(inline(2**20, 0, "file:///big.py"))
    assert isinstance(got, t.InlineCompletionList)

    open_doc(client, "x" * (16 * 2**20 + 1), "file:///huge.py")  # over the document limit: not kept, said
    assert await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///huge.py"}) is None
    assert any("file:///huge.py has 16777217 characters" in m.message for m in client.messages)

    open_doc(client, "abc\x00\x01\x02def\n", "file:///blob.bin", "binary")
    got = await client.text_document_inline_completion_async(inline(0, 3, "file:///blob.bin"))
    assert not got.items
    open_doc(client, "Dear diary,\n", "file:///notes.txt", "plaintext")
    got = await client.text_document_inline_completion_async(inline(1, 0, "file:///notes.txt"))
    assert isinstance(got, t.InlineCompletionList)
    # an edit range past the end and a reversed range: clamped like editors do, never fatal
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri="file:///notes.txt", version=2),
        content_changes=[t.TextDocumentContentChangePartial(
            range=t.Range(start=t.Position(line=50, character=3), end=t.Position(line=0, character=99)),
            text="!")]))
    info = await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///notes.txt"})
    assert info.length == len("Dear diary,!")
    with pytest.raises(JsonRpcException):
        await client.protocol.send_request_async("completer/documentInfo", {"uri": 5})
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.documents == 3
    # an edit that takes a document over the limit closes it (said once more), the rest stay
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri="file:///big.py", version=3),
        content_changes=[t.TextDocumentContentChangeWholeDocument(text="y" * (16 * 2**20 + 1))]))
    assert await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///big.py"}) is None
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.documents == 2 and stats.too_large == 2


def _utf16_offset(text: str, line: int, ch: int) -> int:
    """Reference conversion, independent of completer.documents: \\n, \\r\\n and \\r end lines."""
    i = 0
    for _ in range(line):
        j = min([k for k in (text.find("\n", i), text.find("\r", i)) if k >= 0], default=-1)
        if j < 0:
            return len(text)
        i = j + (2 if text.startswith("\r\n", j) else 1)
    units = 0
    while i < len(text) and text[i] not in "\r\n":
        w = 2 if ord(text[i]) > 0xFFFF else 1
        if units + w > ch:
            break
        units += w
        i += 1
    return i


def _utf16_position(text: str, off: int) -> tuple[int, int]:
    head = text[:off].replace("\r\n", "\n").replace("\r", "\n")
    line = head.count("\n")
    last = head[head.rfind("\n") + 1:]
    return line, sum(2 if ord(c) > 0xFFFF else 1 for c in last)


@pytest.mark.asyncio
async def test_random_incremental_edits_match_client(client: LanguageClient, tiny_pair):
    await start(client, tiny_options(tiny_pair, warmup=False))
    rng = random.Random(5)
    pieces = ["a", "bc", " ", "\n", "\r\n", "\r", "é", "😀", "中文", "\t", "()", "def f():\n    "]
    docs = {"file:///r.txt": ("plaintext", 10_000), "file:///r.py": ("python", 300)}
    for uri, (lang, n_edits) in docs.items():
        text = "start\n"
        open_doc(client, text, uri, lang)
        changes = []
        for v in range(n_edits):
            a = rng.randrange(len(text) + 1)
            b = min(len(text), a + rng.choice([0, 0, 1, 2, 5]))
            new = "".join(rng.choice(pieces) for _ in range(rng.choice([0, 1, 1, 2])))
            if len(text) > 1500:
                b, new = min(len(text), a + 40), ""  # keep the document small
            (l1, c1), (l2, c2) = _utf16_position(text, a), _utf16_position(text, b)
            # a position between \r and \n means the line end, as for the server
            a2, b2 = _utf16_offset(text, l1, c1), _utf16_offset(text, l2, c2)
            changes.append(t.TextDocumentContentChangePartial(
                range=t.Range(start=t.Position(line=l1, character=c1), end=t.Position(line=l2, character=c2)),
                text=new))
            text = text[:a2] + new + text[b2:]
            if len(changes) == 20 or v == n_edits - 1:  # one didChange carries several edits, in order
                client.text_document_did_change(t.DidChangeTextDocumentParams(
                    text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=v + 2),
                    content_changes=changes))
                changes = []
        info = await client.protocol.send_request_async("completer/documentInfo", {"uri": uri})
        assert info.sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest(), uri
        assert info.version == n_edits + 1


@pytest.mark.asyncio
async def test_default_pair_completes(client: LanguageClient):
    await start(client, {"max_new_tokens": 24, "debounce_ms": 0, "device": "cpu"})
    # a position where the small embedded pair writes something that parses (examples/stack.py)
    open_doc(client, (ROOT / "examples" / "stack.py").read_text())
    got = await client.text_document_inline_completion_async(inline(7, 19))
    assert got.items and got.items[0].insert_text.strip()
