"""End to end: the real `completer-lsp` process over stdio, driven by pytest-lsp, on the tiny
recipe pair (and on the embedded default pair once it is built)."""
from __future__ import annotations

import asyncio
import hashlib
import random
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

ROOT = Path(__file__).resolve().parents[1]
SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "lsp.server"],
                            server_env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                                        "PYTHONPATH": str(ROOT)})
URI = "file:///tmp/example.py"
SOURCE = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = add(1, 2)\n"


async def _start(client: LanguageClient, options: dict) -> t.InitializeResult:
    res = await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=options))
    for _ in range(600):  # the engine loads in the background after `initialized`
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine != "loading" and stats.engine != "not loaded":
            break
        await asyncio.sleep(0.05)
    return res


def _tiny_options(tiny_pair, **extra) -> dict:
    target, draft = tiny_pair
    return {"target": str(target), "draft": str(draft), "max_new_tokens": 8, "debounce_ms": 0,
            "device": "cpu", **extra}


@pytest_lsp.fixture(config=SERVER)
async def client(lsp_client: LanguageClient):
    yield
    await lsp_client.shutdown_session()


def _open(client: LanguageClient, text: str = SOURCE, uri: str = URI, language: str = "python") -> None:
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))


def _type(client: LanguageClient, line: int, col: int, text: str, version: int, uri: str = URI) -> None:
    at = t.Position(line=line, character=col)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text=text)]))


def _inline(line: int, col: int, uri: str = URI) -> t.InlineCompletionParams:
    return t.InlineCompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=line, character=col),
        context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic))


@pytest.mark.asyncio
async def test_open_type_complete_feedback(client: LanguageClient, tiny_pair):
    res = await _start(client, _tiny_options(tiny_pair))
    caps = res.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.text_document_sync.change == t.TextDocumentSyncKind.Incremental
    tokens = [tok for tok, reports in client.progress_reports.items()
              if any(isinstance(r, t.WorkDoneProgressEnd) for r in reports)]
    assert tokens, "model loading reports $/progress begin … end"

    _open(client)
    _type(client, 9, 0, "    y = ", 2)
    got = await client.text_document_inline_completion_async(_inline(9, 8))
    assert isinstance(got, t.InlineCompletionList)
    for item in got.items:  # the tiny pair may well propose nothing worth showing
        assert item.range.start == t.Position(line=9, character=8)
        assert "\n" not in item.insert_text  # mid-statement: single line

    # gated off: inside a comment, unknown document, a line past the end
    _type(client, 9, 8, "1\n# a comment", 3)
    assert not (await client.text_document_inline_completion_async(_inline(10, 5))).items
    assert not (await client.text_document_inline_completion_async(_inline(0, 0, "file:///nope.py"))).items
    assert not (await client.text_document_inline_completion_async(_inline(999, 0))).items

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
async def test_cancel_and_supersede(client: LanguageClient, tiny_pair):
    await _start(client, _tiny_options(tiny_pair, debounce_ms=300, max_new_tokens=32))
    _open(client)
    # $/cancelRequest during the debounce: the request ends with RequestCancelled
    fut = client.protocol.send_request(t.TEXT_DOCUMENT_INLINE_COMPLETION, _inline(8, 11), msg_id="c1")
    client.protocol.notify(t.CANCEL_REQUEST, t.CancelParams(id="c1"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wrap_future(fut)
    assert err.value.code == t.LSPErrorCodes.RequestCancelled
    # a newer request for the same document supersedes the older: it answers empty
    first = client.text_document_inline_completion_async(_inline(8, 11))
    await asyncio.sleep(0.05)
    second = client.text_document_inline_completion_async(_inline(8, 11))
    a, b = await asyncio.gather(first, second)
    assert not a.items
    assert isinstance(b, t.InlineCompletionList)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.cancelled == 1 and stats.superseded >= 1


@pytest.mark.asyncio
async def test_bad_input_and_options(client: LanguageClient, tiny_pair):
    await _start(client, _tiny_options(tiny_pair, debounce_ms="soon", bogus=1, top_p=7.0))
    warnings = [m.message for m in client.messages if m.type == t.MessageType.Warning]
    assert len(warnings) == 3 and any("debounce_ms" in w for w in warnings)

    big = "x = 1\n" * (10 * 2**20 // 6)  # 10 MB: kept as text, never parsed
    _open(client, big, "file:///big.py")
    _type(client, 5, 5, "  # é😀", 2, "file:///big.py")
    info = await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///big.py"})
    assert info.parsed is False and info.length == len(big) + 6
    got = await client.text_document_inline_completion_async(_inline(2**20, 0, "file:///big.py"))
    assert isinstance(got, t.InlineCompletionList)

    _open(client, "abc\x00\x01\x02def\n", "file:///blob.bin", "binary")
    got = await client.text_document_inline_completion_async(_inline(0, 3, "file:///blob.bin"))
    assert not got.items
    _open(client, "Dear diary,\n", "file:///notes.txt", "plaintext")
    got = await client.text_document_inline_completion_async(_inline(1, 0, "file:///notes.txt"))
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
    await _start(client, _tiny_options(tiny_pair, warmup=False))
    rng = random.Random(5)
    pieces = ["a", "bc", " ", "\n", "\r\n", "\r", "é", "😀", "中文", "\t", "()", "def f():\n    "]
    docs = {"file:///r.txt": ("plaintext", 10_000), "file:///r.py": ("python", 300)}
    for uri, (lang, n_edits) in docs.items():
        text = "start\n"
        _open(client, text, uri, lang)
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


DEFAULT = ROOT / "draft_models" / "default"


@pytest.mark.asyncio
@pytest.mark.skipif(not (DEFAULT / "target" / "config.json").exists(),
                    reason="the embedded default pair (draft_models/default/target) is not built yet")
async def test_default_pair_completes(client: LanguageClient):
    await _start(client, {"max_new_tokens": 24, "debounce_ms": 0, "device": "cpu"})
    # a position where the small embedded pair writes something that parses (examples/stack.py)
    _open(client, (ROOT / "examples" / "stack.py").read_text())
    got = await client.text_document_inline_completion_async(_inline(7, 19))
    assert got.items and got.items[0].insert_text.strip()
