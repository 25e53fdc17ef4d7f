"""`completer-lsp`: the language server (pygls). Handlers only convert between LSP types and
`lsp.service`; the protocol subclass keeps the server alive and spec-conformant on bad input
(errors for requests before `initialize`, unparseable or mistyped messages, broken framing)."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import threading
from typing import Any

from lsprotocol import types as t
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    JsonRpcServerNotInitialized,
)
from pygls.io_ import StdinAsyncReader, StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from .options import parse_options
from .service import Edit, Service

log = logging.getLogger("completer.lsp")
HEADER = re.compile(rb"Content-Length:\s*(\d+)", re.IGNORECASE)
MAX_BODY = 512 * 2**20  # a larger Content-Length is a framing error, not a message to buffer
_DROPPED = object()     # a message answered (or ignored) while it was being decoded


def _user_handler(method: str):
    """A builtin document-sync handler that only calls the user's: the service keeps the text
    (with its tree), so pygls' own workspace copy would be a second 10 MB string per document."""
    def handler(self, params):
        if (user := self.fm.features.get(method)) is not None:
            yield user, (params,), None
    return lsp_method(method)(handler)


class Protocol(LanguageServerProtocol):
    lsp_text_document__did_open = _user_handler(t.TEXT_DOCUMENT_DID_OPEN)
    lsp_text_document__did_change = _user_handler(t.TEXT_DOCUMENT_DID_CHANGE)
    lsp_text_document__did_close = _user_handler(t.TEXT_DOCUMENT_DID_CLOSE)

    def __init__(self, server, converter):
        super().__init__(server, converter)
        self.initialize_seen = False

    def reply_error(self, msg_id, exc: JsonRpcException) -> None:
        self._send_response(msg_id, None, exc.to_response_error())

    def structure_message(self, data: dict[str, Any]):
        if "jsonrpc" in data and "method" in data and "params" not in data:
            data = {**data, "params": None}  # params are optional in JSON-RPC; pygls needs the key
        try:
            return super().structure_message(data)
        except JsonRpcException as e:  # params of the wrong shape for a known method
            if "method" in data and isinstance(data.get("id"), (int, str)):
                self.reply_error(data["id"], e)
            return _DROPPED

    def handle_message(self, message) -> None:
        if message is _DROPPED:
            return
        if not hasattr(message, "jsonrpc"):  # valid JSON but not a JSON-RPC message object
            if isinstance(message, dict) and isinstance(message.get("id"), (int, str)):
                self.reply_error(message["id"], JsonRpcInvalidRequest())
            return
        method = getattr(message, "method", None)
        is_request = method is not None and getattr(message, "id", None) is not None
        if method == t.INITIALIZE:
            if self.initialize_seen:  # only once per connection, or options and documents reset
                if is_request:
                    self.reply_error(message.id, JsonRpcInvalidRequest("already initialized"))
                return
            self.initialize_seen = True
        elif not self.initialize_seen and method not in (None, t.EXIT):
            if is_request:  # the spec: error -32002 for requests, drop notifications
                self.reply_error(message.id, JsonRpcServerNotInitialized())
            return
        if self._shutdown and is_request and method != t.EXIT:
            self.reply_error(message.id, JsonRpcInvalidRequest("the server is shutting down"))
            return
        super().handle_message(message)


class CompleterServer(LanguageServer):
    def __init__(self, defaults: dict | None = None):
        super().__init__("completer-lsp", "0.1.0", protocol_cls=Protocol,
                         text_document_sync_kind=t.TextDocumentSyncKind.Incremental)
        self.defaults = defaults or {}
        self.service = Service()
        self.warnings: list[str] = []

    def report_server_error(self, error: Exception, source) -> None:
        # Malformed client input is logged, not shown: a fuzzing client must not flood the user.
        log.warning("%s: %s", getattr(source, "__name__", source), error)

    def message(self, kind: t.MessageType, text: str) -> None:
        self.window_show_message(t.ShowMessageParams(type=kind, message=f"completer: {text}"))

    async def load_engine(self) -> None:
        caps = self.client_capabilities.window
        token = "completer/load-models" if caps is not None and caps.work_done_progress else None
        if token is not None:
            try:
                await self.work_done_progress.create_async(token)
                self.work_done_progress.begin(token, t.WorkDoneProgressBegin(
                    title="completer", message="loading models", cancellable=False))
            except Exception:  # the client refused the token: load without progress
                token = None
        state = await asyncio.get_running_loop().run_in_executor(self.service.worker,
                                                                 self.service.load_engine)
        if token is not None:
            self.work_done_progress.end(token, t.WorkDoneProgressEnd(message=state))
        if state != "ready":
            self.message(t.MessageType.Error, f"engine {state}")




def _get(params: Any, name: str, default: Any = None) -> Any:
    """A field of custom-method params (pygls gives namedtuples; tests may pass dicts)."""
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def build(defaults: dict | None = None) -> CompleterServer:
    ls = CompleterServer(defaults)

    @ls.feature(t.INITIALIZE)
    def initialize(ls: CompleterServer, params: t.InitializeParams):
        raw = params.initialization_options
        merged = {**ls.defaults, **raw} if isinstance(raw, dict) else (raw or dict(ls.defaults))
        opts, ls.warnings = parse_options(merged)
        enc = ls.workspace.position_encoding
        ls.service.configure(opts, str(getattr(enc, "value", enc) or "utf-16"))

    @ls.feature(t.INITIALIZED)
    async def initialized(ls: CompleterServer, params: t.InitializedParams):
        for w in ls.warnings:
            ls.message(t.MessageType.Warning, w)
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

    @ls.feature(t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionOptions())
    async def inline_completion(ls: CompleterServer, params: t.InlineCompletionParams):
        got = await ls.service.complete(params.text_document.uri, params.position.line,
                                        params.position.character)
        if got is None:
            return t.InlineCompletionList(items=[])
        text, (line, ch) = got
        at = t.Position(line=line, character=ch)
        return t.InlineCompletionList(items=[t.InlineCompletionItem(insert_text=text, range=t.Range(start=at, end=at))])

    @ls.feature("completer/feedback")
    def feedback(ls: CompleterServer, params: Any):
        uri, text, accepted = _get(params, "uri"), _get(params, "text"), _get(params, "accepted")
        chars = _get(params, "acceptedChars")
        if not (isinstance(uri, str) and isinstance(text, str) and isinstance(accepted, bool)
                and (chars is None or isinstance(chars, int) and not isinstance(chars, bool))):
            log.warning("completer/feedback: expected {uri, text, accepted, acceptedChars?}: %r", params)
            return
        ls.service.feedback(uri, text, accepted, chars)

    @ls.feature("completer/stats")
    def stats(ls: CompleterServer, params: Any):
        return ls.service.stats()

    @ls.feature("completer/documentInfo")
    def document_info(ls: CompleterServer, params: Any):
        uri = _get(params, "uri")
        if not isinstance(uri, str):
            raise JsonRpcInvalidParams("expected {uri: string}")
        return ls.service.document_info(uri)

    @ls.feature(t.SHUTDOWN)
    def shutdown(ls: CompleterServer, params: Any):
        ls.service.shutdown()

    return ls


# -- stdio with resynchronising framing -------------------------------------------------------
async def _read_stdio(ls: CompleterServer, reader: StdinAsyncReader) -> None:
    """pygls' reader loop, except that a broken frame costs only itself: a Content-Length is
    found anywhere in a line (a short body leaves its tail glued before the next header), an
    absurd length is skipped instead of buffered, and unparseable JSON gets error -32700."""
    proto, length = ls.protocol, None
    while not ls._stop_event.is_set():
        line = await reader.readline()
        if not line:
            return  # EOF: the client is gone
        m = HEADER.search(line)
        if m:
            length = int(m.group(1))
            continue
        if line.strip() or length is None:
            continue  # another header, or garbage between frames
        n, length = length, None
        if n > MAX_BODY:
            log.warning("Content-Length %d is larger than %d: frame skipped", n, MAX_BODY)
            continue
        body = await reader.readexactly(n)
        if len(body) < n:
            return
        try:
            message = json.loads(body, object_hook=proto.structure_message)
        except ValueError as e:  # bad JSON or bad UTF-8
            log.warning("unparseable message: %s", e)
            proto.reply_error(None, JsonRpcParseError())
            continue
        try:
            proto.handle_message(message)
        except Exception:
            log.exception("message handling failed")


def serve_stdio(ls: CompleterServer, stdin, stdout) -> None:
    ls._stop_event = threading.Event()
    ls.protocol.set_writer(StdoutWriter(stdout))
    try:
        asyncio.run(_read_stdio(ls, StdinAsyncReader(stdin, ls.thread_pool)))
    except BrokenPipeError:
        log.error("the client closed the connection")
    finally:
        ls.service.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="completer-lsp", description="Code-completion language server.")
    ap.add_argument("--tcp", type=int, metavar="PORT", help="listen on TCP instead of stdio")
    ap.add_argument("--ws", type=int, metavar="PORT", help="listen on a WebSocket instead of stdio")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--engine", help="ws://HOST:PORT of a running `completer serve` (no models in-process)")
    ap.add_argument("--log-level", default="WARNING")
    a = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=a.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    protocol_out = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print() from a library must not corrupt the protocol
    ls = build({"engine": a.engine} if a.engine else {})
    code = 0
    try:
        if a.tcp:
            ls.start_tcp(a.host, a.tcp)
        elif a.ws:
            ls.start_ws(a.host, a.ws)
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
