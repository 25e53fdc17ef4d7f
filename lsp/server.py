"""`completer-lsp`: the language server (pygls): its decorated handlers, which only convert
between LSP types and `lsp.service`, and `main`. JSON-RPC hardening is in `lsp.protocol`, stdio,
TCP and WebSocket in `lsp.transports`. The process ends on `exit` (or when stdin closes)."""
from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import sys
from typing import Any

from lsprotocol import types as t
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from completer import __version__, config, logs
from completer.documents import PositionError

from .options import SCOPES, parse_options, update_options
from .protocol import Protocol
from .service import Edit, Service
from .transports import NET_OPTIONS, network_options, serve_stdio, serve_tcp, serve_ws

log = logging.getLogger("completer.lsp")


class CompleterServer(LanguageServer):
    def __init__(self, cli: dict | None = None):
        super().__init__("completer-lsp", __version__, protocol_cls=Protocol,
                         text_document_sync_kind=t.TextDocumentSyncKind.Incremental)
        self.cli = cli or {}  # options given as completer-lsp flags: above every other source
        self.service = Service(say=self.say)
        self.warnings: list[str] = []  # what reading the options said at initialize
        self.client_info: t.ClientInfo | None = None  # the editor's name and version (initialize)
        self.progress_ids = itertools.count(1)  # one progress token per load or index walk

    def report_server_error(self, error: Exception, source) -> None:
        # Malformed client input is logged, not shown: a fuzzing client must not flood the user.
        log.warning("%s: %s", getattr(source, "__name__", source), error)

    def say(self, level: str, text: str) -> None:
        kind = {"error": t.MessageType.Error, "warning": t.MessageType.Warning}.get(level, t.MessageType.Info)
        self.window_show_message(t.ShowMessageParams(type=kind, message=f"completer: {text}"))

    async def load_engine(self) -> None:
        """(Re)load the engine, shown as $/progress begin → report(percentage) → end once the
        client has accepted the token (the load does not wait for that answer)."""
        caps = self.client_capabilities.window
        token = f"completer/load-models/{next(self.progress_ids)}"
        shown = asyncio.ensure_future(self._begin_progress(token, "loading models") if caps and caps.work_done_progress
                                      else asyncio.sleep(0, False))
        loop = asyncio.get_running_loop()

        def report(percent: int, stage: str) -> None:
            if shown.done() and not shown.cancelled() and shown.result():
                self.work_done_progress.report(token, t.WorkDoneProgressReport(message=stage, percentage=percent))

        state = await self.service.load(lambda percent, stage: loop.call_soon_threadsafe(report, percent, stage))
        if shown.done() and shown.result():
            self.work_done_progress.end(token, t.WorkDoneProgressEnd(message=state))
        shown.cancel()
        if state != "ready":
            self.say("error", f"engine {state}; completions are off")

    async def _begin_progress(self, token: str, message: str) -> bool:
        try:
            await self.work_done_progress.create_async(token)
        except Exception:  # noqa: BLE001 - the client refused the token: go on without progress
            return False
        self.work_done_progress.begin(token, t.WorkDoneProgressBegin(
            title="completer", message=message, percentage=0, cancellable=False))
        return True

    def index_workspace(self) -> None:
        """Start the workspace index; its walk is shown as $/progress begin → report(files) → end
        once the client has accepted the token (the walk does not wait for that answer; an end
        that comes first is sent after the begin)."""
        if self.service.root is None:  # no folder, no index: a begun progress would never end
            self.service.start_index()
            return
        caps = self.client_capabilities.window
        token = f"completer/index/{next(self.progress_ids)}"
        shown = asyncio.ensure_future(self._begin_progress(token, "indexing the workspace")
                                      if caps and caps.work_done_progress else asyncio.sleep(0, False))
        loop = asyncio.get_running_loop()

        def show(kind: str, files: int, message: str) -> None:
            def send(_=None) -> None:
                if shown.cancelled() or not shown.result():
                    return
                if kind == "report":
                    self.work_done_progress.report(token, t.WorkDoneProgressReport(message=message))
                elif kind == "end":
                    self.work_done_progress.end(token, t.WorkDoneProgressEnd(message=message))
            if shown.done():
                send()
            elif kind == "end":
                shown.add_done_callback(send)

        self.service.start_index(lambda kind, files, message: loop.call_soon_threadsafe(show, kind, files, message))

    async def watch_files(self) -> None:
        """Ask for workspace/didChangeWatchedFiles where the client registers watchers on request."""
        caps = self.client_capabilities.workspace
        watched = caps.did_change_watched_files if caps else None
        if self.service.index is None or not (watched and watched.dynamic_registration):
            return
        try:
            await self.client_register_capability_async(t.RegistrationParams(registrations=[t.Registration(
                id="completer/watched-files", method=t.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                register_options=t.DidChangeWatchedFilesRegistrationOptions(
                    watchers=[t.FileSystemWatcher(glob_pattern="**/*")]))]))
        except Exception as e:  # noqa: BLE001 - refused: the index sees saves and open documents only
            log.warning("the client refused to watch files: %s", e)


def _get(params: Any, name: str, default: Any = None) -> Any:
    """A field of custom-method params (pygls gives namedtuples; tests may pass dicts)."""
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def build(cli: dict | None = None) -> CompleterServer:
    ls = CompleterServer(cli)

    @ls.feature(t.INITIALIZE)
    def initialize(ls: CompleterServer, params: t.InitializeParams):
        folders = params.workspace_folders or []
        root = (to_fs_path(folders[0].uri) if folders else to_fs_path(params.root_uri) if params.root_uri
                else params.root_path)
        try:
            opts, ls.warnings = parse_options(params.initialization_options, cli=ls.cli, root=root)
        except (OSError, ValueError) as e:  # a root the OS refuses (NUL byte, name too long)
            opts, ls.warnings = parse_options(params.initialization_options, cli=ls.cli)
            ls.warnings.append(f"workspace root unusable ({str(e)[:200]}): no project .completer.toml read")
        ls.client_info = params.client_info
        enc = ls.workspace.position_encoding
        ls.service.configure(opts, str(getattr(enc, "value", enc) or "utf-16"), root)

    @ls.feature(t.INITIALIZED)
    async def initialized(ls: CompleterServer, params: t.InitializedParams):
        for w in ls.warnings:
            ls.say("warning", w)
        ls.index_workspace()
        asyncio.ensure_future(ls.watch_files())  # the client's answer is not waited for
        if ls.service.needs_load():
            await ls.load_engine()

    @ls.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: CompleterServer, params: t.DidChangeConfigurationParams):
        opts, warnings = update_options(ls.service.options, params.settings)
        for w in warnings:
            ls.say("warning", w)
        changed = ls.service.update(opts)
        if changed:
            ls.say("info", f"reloading the engine for the new {', '.join(changed)}")
            await ls.load_engine()

    @ls.feature(t.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: CompleterServer, params: t.DidOpenTextDocumentParams):
        d = params.text_document
        ls.service.open(d.uri, d.text, d.language_id, d.version)

    @ls.feature(t.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: CompleterServer, params: t.DidChangeTextDocumentParams):
        edits = [Edit(((c.range.start.line, c.range.start.character),
                       (c.range.end.line, c.range.end.character)), c.text)
                 if isinstance(c, t.TextDocumentContentChangePartial) else Edit(None, c.text)
                 for c in params.content_changes]
        ls.service.change(params.text_document.uri, params.text_document.version, edits)

    @ls.feature(t.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: CompleterServer, params: t.DidCloseTextDocumentParams):
        ls.service.close(params.text_document.uri)

    @ls.feature(t.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: CompleterServer, params: t.DidSaveTextDocumentParams):
        ls.service.file_changed(params.text_document.uri)

    @ls.feature(t.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: CompleterServer, params: t.DidChangeWatchedFilesParams):
        for change in params.changes:
            ls.service.file_changed(change.uri, deleted=change.type == t.FileChangeType.Deleted)

    @ls.feature(t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionOptions())
    async def inline_completion(ls: CompleterServer, params: t.InlineCompletionParams):
        got = await ls.service.complete(params.text_document.uri, params.position.line,
                                        params.position.character)
        if got is None:
            return t.InlineCompletionList(items=[])
        texts, (line, ch) = got
        at = t.Position(line=line, character=ch)
        return t.InlineCompletionList(items=[t.InlineCompletionItem(insert_text=text, range=t.Range(start=at, end=at))
                                             for text in texts])

    @ls.feature("completer/feedback")
    def feedback(ls: CompleterServer, params: Any):
        if _get(params, "kind") == "nextEdit":
            sid, accepted = _get(params, "id"), _get(params, "accepted")
            if not (isinstance(sid, str) and isinstance(accepted, bool)):
                log.warning("completer/feedback: expected {id, kind: 'nextEdit', accepted}: %.200r", params)
            elif not ls.service.next_edit_feedback(sid, accepted):
                log.warning("completer/feedback: no next edit %.80r was shown (or it was judged already)", sid)
            return
        uri, text, accepted = _get(params, "uri"), _get(params, "text"), _get(params, "accepted")
        chars = _get(params, "acceptedChars")
        if not (isinstance(uri, str) and isinstance(text, str) and isinstance(accepted, bool)
                and (chars is None or isinstance(chars, int) and not isinstance(chars, bool))):
            log.warning("completer/feedback: expected {uri, text, accepted, acceptedChars?}: %.200r", params)
            return
        ls.service.feedback(uri, text, accepted, chars)

    @ls.feature("completer/stats")
    async def stats(ls: CompleterServer, params: Any):
        return await ls.service.stats()

    @ls.feature("completer/documentInfo")
    def document_info(ls: CompleterServer, params: Any):
        uri = _get(params, "uri")
        if not isinstance(uri, str):
            raise JsonRpcInvalidParams("expected {uri: string}")
        return ls.service.document_info(uri)

    @ls.feature("completer/context")
    async def context(ls: CompleterServer, params: Any):
        doc, pos = _get(params, "textDocument"), _get(params, "position")
        uri, line, ch = _get(doc, "uri"), _get(pos, "line"), _get(pos, "character")
        if not (isinstance(uri, str) and all(isinstance(v, int) and not isinstance(v, bool) for v in (line, ch))):
            raise JsonRpcInvalidParams("expected {textDocument: {uri}, position: {line, character}}")
        return {"context": await ls.service.context(uri, line, ch)}

    @ls.feature("completer/nextEdit")
    async def next_edit(ls: CompleterServer, params: Any):
        doc, pos = _get(params, "textDocument"), _get(params, "position")
        uri, line, ch = _get(doc, "uri"), _get(pos, "line"), _get(pos, "character")
        if not (isinstance(uri, str) and all(isinstance(v, int) and not isinstance(v, bool) for v in (line, ch))):
            raise JsonRpcInvalidParams("expected {textDocument: {uri}, position: {line, character}}")
        try:
            return await ls.service.next_edit(uri, line, ch)
        except PositionError as e:
            raise JsonRpcInvalidParams(f"position: {e}") from None

    @ls.feature("completer/doctor")
    async def doctor(ls: CompleterServer, params: Any):
        info = ls.client_info
        client = " ".join(filter(None, (info.name, info.version))) if info is not None else None
        return await ls.service.doctor(client, ls.warnings)

    @ls.feature(t.SHUTDOWN)
    def shutdown(ls: CompleterServer, params: Any):
        ls.service.close_all()

    return ls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="completer-lsp", description="Code-completion language server.")
    ap.add_argument("--tcp", type=int, metavar="PORT", help="listen on TCP instead of stdio (0: any free port)")
    ap.add_argument("--ws", type=int, metavar="PORT", help="listen on a WebSocket instead of stdio (0: any free port)")
    logs.add_argument(ap)
    config.add_arguments(ap, SCOPES)
    config.add_arguments(ap, ("trust",))
    config.add_arguments(ap, ("serve",), "--tcp and --ws (the rules of completer serve)", only=NET_OPTIONS)
    a = ap.parse_args(argv)
    net = network_options(a) if a.tcp is not None or a.ws is not None else None
    logs.configure(a.log_level)
    if logging.getLogger().level > logging.DEBUG:  # pygls logs a traceback per malformed message;
        logging.getLogger("pygls").setLevel(logging.CRITICAL)  # report_server_error says it in a line
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    protocol_out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print() from a library must not corrupt the protocol
    ls = build(config.from_args(a, (*SCOPES, "trust")))
    code = 0
    try:
        if a.tcp is not None:
            asyncio.run(serve_tcp(ls, net, a.tcp))
        elif a.ws is not None:
            asyncio.run(serve_ws(ls, net, a.ws))
        else:
            serve_stdio(ls, sys.stdin.buffer, protocol_out)
    except SystemExit as e:  # the `exit` notification: 0 after `shutdown`, else 1
        code = e.code if isinstance(e.code, int) else 0
    try:
        protocol_out.flush()
    except (OSError, ValueError):  # the client closed the pipe first
        pass
    # Do not wait for a model load or a generation still running in the worker thread.
    os._exit(code)


if __name__ == "__main__":
    main()
