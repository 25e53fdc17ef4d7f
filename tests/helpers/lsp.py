"""The real `completer-lsp` over stdio through pytest-lsp: the server's command and environment
(the `client` fixture in conftest.py starts one per test: each test initialises its own session),
and the requests the end-to-end tests send."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from lsprotocol import types as t
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from . import ROOT

SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "lsp.server"],
                            server_env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                                        "XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"], "PYTHONPATH": str(ROOT)})
URI = "file:///tmp/example.py"
SOURCE = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = add(1, 2)\n"


async def start(client: LanguageClient, options: dict) -> t.InitializeResult:
    """initialize + initialized, then wait until the engine has loaded (or failed)."""
    res = await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=options))
    end = time.monotonic() + 120  # the engine loads in the background after `initialized` (a loaded
    while time.monotonic() < end:  # machine: 30 s were not always enough)
        got = await server_stats(client)
        if got.engine != "loading" and got.engine != "not loaded":
            break
        await asyncio.sleep(0.05)
    return res


def tiny_options(pair: tuple[Path, Path], **extra) -> dict:
    """initializationOptions for a model pair (the `tiny_pair` fixture or one built from it)."""
    target, draft = pair
    return {"target": str(target), "draft": str(draft), "max_new_tokens": 8, "debounce_ms": 0,
            "device": "cpu", **extra}


def open_doc(client: LanguageClient, text: str = SOURCE, uri: str = URI, language: str = "python") -> None:
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))


def type_text(client: LanguageClient, line: int, col: int, text: str, version: int, uri: str = URI) -> None:
    """An incremental didChange inserting `text` at (line, col)."""
    at = t.Position(line=line, character=col)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[t.TextDocumentContentChangePartial(range=t.Range(start=at, end=at), text=text)]))


def inline(line: int, col: int, uri: str = URI) -> t.InlineCompletionParams:
    return t.InlineCompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=line, character=col),
        context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Automatic))


async def server_stats(client: LanguageClient):
    return await client.protocol.send_request_async("completer/stats", {})


# -- a session on a workspace folder (the index) -----------------------------------------------------
async def start_in(client: LanguageClient, root: Path, options: dict) -> None:
    """initialize with `root` as the workspace folder (the index walks it); no wait."""
    caps = client_capabilities("visual-studio-code")
    await client.initialize_session(t.InitializeParams(
        capabilities=caps, root_uri=root.as_uri(), initialization_options=options,
        workspace_folders=[t.WorkspaceFolder(uri=root.as_uri(), name=root.name)]))


async def indexed(client: LanguageClient):
    """Stats once the engine is ready and the index has walked the workspace and applied every update."""
    for _ in range(1200):
        got = await server_stats(client)
        if got.engine not in ("loading", "not loaded") and got.workspace and got.workspace.complete:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError("the workspace was never indexed")


def open_path(client: LanguageClient, path: Path, text: str) -> None:
    open_doc(client, text, path.as_uri())


def did_change_watched(client: LanguageClient, *changes: tuple[Path, t.FileChangeType]) -> None:
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(
        changes=[t.FileEvent(uri=p.as_uri(), type=kind) for p, kind in changes]))


async def context_at(client: LanguageClient, uri: str, line: int, ch: int) -> list:
    """completer/context at a position: the snippets the prompt there would hold."""
    got = await client.protocol.send_request_async("completer/context", {
        "textDocument": {"uri": uri}, "position": {"line": line, "character": ch}})
    return got.context
