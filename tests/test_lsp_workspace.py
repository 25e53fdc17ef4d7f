"""End to end through the real `completer-lsp` process (pytest-lsp) on workspaces the tests write:
the workspace index is built from the workspace folder with `$/progress`, kept current from open
documents and watched files (registered dynamically), and a workspace with unreadable files and
symlink loops still indexes and completes (issue 22, items 1, 3 and 5)."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from helpers.lsp import (
    context_at,
    did_change_watched,
    indexed,
    inline,
    open_path,
    start_in,
    tiny_options,
    type_text,
)
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient, client_capabilities

pytestmark = pytest.mark.slow

UTIL = '''"""Helpers."""


def scale_all(values, factor):
    """Multiply each value by factor."""
    return [v * factor for v in values]


class Meter:
    def __init__(self, unit):
        self.unit = unit

    def read(self, raw):
        return raw
'''
MAIN = "from pkg.util import scale_all\n\n\ndef run(xs):\n    ys = scale_all(\n"


def _workspace(root: Path) -> Path:
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text(UTIL)
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (root / "main.py").write_text(MAIN)
    return root


async def _files(client: LanguageClient, want: int) -> int:
    """The index's file count once it is `want` (updates are applied in the background)."""
    for _ in range(200):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.workspace.files == want:
            break
        await asyncio.sleep(0.05)
    return stats.workspace.files


@pytest.mark.asyncio
async def test_index_is_built_with_progress_and_kept_current(client: LanguageClient, tiny_pair, tmp_path):
    root = _workspace(tmp_path)
    await start_in(client, root, tiny_options(tiny_pair))
    stats = await indexed(client)
    assert stats.workspace.files == 3  # pkg/__init__.py, pkg/util.py, main.py
    index_reports = [r for tok, r in client.progress_reports.items() if tok.startswith("completer/index/")]
    assert len(index_reports) == 1
    kinds = [type(r) for r in index_reports[0]]
    assert kinds[0] is t.WorkDoneProgressBegin and kinds[-1] is t.WorkDoneProgressEnd
    watched = [r for r in client.registrations if r.method == t.WORKSPACE_DID_CHANGE_WATCHED_FILES]
    assert len(watched) == 1  # the client registers watchers on request: the server asked
    with pytest.raises(JsonRpcException) as err:  # completer/context: a clear error for bad params
        await client.protocol.send_request_async("completer/context", {"textDocument": 3, "position": {}})
    assert err.value.code == -32602
    assert await context_at(client, (root / "nope.py").as_uri(), 0, 0) is None  # not open

    # an open document not on disk yet is indexed from its live text
    new = root / "pkg" / "extra.py"
    open_path(client, new, "def helper(a):\n    return a\n")
    assert await _files(client, 4) == 4
    # watched files: a deleted file leaves the index (and its edits the next-edit history), a
    # created one joins it
    util = root / "pkg" / "util.py"
    open_path(client, util, util.read_text())
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        t.VersionedTextDocumentIdentifier(uri=util.as_uri(), version=2),
        [t.TextDocumentContentChangeWholeDocument(text=util.read_text() + "\nX = 1\n")]))
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.edit_events == 1
    util.unlink()
    did_change_watched(client, (util, t.FileChangeType.Deleted))
    assert await _files(client, 3) == 3
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.edit_events == 0
    client.text_document_did_close(t.DidCloseTextDocumentParams(t.TextDocumentIdentifier(uri=util.as_uri())))
    (root / "pkg" / "more.py").write_text("def more():\n    return 1\n")
    did_change_watched(client, (root / "pkg" / "more.py", t.FileChangeType.Created))
    assert await _files(client, 4) == 4
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.files_changed == 2

    # a workspace option rebuilds the index (from the disk and the open documents)
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"index_max_file_kb": 1}}))
    stats = await indexed(client)
    assert stats.index_rebuilds == 1 and stats.options.index_max_file_kb == 1 and stats.workspace.files == 4


@pytest.mark.asyncio
async def test_unreadable_files_and_symlink_loops_still_complete(client: LanguageClient, tiny_pair, tmp_path):
    root = _workspace(tmp_path)
    locked = root / "pkg" / "locked.py"
    locked.write_text("def locked():\n    return 0\n")
    locked.chmod(0)  # unreadable (for anyone but root)
    (root / "pkg" / "latin1.py").write_bytes(b"x = '\xe9'\n")  # not UTF-8
    (root / "pkg" / "gone.py").symlink_to(root / "nowhere.py")  # dangling
    (root / "pkg" / "loop").symlink_to(root / "pkg")  # a directory loop
    (root / "up").symlink_to(root)
    os.mkfifo(root / "pipe.py")  # reading it would block forever
    await start_in(client, root, tiny_options(tiny_pair))
    stats = await indexed(client)
    assert stats.workspace.files >= 3
    open_path(client, root / "main.py", MAIN)
    got = await client.text_document_inline_completion_async(inline(4, 19, (root / "main.py").as_uri()))
    assert isinstance(got, t.InlineCompletionList)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.engine_stats.requests == 1 and getattr(stats, "engine_exceptions", 0) == 0  # it ran, and nothing raised



@pytest.mark.asyncio
async def test_the_other_files_definition_is_in_the_context_and_stays_while_typing(
        client: LanguageClient, tiny_pair, tmp_path):
    root = _workspace(tmp_path)
    await start_in(client, root, tiny_options(tiny_pair, max_new_tokens=2, type_through=False))
    await indexed(client)
    uri = (root / "main.py").as_uri()
    open_path(client, root / "main.py", MAIN)
    context = await context_at(client, uri, 4, 19)
    cross = [(c.kind, c.path, c.start_line, c.end_line, c.tokens) for c in context if c.path != "main.py"]
    assert ("definition", "pkg/util.py") in {c[:2] for c in cross}, context
    scale = next(c for c in cross if c[1] == "pkg/util.py")
    assert scale[2] <= UTIL.splitlines().index("def scale_all(values, factor):") <= scale[3] and scale[4] > 0
    assert {c.kind for c in context if c.path == "main.py"} >= {"prefix"}  # the cursor file's own windows

    await client.text_document_inline_completion_async(inline(4, 19, uri))
    before = await client.protocol.send_request_async("completer/stats", {})
    for version, ch in enumerate("xs", start=2):  # keystrokes inside the call: the same definitions
        col = 19 + version - 2
        type_text(client, 4, col, ch, version, uri)
        assert [(c.kind, c.path, c.start_line, c.end_line, c.tokens) for c in await context_at(client, uri, 4, col + 1)
                if c.path != "main.py"] == cross
    await client.text_document_inline_completion_async(inline(4, 21, uri))
    after = await client.protocol.send_request_async("completer/stats", {})
    # the cross-file block goes first and did not change: only the typed tokens (and the ones the
    # last completion generated past them) are prefilled again
    assert after.engine_stats.requests == before.engine_stats.requests + 1
    assert after.engine_stats.prefill_tokens - before.engine_stats.prefill_tokens <= 8
    assert after.engine_stats.tokens_reused > before.engine_stats.tokens_reused

    # the definitions are in the prompt: without them (cross_file off) it is that much shorter
    def prompt_tokens(a, b) -> int:
        return (b.engine_stats.prefill_tokens + b.engine_stats.tokens_reused
                - a.engine_stats.prefill_tokens - a.engine_stats.tokens_reused)
    with_cross = prompt_tokens(before, after)
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings={"completer": {"cross_file": False}}))
    await indexed(client)
    assert all(c.path == "main.py" for c in await context_at(client, uri, 4, 21))
    await client.text_document_inline_completion_async(inline(4, 21, uri))
    last = await client.protocol.send_request_async("completer/stats", {})
    assert with_cross - prompt_tokens(after, last) >= sum(c[4] for c in cross)


@pytest.mark.asyncio
async def test_no_folder_no_index_and_no_progress_left_open(client: LanguageClient, tiny_pair):
    # an editor with a single file and no root (Neovim without a root marker): no index, and no
    # `$/progress` begun for one (a begin that never ended held Neovim's status at 'loading')
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=tiny_options(tiny_pair)))
    for _ in range(1200):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine not in ("loading", "not loaded"):
            break
        await asyncio.sleep(0.05)
    assert stats.engine == "ready" and stats.workspace is None
    assert not [tok for tok in client.progress_reports if tok.startswith("completer/index/")]
    ended = [r for r in client.progress_reports.values() if r and isinstance(r[-1], t.WorkDoneProgressEnd)]
    assert len(ended) == len(client.progress_reports)
