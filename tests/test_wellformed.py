"""Lone UTF-16 surrogates at the boundaries (completer/wellformed.py): the rule as a table, and
the real language server given a document that holds one (what a client that cuts a string inside
a pair sends): the document keeps U+FFFD in its place, an edit after it lands where the client
put it, and completions in that document still run."""
from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

from completer.wellformed import well_formed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, want", [
    ("plain ascii", "plain ascii"),
    ("é 中文 😀", "é 中文 😀"),                       # well-formed text is untouched
    ("x = '\ud83d'", "x = '\ufffd'"),                  # a lone high surrogate
    ("\ude00 tail", "\ufffd tail"),                    # a lone low surrogate
    ("\ud83d\ud83d\ude00", "\ufffd😀"),                # a high one, then a pair
    ("\ud83d\ude00", "😀"),                            # a pair sent as two units: the character
    ("\ude00\ud83d", "\ufffd\ufffd"),                  # the wrong order: two lone ones
])
def test_lone_surrogates_become_one_replacement_each(text, want):
    got = well_formed(text)
    assert got == want
    assert len(got.encode("utf-16-le", "surrogatepass")) == len(text.encode("utf-16-le", "surrogatepass"))


URI = "file:///tmp/cut.py"
SOURCE = 'import os\n\n\ndef add(a, b):\n    s = "\ud83d"\n    return a + b\n\n\ndef main():\n    x = add(1, 2)\n'


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_document_with_a_lone_surrogate_still_completes(client: LanguageClient, tiny_pair):
    target, draft = tiny_pair
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        initialization_options={"target": str(target), "draft": str(draft), "max_new_tokens": 8, "debounce_ms": 0,
                                "device": "cpu", "warmup": False}))
    for _ in range(600):  # the engine loads in the background after `initialized`
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine not in ("loading", "not loaded"):
            break
        await asyncio.sleep(0.05)
    assert stats.engine == "ready"
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=URI, language_id="python", version=1, text=SOURCE)))
    at = t.Position(line=4, character=11)  # after the closing quote: the surrogate counted as one unit
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=URI, version=2),
        content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at),
                                                            text="  # cut \ude00")]))
    want = SOURCE.replace('"\ud83d"', '"\ufffd"  # cut \ufffd')
    info = await client.protocol.send_request_async("completer/documentInfo", {"uri": URI})
    assert info.sha256 == hashlib.sha256(want.encode("utf-8")).hexdigest()

    for line, col in ((9, 17), (4, 8)):  # after the line with it, and right at it
        got = await client.text_document_inline_completion_async(t.InlineCompletionParams(
            text_document=t.TextDocumentIdentifier(uri=URI), position=t.Position(line=line, character=col),
            context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Invoked)))
        assert isinstance(got, t.InlineCompletionList)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.engine_stats.requests == 2  # the engine ran both: the tokenizer took the document
    assert getattr(stats, "engine_exceptions", 0) == 0 and stats.engine_error is None
