"""End to end: the real `completer-lsp` process over stdio, driven by pytest-lsp, on the tiny
recipe pair (and on the embedded default pair once it is built)."""
from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

ROOT = Path(__file__).resolve().parents[1]
SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "lsp.server"],
                            server_env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"],
                                        "PYTHONPATH": str(ROOT)})
URI = "file:///tmp/example.py"
SOURCE = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = add(1, 2)\n"


async def _start(client: LanguageClient, options: dict) -> t.InitializeResult:
    res = await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=options))
    end = time.monotonic() + 120  # the engine loads in the background after `initialized` (a loaded
    while time.monotonic() < end:  # machine: 30 s were not always enough)
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
    stats = await client.protocol.send_request_async("completer/stats", {})
    shown, empty, chars = (getattr(stats, k, 0) for k in ("shown", "empty", "shown_chars"))  # counters start absent
    assert stats.engine_stats.requests == 1 and shown + empty == 1  # the engine ran: shown or empty
    assert (shown, chars) == (len(got.items), sum(len(i.insert_text) for i in got.items))

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

    _open(client, "x" * (16 * 2**20 + 1), "file:///huge.py")  # over the document limit: not kept, said
    assert await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///huge.py"}) is None
    assert any("file:///huge.py has 16777217 characters" in m.message for m in client.messages)

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




@pytest.mark.asyncio
async def test_default_pair_completes(client: LanguageClient):
    await _start(client, {"max_new_tokens": 24, "debounce_ms": 0, "device": "cpu"})
    # a position where the small embedded pair writes something that parses (examples/stack.py)
    _open(client, (ROOT / "examples" / "stack.py").read_text())
    got = await client.text_document_inline_completion_async(_inline(7, 19))
    assert got.items and got.items[0].insert_text.strip()


@pytest.mark.asyncio
async def test_tokens_spent_on_a_dropped_completion_are_counted(client: LanguageClient):
    # held-out asyncio code where the embedded pair writes `_check_check_check…`
    # (tests/test_degenerate.py): the degenerate rule drops it, and the stats say what it cost
    from test_degenerate import degenerate_place

    await _start(client, {"max_new_tokens": 64, "debounce_ms": 0, "device": "cpu"})
    text, off = degenerate_place()
    _open(client, text)
    line = text[:off].count("\n")
    got = await client.text_document_inline_completion_async(_inline(line, off - text.rfind("\n", 0, off) - 1))
    assert not got.items
    stats = await _stats(client)
    assert stats.empty == 1 and stats.dropped_degenerate == 1 and stats.wasted_tokens > 0


def _stack_source() -> str:
    return (ROOT / "examples" / "stack.py").read_text()


async def _stats(client: LanguageClient):
    return await client.protocol.send_request_async("completer/stats", {})


@pytest.mark.asyncio
async def test_request_before_the_engine_is_ready_waits_for_it(client: LanguageClient):
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        initialization_options={"max_new_tokens": 24, "debounce_ms": 0, "device": "cpu"}))
    _open(client, _stack_source())  # at once: the models are still loading
    # a waiting request ends on $/cancelRequest, and when a newer one for its document comes
    fut = client.protocol.send_request(t.TEXT_DOCUMENT_INLINE_COMPLETION, _inline(7, 19), msg_id="w1")
    client.protocol.notify(t.CANCEL_REQUEST, t.CancelParams(id="w1"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wrap_future(fut)
    assert err.value.code == t.LSPErrorCodes.RequestCancelled
    older = client.text_document_inline_completion_async(_inline(7, 19))
    older, got = await asyncio.gather(older, client.text_document_inline_completion_async(_inline(7, 19)))
    assert not older.items
    assert got.items and got.items[0].insert_text.strip()  # the newest one is answered once ready
    stats = await _stats(client)
    assert (stats.waited_for_engine, stats.cancelled, stats.superseded) == (3, 1, 1)
    assert stats.loads == 1 and stats.engine == "ready"
    # $/progress: begin at 0 %, reports with rising percentages up to 100 %, end
    (reports,) = [r for tok, r in client.progress_reports.items() if str(tok).startswith("completer/load-models")]
    assert isinstance(reports[0], t.WorkDoneProgressBegin) and reports[0].percentage == 0
    assert isinstance(reports[-1], t.WorkDoneProgressEnd) and reports[-1].message == "ready"
    percent = [r.percentage for r in reports[1:-1]]
    assert percent and percent == sorted(percent) and percent[-1] == 100


@pytest.mark.asyncio
async def test_enable_and_configuration_changes(client: LanguageClient, tiny_pair):
    await _start(client, _tiny_options(tiny_pair, enable=False, warmup=False))
    _open(client)
    for _ in range(3):
        assert not (await client.text_document_inline_completion_async(_inline(9, 0))).items
    stats = await _stats(client)
    assert (stats.requests, stats.disabled, stats.loads) == (3, 3, 1)
    assert not stats.gate_reasons and stats.engine_stats.requests == 0  # the engine was never asked

    # an LSP-only option: applied at once, no reload
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"enable": True, "max_lines": 4}}))
    got = await client.text_document_inline_completion_async(_inline(9, 0))
    assert isinstance(got, t.InlineCompletionList)
    stats = await _stats(client)
    assert (stats.requests, stats.disabled, stats.loads) == (4, 3, 1)
    assert sum(stats.gate_reasons._asdict().values()) == 1  # the engine path ran

    # flat settings with an invalid value: one warning naming it, the rest applied
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"debounce_ms": "soon", "enable": False}))
    assert not (await client.text_document_inline_completion_async(_inline(9, 0))).items
    stats = await _stats(client)
    assert (stats.disabled, stats.loads) == (4, 1)
    assert any("debounce_ms" in m.message and m.type == t.MessageType.Warning for m in client.messages)

    # an option that needs new models: reloaded in the background, said once, requests wait
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"enable": True, "drafter": "ngram"}}))
    got = await client.text_document_inline_completion_async(_inline(9, 0))
    assert isinstance(got, t.InlineCompletionList)
    stats = await _stats(client)
    assert stats.loads == 2 and stats.engine == "ready" and stats.engine_stats.config.drafter == "ngram"
    assert [m.message for m in client.messages if "reloading" in m.message] == [
        "completer: reloading the engine for the new drafter"]


def _serve(port: int = 0) -> tuple[subprocess.Popen, int]:
    """A real `completer serve` (the embedded pair) and its port, once it is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline().decode()
    port = int(re.search(r":(\d+)/ws", line).group(1))
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"completer serve did not get ready: {line}")


@pytest.mark.asyncio
async def test_engine_error_is_shown_once(client: LanguageClient):
    engine, port = _serve()
    try:
        await _start(client, {"engine": f"ws://127.0.0.1:{port}", "engine_retries": 0, "debounce_ms": 0,
                              "max_new_tokens": 24})
        _open(client, _stack_source())
        assert (await client.text_document_inline_completion_async(_inline(7, 19))).items
        engine.kill()  # the engine goes away: each request fails with EngineError("unavailable")
        engine.wait()
        for _ in range(3):
            assert not (await client.text_document_inline_completion_async(_inline(7, 19))).items
        stats = await _stats(client)
        assert stats.engine_errors == 3 and stats.engine_error.startswith("unavailable: ")
        shown = [m for m in client.messages if "unavailable" in m.message]
        assert len(shown) == 1 and shown[0].type == t.MessageType.Warning
        engine, _ = _serve(port)  # back: the next request reconnects, the state clears
        assert (await client.text_document_inline_completion_async(_inline(7, 19))).items
        stats = await _stats(client)
        assert stats.engine_error is None and stats.engine == "ready"
        assert [m.message for m in client.messages if m.type == t.MessageType.Info] == ["completer: engine back"]
    finally:
        engine.kill()


@pytest.mark.asyncio
async def test_failed_load_is_said_once_and_completions_stay_off(client: LanguageClient):
    # a model that is not there: no retry fixes it (an engine that is down is kept: test_remote_lsp.py)
    await _start(client, {"target": str(ROOT / "no-such-model"), "debounce_ms": 0})
    _open(client)
    for _ in range(2):
        assert not (await client.text_document_inline_completion_async(_inline(9, 0))).items
    stats = await _stats(client)
    assert stats.engine.startswith("failed: ") and stats.engine_failed == 2
    errors = [m.message for m in client.messages if m.type == t.MessageType.Error]
    assert len(errors) == 1 and "completions are off" in errors[0]
