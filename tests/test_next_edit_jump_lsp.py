"""completer/nextEdit's jumps through the real `completer-lsp` (issue 39): a function renamed at its
`def` in a workspace the server indexed; the answer's `jump` names the next place — later in the
file, then in a file that imports it and that the editor has not opened (no `version`), with the
edit for that place in the target's own coordinates; the editor opens it there, asks again and
gets the edit for the file as it is then (changed on disk meanwhile: the edit is for the new
text, never the old place). An open target carries its version."""
from __future__ import annotations

import pytest
from helpers.lsp import indexed, open_doc, start_in
from lsprotocol import types as t
from pytest_lsp import LanguageClient

pytestmark = pytest.mark.slow

CORE = "def fetch(url):\n    return url\n" + "# pad\n" * 40 + "fetch('a')\n"
APP = "from core import fetch\n\nfetch('b')\n"
LIB = "import core\n\ncore.fetch('c')\n"


def _ask(client: LanguageClient, uri: str, line: int, col: int):
    return client.protocol.send_request_async("completer/nextEdit", {
        "textDocument": {"uri": uri}, "position": {"line": line, "character": col}})


def _apply(text: str, edits) -> str:
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    spans = sorted(((starts[e.range.start.line] + e.range.start.character, starts[e.range.end.line] + e.range.end.character,
                     e.newText) for e in edits), reverse=True)
    for a, b, s in spans:
        text = text[:a] + s + text[b:]
    return text


def _change(client: LanguageClient, uri: str, version: int, edits) -> None:
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[t.TextDocumentContentChangePartial(range=e.range, text=e.newText)
                         for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True)]))


@pytest.mark.asyncio
async def test_a_rename_jumps_down_the_file_then_into_a_closed_file(client: LanguageClient, tmp_path):
    for name, text in (("core.py", CORE), ("app.py", APP), ("lib.py", LIB)):
        (tmp_path / name).write_text(text)
    await start_in(client, tmp_path, {"device": "cpu", "next_edit_lines_below": 2})
    await indexed(client)
    core, app, lib = ((tmp_path / n).as_uri() for n in ("core.py", "app.py", "lib.py"))
    open_doc(client, CORE, core)
    open_doc(client, LIB, lib)
    at = t.Position(line=0, character=9)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=core, version=2),
        content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text="_all")]))
    first = await _ask(client, core, 0, 13)
    assert first.source == "rename" and first.edits == [] and first.left == 4
    assert first.jump.uri == core and first.jump.version == 2 and first.jump.range.start.line == 42
    assert [(e.range.start.line, e.range.start.character, e.newText) for e in first.jump.edits] == [(42, 0, "fetch_all")]
    # every place left, for an editor that edits them all at once: this file's, then the others'
    assert [(loc.uri, loc.range.start.line, getattr(loc, "version", None)) for loc in first.locations] == [
        (core, 42, 2), (app, 0, None), (app, 2, None), (lib, 2, 1)]
    # Tab: there; Tab: applied (the editor asks at the place and applies what comes)
    there = await _ask(client, core, 42, 0)
    assert [e.newText for e in there.edits] == ["fetch_all"] and there.version == 2
    _change(client, core, 3, there.edits)
    nxt = await _ask(client, core, 42, 9)
    assert nxt.edits == [] and nxt.jump.uri == app and not hasattr(nxt.jump, "version") or nxt.jump.version is None
    assert [(e.range.start.line, e.newText) for e in nxt.jump.edits] == [(0, "fetch_all")]
    # the closed file changes on disk before the user gets there: the answer there is for its text then
    moved = "# moved\n" + APP
    (tmp_path / "app.py").write_text(moved)
    open_doc(client, moved, app)
    there = await _ask(client, app, 1, 0)
    assert _apply(moved, there.edits) == "# moved\nfrom core import fetch_all\n\nfetch_all('b')\n"
    _change(client, app, 2, there.edits)
    last = await _ask(client, app, 3, 9)
    assert last.edits == [] and last.jump.uri == lib and last.jump.version == 1
    assert [(e.range.start.line, e.newText) for e in last.jump.edits] == [(2, "fetch_all")]
    # the open target changed after the answer (a line above the place): the answer there is for version 2
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=lib, version=2),
        content_changes=[t.TextDocumentContentChangePartial(
            range=t.Range(start=t.Position(line=0, character=0), end=t.Position(line=0, character=0)), text="# x\n")]))
    there = await _ask(client, lib, 3, 0)
    assert there.version == 2 and [(e.range.start.line, e.newText) for e in there.edits] == [(3, "fetch_all")]
    _change(client, lib, 3, there.edits)
    done = await _ask(client, lib, 3, 9)
    assert not getattr(done, "jump", None)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.next_edit_by_rename >= 5


@pytest.mark.asyncio
async def test_a_dismissed_jump_ends_the_chain(client: LanguageClient, tmp_path):
    (tmp_path / "core.py").write_text(CORE)
    await start_in(client, tmp_path, {"device": "cpu", "next_edit_lines_below": 2})
    await indexed(client)
    core = (tmp_path / "core.py").as_uri()
    open_doc(client, CORE, core)
    at = t.Position(line=0, character=9)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=core, version=2),
        content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text="_all")]))
    first = await _ask(client, core, 0, 13)
    assert first.jump.range.start.line == 42
    client.protocol.notify("completer/feedback", {"id": first.id, "kind": "nextEdit", "accepted": False})
    await client.protocol.send_request_async("completer/stats", {})
    again = await _ask(client, core, 20, 0)  # elsewhere, no new edit: the chain is over
    assert not getattr(again, "jump", None)


@pytest.mark.asyncio
async def test_the_same_edit_again_through_the_server(client: LanguageClient, tmp_path):
    # an argument added at two calls of client.get (two edits, as typed): the next call past the
    # region is the jump, with its edit; Tab there, Tab to apply, and the chain goes on
    text = "client.get(a)\nclient.get(b)\n" + "# pad\n" * 10 + "client.get(c)\n" + "# pad\n" * 10 + "client.get(d)\n"
    (tmp_path / "m.py").write_text(text)
    await start_in(client, tmp_path, {"device": "cpu", "next_edit_lines_below": 2})
    uri = (tmp_path / "m.py").as_uri()
    open_doc(client, text, uri)
    for v, line in ((2, 0), (3, 1)):
        at = t.Position(line=line, character=12)
        client.text_document_did_change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=v),
            content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text=", timeout=t")]))
    first = await _ask(client, uri, 1, 23)
    assert first.source == "repeat" and first.edits == [] and first.left == 2
    assert first.jump.uri == uri and first.jump.range.start.line == 12
    assert [(e.range.start.line, e.range.start.character, e.newText) for e in first.jump.edits] == [(12, 12, ", timeout=t")]
    there = await _ask(client, uri, 12, 0)
    assert [(e.range.start.line, e.newText) for e in there.edits] == [(12, ", timeout=t")]
    _change(client, uri, 4, there.edits)
    nxt = await _ask(client, uri, 12, 23)
    assert nxt.source == "repeat" and nxt.jump.range.start.line == 23 and nxt.left == 1
