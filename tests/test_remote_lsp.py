"""The real language server (`completer-lsp --engine llamacpp:http://…`, LSP over stdio) on a real
llama-server serving the embedded target as GGUF: a hole in real code completes, the in-loop stop
and a newer keystroke stop the server's generation, the server killed mid-stream is one clear
message with the language server alive and completing again once the server is back, and the
API key is required and sent."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from helpers.llama import LlamaServer
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

from completer.remote.llamacpp import LlamaCpp

ROOT = Path(__file__).resolve().parents[1]
# Real code: the head of completer/documents.py (after its docstring). The embedded pair was trained
# on a FIM layout llama.cpp's /infill does not write (ours ends the prompt at the cursor:
# `<fim_suffix> s <fim_middle> p`), so through /infill it writes little that survives
# post-processing: holes are tried until one shows.
_DOCUMENTS = (ROOT / "completer" / "documents.py").read_text()
SOURCE = "\n".join(_DOCUMENTS[_DOCUMENTS.index('"""', 3) + 4:].split("\n")[:60]) + "\n"
# Every test here needs llama-server: without one they skip (fail under CI) before the `client`
# fixture starts a language server (llama_bin is session-scoped, so it is set up first).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("llama_bin")]
# Counted asserts the model keeps extending (the second build closes an open list of numbers within
# 16 tokens): a long stream to cut, independent of SOURCE (whose text changes whenever documents.py
# does; its tail once ended the stream after 5-17 tokens).
# at the top level the third build, through llama-server's /infill, writes a whole new class (its
# training's repository samples start with a path comment): a stream long enough to supersede
# a long completion through llama-server on the embedded pair (its fourth build writes ~265 tokens here
# before the syntax stop or the length; a retrain may move it: try top-level patterns for one)
TOP_LEVEL = "".join(f"VALUE_{i}_NAME = 'value number {i}'\n" for i in range(40))
HOLES = [(i, m.end()) for i, ln in enumerate(SOURCE.split("\n"))  # (line, column): the rest of the line goes
         for m in [re.search(r"(= |return |\()", ln)] if m]


def with_hole(line: int, col: int) -> str:
    lines = SOURCE.split("\n")
    lines[line] = lines[line][:col]
    return "\n".join(lines)


async def _start(client: LanguageClient, url: str, **options) -> dict:
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        # no prefetch: these tests count the server's tokens, and a prefetch is a request of its own
        initialization_options={"engine": f"llamacpp:{url}", "debounce_ms": 0, "engine_retries": 1,
                                "engine_timeout_ms": 5000, "prefetch": False, **options}))
    for _ in range(600):  # the engine connects in the background after `initialized`
        stats = await _stats(client)
        if stats["engine"] not in ("loading", "not loaded"):
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError("the engine never left 'loading'")


async def _stats(client: LanguageClient) -> dict:
    r = await client.protocol.send_request_async("completer/stats", {})
    return {k: getattr(r, k) for k in dir(r) if not k.startswith("_")}


def _open(client: LanguageClient, uri: str, text: str) -> None:
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


async def _complete(client: LanguageClient, uri: str, line: int, col: int) -> list[t.InlineCompletionItem]:
    got = await client.text_document_inline_completion_async(t.InlineCompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=line, character=col),
        context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Invoked)))
    return list(got.items) if got else []


@pytest.mark.asyncio
async def test_holes_complete_and_the_stop_saves_tokens(client: LanguageClient, llama):
    stats = await _start(client, llama.url, max_new_tokens=200)
    assert stats["engine"] == "ready"
    line, col = HOLES[0]  # without the stop, llama-server generates all 200 tokens here
    text = with_hole(line, col)
    offset = sum(len(x) + 1 for x in text.split("\n")[:line]) + col
    full = LlamaCpp(llama.url).complete(text[:offset], text[offset:offset + 300], doc_key="direct", max_new=200)
    assert full.new_tokens == 200
    shown, before = [], llama.predicted_total()
    for i, (line, col) in enumerate(HOLES):
        uri = f"file:///tmp/hole{i}.py"
        _open(client, uri, with_hole(line, col))
        for item in await _complete(client, uri, line, col):
            assert item.range.start == t.Position(line=line, character=col) and "\n" not in item.insert_text
            shown.append(item.insert_text)
    assert shown, "no hole completed"
    generated = llama.predicted_total() - before
    assert generated < 200 * len(HOLES) // 2, f"{generated} tokens generated for {len(HOLES)} one-line holes"
    stats = await _stats(client)
    assert stats["engine_error"] is None and stats["kv_cached_documents"] == 4  # one per server slot (-np 4)


@pytest.mark.asyncio
async def test_a_keystroke_cancels_the_older_request(client: LanguageClient, llama):
    await _start(client, llama.url, max_new_tokens=300, stop_degenerate=False)
    text = TOP_LEVEL
    line, col = text.count("\n"), 0
    _open(client, "file:///tmp/alone.py", text)
    before = llama.predicted_total()
    await _complete(client, "file:///tmp/alone.py", line, col)
    alone = llama.predicted_total() - before
    assert alone > 100
    _open(client, "file:///tmp/supersede.py", text)
    before = llama.predicted_total()
    first = asyncio.ensure_future(_complete(client, "file:///tmp/supersede.py", line, col))
    await asyncio.sleep(0.05)  # the first request is streaming by now
    second = asyncio.ensure_future(_complete(client, "file:///tmp/supersede.py", line, col))
    a, _ = await asyncio.gather(first, second)
    assert a == []  # superseded
    both = llama.predicted_total() - before
    assert both < 2 * alone - 20, f"the superseded request was not cut: {both} tokens for two requests"


@pytest.mark.asyncio
async def test_server_killed_mid_stream_then_back(client: LanguageClient, llama_bin):
    binary, gguf = llama_bin
    s = LlamaServer(binary, gguf).start()
    try:
        await _start(client, s.url, max_new_tokens=400)
        uri = "file:///tmp/killed.py"
        text = TOP_LEVEL
        line, col = text.count("\n"), 0
        _open(client, uri, text)
        pending = asyncio.ensure_future(_complete(client, uri, line, col))
        await asyncio.sleep(0.1)
        s.kill()
        assert await pending == []  # killed mid-stream, or before: an empty answer either way
        assert await _complete(client, uri, line, col) == []
        stats = await _stats(client)  # alive, and the error is there
        assert stats["engine"] == "ready" and "unavailable" in stats["engine_error"] and s.url in stats["engine_error"]
        shown = [m.message for m in client.messages if "unavailable" in m.message]
        assert len(shown) == 1 and s.url in shown[0]  # one message, however many requests failed
        s.start()
        before = s.predicted_total()
        await _complete(client, uri, line, col)
        assert s.predicted_total() > before  # the same language server completes again
        assert (await _stats(client))["engine_error"] is None
    finally:
        s.kill()


@pytest.mark.asyncio
async def test_server_down_at_start_then_up(client: LanguageClient, llama_bin):
    binary, gguf = llama_bin
    s = LlamaServer(binary, gguf)  # its port is chosen; nothing listens there yet
    try:
        stats = await _start(client, s.url)
        assert stats["engine"] == "ready" and "unavailable" in stats["engine_error"]  # kept, not "failed"
        uri = "file:///tmp/later.py"
        _open(client, uri, with_hole(*HOLES[0]))
        assert await _complete(client, uri, *HOLES[0]) == []
        shown = [m.message for m in client.messages if "unavailable" in m.message]
        assert len(shown) == 1 and s.url in shown[0]  # one message for the load and the request
        s.start()
        before = s.predicted_total()
        await _complete(client, uri, *HOLES[0])
        assert s.predicted_total() > before  # no restart, no new options: the next request connects
        assert (await _stats(client))["engine_error"] is None
        assert any(m.message == "completer: engine back" for m in client.messages)
    finally:
        s.kill()


@pytest.mark.asyncio
async def test_api_key_required_and_sent(client: LanguageClient, llama_bin):
    binary, gguf = llama_bin
    s = LlamaServer(binary, gguf, "--api-key", "lsp-key-42").start()
    try:
        await _start(client, s.url, engine_api_key="lsp-key-42")
        _open(client, "file:///tmp/key.py", with_hole(*HOLES[0]))
        before = s.predicted_total()
        await _complete(client, "file:///tmp/key.py", *HOLES[0])
        assert s.predicted_total() > before and (await _stats(client))["engine_error"] is None
    finally:
        s.kill()


@pytest.mark.asyncio
async def test_missing_api_key_is_one_clear_message(client: LanguageClient, llama_bin):
    binary, gguf = llama_bin
    s = LlamaServer(binary, gguf, "--api-key", "lsp-key-43").start()
    try:
        stats = await _start(client, s.url)
        if stats["engine"] == "ready":  # connecting does not need the key everywhere: a request does
            _open(client, "file:///tmp/nokey.py", with_hole(*HOLES[0]))
            assert await _complete(client, "file:///tmp/nokey.py", *HOLES[0]) == []
            stats = await _stats(client)
        reason = stats["engine_error"] or stats["engine"]
        assert "unauthorized" in reason or "401" in reason, reason
        assert "lsp-key-43" not in str(stats) and all("lsp-key-43" not in m.message for m in client.messages)
    finally:
        s.kill()
