"""completer/nextEdit end to end: the real `completer-lsp` process on the embedded pair — the
result's shape, the reasons it gives when there is no edit (no history, disabled), bad params
answered with an error while the server lives on, next-edit feedback and its counters in
completer/stats. (A stale edit, the document changed while it was computed, is tested on a
scripted slow engine: tests/test_next_edit_remote.py.)"""
from __future__ import annotations

import pytest
from helpers.lsp import open_doc, start, type_text
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.slow

URI = "file:///tmp/store.py"
SOURCE = '''\
class Store:
    def add(self, name, value):
        path = "😀/" + name
        print("adding", name, value)
        self.items.append((path, name, value))
        return name
'''


def _ask(client: LanguageClient, line: int, col: int, uri: str = URI):
    return client.protocol.send_request_async("completer/nextEdit", {
        "textDocument": {"uri": uri}, "position": {"line": line, "character": col}})


async def _renamed(client: LanguageClient) -> None:
    """The user renames the parameter `name` to `key` in the signature (an edit event)."""
    open_doc(client, SOURCE, URI)
    type_text(client, 1, 18, "key", 2, URI)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=URI, version=3),
        content_changes=[t.TextDocumentContentChangePartial(
            range=t.Range(start=t.Position(line=1, character=21), end=t.Position(line=1, character=25)), text="")]))


@pytest.mark.asyncio
async def test_next_edit_shape_reasons_and_stats(client: LanguageClient):
    await start(client, {"device": "cpu"})
    open_doc(client, SOURCE, URI)
    got = await _ask(client, 2, 8)
    assert got.edits == [] and got.reason == "no_history" and got.version == 1 and isinstance(got.id, str)
    await _renamed(client)
    got = await _ask(client, 1, 21)
    assert got.version == 3 and isinstance(got.id, str) and isinstance(got.edits, list)
    # the shipped pair is not asked (never taught next edits); the rename name -> key is carried
    # to the method's other uses from the syntax tree, the string "adding" left alone, in UTF-16
    # columns (the emoji is two)
    assert got.source == "rename" and not hasattr(got, "reason")
    lines = SOURCE.splitlines()
    want = [(i, len(lines[i][:lines[i].index("name")].encode("utf-16-le")) // 2) for i in range(2, 6)]
    assert [(e.range.start.line, e.range.start.character, e.range.end.character - e.range.start.character,
             e.newText) for e in got.edits] == [(i, c, 4, "key") for i, c in want]
    client.protocol.notify("completer/feedback", {"id": "not-shown", "kind": "nextEdit", "accepted": True})
    client.protocol.notify("completer/feedback", {"id": got.id, "kind": "nextEdit", "accepted": "yes"})
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.next_edit_requests == 2 and stats.next_edit_accepted == 0 and stats.next_edit_rejected == 0
    assert stats.next_edit_shown == 1 and stats.next_edit_by_rename == 1
    assert stats.next_edit_dropped_no_history == 1
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings={"completer": {"next_edit": False}}))
    await client.protocol.send_request_async("completer/stats", {})
    got = await _ask(client, 1, 21)
    assert (got.edits, got.reason) == ([], "disabled")


@pytest.mark.asyncio
@pytest.mark.parametrize("params", [
    {}, {"textDocument": {"uri": URI}}, {"textDocument": {"uri": 3}, "position": {"line": 0, "character": 0}},
    {"textDocument": {"uri": URI}, "position": {"line": "0", "character": 0}},
    {"textDocument": {"uri": URI}, "position": {"line": 99, "character": 0}},
    {"textDocument": {"uri": URI}, "position": {"line": -1, "character": 0}},
])
async def test_bad_params_are_an_error_and_the_server_lives(client: LanguageClient, params):
    await start(client, {"device": "cpu"})
    open_doc(client, SOURCE, URI)
    with pytest.raises(JsonRpcException, match="position|expected"):
        await client.protocol.send_request_async("completer/nextEdit", params)
    got = await _ask(client, 0, 0, "file:///not/open.py")
    assert (got.edits, got.reason, got.version) == ([], "unknown_document", None)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.engine == "ready"


@pytest.mark.asyncio
async def test_an_accepted_rename_is_carried_on_by_the_next_suggestion(client: LanguageClient):
    """A region of two lines below the cursor: the first suggestion renames lines 2-3; the editor
    applies it (one didChange, bottom up, merged into the user's edit event) and asks again at the
    last edit, as after Tab; the second suggestion renames lines 4-5."""
    await start(client, {"device": "cpu", "next_edit_lines_below": 2})
    await _renamed(client)
    first = await _ask(client, 1, 21)
    assert first.source == "rename" and sorted({e.range.start.line for e in first.edits}) == [2, 3]
    ordered = sorted(first.edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=URI, version=4),
        content_changes=[t.TextDocumentContentChangePartial(range=e.range, text=e.newText) for e in ordered]))
    last = ordered[0].range.start
    second = await _ask(client, last.line, last.character + 3)
    assert second.source == "rename" and second.version == 4
    assert sorted((e.range.start.line, e.newText) for e in second.edits) == [(4, "key"), (5, "key")]
