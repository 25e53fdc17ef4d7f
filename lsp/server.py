"""`completer-lsp`: the language server (pygls). Handlers only convert between LSP types and
`lsp.service`. Every transport (stdio, `--tcp`, `--ws`) feeds message bodies to one `dispatch`
that keeps the server alive and spec-conformant on any input: a frame that is too large, nested
too deep, not JSON, not JSON-RPC or of the wrong shape gets the error the spec names (or is dropped
if it was a notification); a handler's exception never reaches the loop. The process ends on
`exit` (or when stdin closes). The network transports follow `completer serve`'s rules
(completer.netguard): loopback unless a token is given, browser pages and foreign Host names
refused, a client with no token at the handshake shows it in the first message (`Gate`)."""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import re
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lsprotocol import types as t
from lsprotocol.types import ResponseErrorMessage
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    JsonRpcServerNotInitialized,
)
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    JsonRPCResponseMessage,
    LanguageServerProtocol,
    lsp_method,
)
from pygls.uris import to_fs_path

from completer import config, errors, logs, netguard

from .options import SCOPES, parse_options, update_options
from .service import Edit, Service

log = logging.getLogger("completer.lsp")
HEADER = re.compile(rb"Content-Length:\s*(\d+)", re.IGNORECASE)
MAX_BODY = 64 * 2**20      # bytes of one message (a 16 Mi-char document fits); larger: -32600, skipped
MAX_DEPTH = 64             # JSON nesting; LSP messages need < 20, and handlers may walk what they get
MAX_LINE = 64 * 2**10      # bytes of one header line; a longer line is garbage between frames
NET_OPTIONS = ("host", "token", "allow_origins", "allow_hosts")  # completer serve's, for --tcp and --ws
UNAUTHORIZED = errors.jsonrpc("unauthorized")  # the first message lacked the token
UNAUTHORIZED_MESSAGE = ("unauthorized: send the token as initializationOptions.token in initialize, or at the "
                        "WebSocket handshake (Authorization: Bearer or ?token=)")


def too_deep(data: Any) -> bool:
    """Containers nested more than MAX_DEPTH deep (json.loads itself stops near 1000 levels)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        stack.extend((c, depth + 1) for c in (node.values() if isinstance(node, dict) else node)
                     if isinstance(c, (dict, list)))
    return False


def _user_handler(method: str):
    """A builtin document-sync handler that only calls the user's: the service keeps the text
    (with its tree), so pygls' own workspace copy would be a second 10 MB string per document.
    A plain call, not pygls' generator form: pygls files a generator's future under a fresh id
    that nothing removes for a notification, one Future kept per didOpen/didChange/didClose."""
    def handler(self, params):
        if (user := self.fm.features.get(method)) is not None:
            user(params)
    return lsp_method(method)(handler)


def _request_id(data: dict) -> int | str | None:
    i = data.get("id")
    return i if isinstance(i, (int, str)) and not isinstance(i, bool) else None


class Protocol(LanguageServerProtocol):
    lsp_text_document__did_open = _user_handler(t.TEXT_DOCUMENT_DID_OPEN)
    lsp_text_document__did_change = _user_handler(t.TEXT_DOCUMENT_DID_CHANGE)
    lsp_text_document__did_close = _user_handler(t.TEXT_DOCUMENT_DID_CLOSE)

    def __init__(self, server, converter):
        super().__init__(server, converter)
        self.initialize_seen = False

    def reply_error(self, msg_id, exc: JsonRpcException) -> None:
        if msg_id is None:  # JSON-RPC 2.0: "id": null when it could not be read (pygls would drop the key)
            error = self._converter.unstructure(exc.to_response_error())
            self._send_data({"jsonrpc": "2.0", "id": None, "error": error})
            return
        self._send_response(msg_id, None, exc.to_response_error())

    def structure(self, data: Any):
        """The typed message for parsed JSON, or None once the error the spec names has been
        sent (requests, and shapes whose id cannot be read: id null) or the message dropped."""
        if not isinstance(data, dict):
            self.reply_error(None, JsonRpcInvalidRequest("a message must be a JSON object"))
            return None
        msg_id, has_id = _request_id(data), "id" in data
        if "method" in data:
            method = data["method"]
            if data.get("jsonrpc") != "2.0" or not isinstance(method, str) or (has_id and msg_id is None):
                if has_id:
                    self.reply_error(msg_id, JsonRpcInvalidRequest(
                        'a request needs "jsonrpc": "2.0", a string method and an integer or string id'))
                return None
            kind = self.get_message_type(method) or (JsonRPCRequestMessage if has_id else JsonRPCNotification)
            message = {"jsonrpc": "2.0", "method": method, "params": data.get("params")}  # params are optional
            try:
                return self._converter.structure({**message, "id": msg_id} if has_id else message, kind)
            except Exception:  # noqa: BLE001 - params of the wrong shape for the method
                if has_id:
                    self.reply_error(msg_id, JsonRpcInvalidParams(f"invalid params for {method}"))
                return None
        if "result" in data or "error" in data:  # the client's answer to one of our requests
            key = "error" if "error" in data else "result"
            kind = ResponseErrorMessage if key == "error" else (
                self._result_types.pop(msg_id, None) or JsonRPCResponseMessage)
            try:  # a response is never answered, even a malformed one
                if data.get("jsonrpc") != "2.0" or msg_id is None:
                    raise ValueError('"jsonrpc": "2.0" and an integer or string id expected')
                return self._converter.structure({"jsonrpc": "2.0", "id": msg_id, key: data[key]}, kind)
            except Exception as e:  # noqa: BLE001 - any malformed response is logged, never answered
                log.warning("malformed response from the client (%s): %.200r", e, data)
                return None
        self.reply_error(msg_id, JsonRpcInvalidRequest("neither a request, a notification nor a response"))
        return None

    def handle_message(self, message) -> None:
        method = getattr(message, "method", None)
        is_request = method is not None and getattr(message, "id", None) is not None
        if method == t.INITIALIZE:
            if self.initialize_seen:  # only once per session, or options and documents reset
                if is_request:
                    self.reply_error(message.id, JsonRpcInvalidRequest("already initialized"))
                return
            self.initialize_seen = True
        elif not self.initialize_seen and method not in (None, t.EXIT):
            if is_request:  # the spec: error -32002 for requests, drop notifications
                self.reply_error(message.id, JsonRpcServerNotInitialized())
            return
        if method == t.CANCEL_REQUEST and not isinstance(getattr(message.params, "id", None), (int, str)):
            return  # pygls would look the id up in a dict
        if self._shutdown and is_request and method != t.EXIT:
            self.reply_error(message.id, JsonRpcInvalidRequest("the server is shutting down"))
            return
        super().handle_message(message)

    def end_session(self) -> None:
        """The client's connection closed (TCP, WebSocket): the next one starts afresh."""
        for fut in list(self._request_futures.values()):
            fut.cancel()
        self._request_futures.clear()
        self.initialize_seen, self._shutdown, self.writer = False, False, None


class CompleterServer(LanguageServer):
    def __init__(self, cli: dict | None = None):
        super().__init__("completer-lsp", "0.1.0", protocol_cls=Protocol,
                         text_document_sync_kind=t.TextDocumentSyncKind.Incremental)
        self.cli = cli or {}  # options given as completer-lsp flags: above every other source
        self.service = Service(say=self.say)
        self.warnings: list[str] = []
        self.load_ids = itertools.count(1)  # one progress token per load

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
        token = f"completer/load-models/{next(self.load_ids)}"
        shown = asyncio.ensure_future(self._begin_progress(token) if caps and caps.work_done_progress
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

    async def _begin_progress(self, token: str) -> bool:
        try:
            await self.work_done_progress.create_async(token)
        except Exception:  # noqa: BLE001 - the client refused the token: load without progress
            return False
        self.work_done_progress.begin(token, t.WorkDoneProgressBegin(
            title="completer", message="loading models", percentage=0, cancellable=False))
        return True


def _get(params: Any, name: str, default: Any = None) -> Any:
    """A field of custom-method params (pygls gives namedtuples; tests may pass dicts)."""
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def build(cli: dict | None = None) -> CompleterServer:
    ls = CompleterServer(cli)

    @ls.feature(t.INITIALIZE)
    def initialize(ls: CompleterServer, params: t.InitializeParams):
        root = to_fs_path(params.root_uri) if params.root_uri else params.root_path
        try:
            opts, ls.warnings = parse_options(params.initialization_options, cli=ls.cli, root=root)
        except (OSError, ValueError) as e:  # a root the OS refuses (NUL byte, name too long)
            opts, ls.warnings = parse_options(params.initialization_options, cli=ls.cli)
            ls.warnings.append(f"workspace root unusable ({str(e)[:200]}): no project .completer.toml read")
        enc = ls.workspace.position_encoding
        ls.service.configure(opts, str(getattr(enc, "value", enc) or "utf-16"))

    @ls.feature(t.INITIALIZED)
    async def initialized(ls: CompleterServer, params: t.InitializedParams):
        for w in ls.warnings:
            ls.say("warning", w)
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

    @ls.feature(t.SHUTDOWN)
    def shutdown(ls: CompleterServer, params: Any):
        ls.service.close_all()

    return ls


# -- transports: framing in, one dispatch -----------------------------------------------------
def dispatch(ls: CompleterServer, body: bytes) -> None:
    """One message body from any transport, checked, parsed and handled; whatever is wrong with
    it costs only this message."""
    proto = ls.protocol
    if len(body) > MAX_BODY:
        proto.reply_error(None, JsonRpcInvalidRequest(f"a message of {len(body)} bytes is over the limit of {MAX_BODY}"))
        return
    try:
        data = json.loads(body)
        deep = body.count(b"[") + body.count(b"{") > MAX_DEPTH and too_deep(data)
    except RecursionError:  # json.loads gives up near 1000 levels
        deep = True
    except ValueError as e:  # bad JSON or bad UTF-8
        proto.reply_error(None, JsonRpcParseError(f"not JSON: {str(e)[:200]}"))
        return
    if deep:
        proto.reply_error(None, JsonRpcParseError(f"JSON nested deeper than {MAX_DEPTH} levels"))
        return
    try:
        message = proto.structure(data)
        if message is not None:
            proto.handle_message(message)
    except Exception:  # a bug of ours or pygls': logged, the loop goes on
        log.exception("message handling failed")


class ByteStream:
    """Lines and exact reads over `read(max_bytes)` (b"" at EOF): the framing's view of stdin
    and of a TCP connection alike. A line longer than MAX_LINE comes back in pieces."""

    def __init__(self, read):
        self.read, self.buf, self.eof = read, bytearray(), False

    async def _more(self, n: int) -> bool:
        chunk = b"" if self.eof else await self.read(max(n, 2**16))
        self.eof = not chunk
        self.buf += chunk
        return bool(chunk)

    async def readline(self) -> bytes:
        seen = 0
        while (i := self.buf.find(b"\n", seen)) < 0 and len(self.buf) < MAX_LINE:
            seen = len(self.buf)
            if not await self._more(MAX_LINE - seen):
                break
        end = i + 1 if 0 <= i < MAX_LINE else min(len(self.buf), MAX_LINE)
        line = bytes(self.buf[:end])
        del self.buf[:end]
        return line

    async def readexactly(self, n: int) -> bytes:
        """n bytes, or fewer at EOF."""
        while len(self.buf) < n and await self._more(n - len(self.buf)):
            pass
        body = bytes(self.buf[:n])
        del self.buf[:n]
        return body


class Gate:
    """What one network client must show before its messages reach the server: with a token
    configured and none given at the handshake, the first message must be `initialize` carrying
    it as `initializationOptions.token` (what any editor can send over raw TCP). The token is
    taken out of the options either way: it is the transport's, not an option of the server."""

    def __init__(self, token: str | None, authed: bool = False):
        self.token, self.authed, self.first = token, authed or token is None, True
        self.refused_id: int | str | None = None

    def refusal(self) -> dict:
        """The error response to a refused first message (`refused_id`: its id)."""
        return {"jsonrpc": "2.0", "id": self.refused_id, "error": {"code": UNAUTHORIZED, "message": UNAUTHORIZED_MESSAGE}}

    def admit(self, body: bytes) -> bytes | None:
        """The body to dispatch, or None: refused (the caller sends `refusal()` and closes the
        connection)."""
        if not self.first:
            return body
        self.first = False
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = None
        params = data.get("params") if isinstance(data, dict) and data.get("method") == t.INITIALIZE else None
        opts = params.get("initializationOptions") if isinstance(params, dict) else None
        given = opts.pop("token", None) if isinstance(opts, dict) else None
        if not self.authed and not netguard.token_matches(given if isinstance(given, str) else None, self.token):
            self.refused_id = _request_id(data) if isinstance(data, dict) else None
            return None
        self.authed = True
        return json.dumps(data).encode() if given is not None else body


async def read_frames(ls: CompleterServer, stream: ByteStream, gate: Gate | None = None) -> None:
    """`Content-Length` framing that resynchronises: a header is found anywhere in a line (a short
    body leaves its tail glued before the next header), a length over MAX_BODY is answered and
    skipped instead of buffered, and anything else between frames is skipped. Returns at EOF, at
    an HTTP request line first (a browser's POST: its body must not be read as a message) and
    when `gate` refuses the first message."""
    length, first = None, True
    while True:
        line = await stream.readline()
        if not line:
            return
        if first and gate is not None and netguard.looks_like_http(line):
            log.warning("an HTTP request on the LSP TCP port was refused (a browser page?)")
            return
        first = False
        m = HEADER.search(line)
        if m:
            length = int(m.group(1))
            continue
        if line.strip() or length is None:
            continue  # another header, or garbage between frames
        n, length = length, None
        if n > MAX_BODY:
            ls.protocol.reply_error(None, JsonRpcInvalidRequest(
                f"Content-Length {n} is over the limit of {MAX_BODY}: frame skipped"))
            continue
        body = await stream.readexactly(n)
        if len(body) < n:
            return
        if gate is not None and (body := gate.admit(body)) is None:
            ls.protocol.reply_error(gate.refused_id, JsonRpcException(UNAUTHORIZED_MESSAGE, code=UNAUTHORIZED))
            return
        dispatch(ls, body)
        await asyncio.sleep(0)  # its handler starts before the next message (a $/cancelRequest) is read


def serve_stdio(ls: CompleterServer, stdin, stdout) -> None:
    ls.protocol.set_writer(StdoutWriter(stdout))
    pool = ThreadPoolExecutor(1, thread_name_prefix="completer-stdin")  # not the loop's default: never joined

    async def run() -> None:
        loop = asyncio.get_running_loop()
        await read_frames(ls, ByteStream(lambda n: loop.run_in_executor(pool, stdin.read1, n)))
    try:
        asyncio.run(run())
    finally:
        ls.service.shutdown()


class _StreamWriter:
    """pygls' writer interface over an asyncio stream (one TCP client)."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.writer.close()


class _WsWriter:
    """pygls' writer interface over a WebSocket: one text message per JSON-RPC message."""

    def __init__(self, ws):
        self.ws = ws

    def write(self, data: bytes):
        return self._quiet(self.ws.send(data.decode()))

    def close(self):
        return self._quiet(self.ws.close())

    @staticmethod
    async def _quiet(aw) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await aw
        except ConnectionClosed:  # the client left: what it would have read is moot
            pass


async def _session(ls: CompleterServer, busy: list[bool], serve) -> None:
    """One client at a time; when it leaves, the next one starts a new session (the engine stays)."""
    if busy[0]:
        raise ConnectionRefusedError
    busy[0] = True
    try:
        await serve()
    finally:
        busy[0] = False
        ls.protocol.end_session()
        ls.service.close_all()


async def serve_tcp(ls: CompleterServer, net: config.ServeConfig, port: int) -> None:
    busy, host = [False], net.host

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def serve() -> None:
            ls.protocol.set_writer(_StreamWriter(writer))
            await read_frames(ls, ByteStream(reader.read), Gate(net.token))
        try:
            await _session(ls, busy, serve)
        except ConnectionRefusedError:
            log.warning("a second TCP client was refused: one client at a time")
        except ConnectionError:
            log.warning("the TCP client's connection broke")
        finally:
            writer.close()

    server = await asyncio.start_server(connection, host, port)
    print(f"completer-lsp: listening on tcp://{host}:{server.sockets[0].getsockname()[1]}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


async def serve_ws(ls: CompleterServer, net: config.ServeConfig, port: int) -> None:
    from http import HTTPStatus
    from urllib.parse import parse_qs, urlsplit

    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed

    busy, host = [False], net.host
    shown_token = weakref.WeakSet()  # connections that gave the right token at the handshake

    def handshake(conn, request):
        """netguard's Host, Origin and token rules before the upgrade; None lets it through."""
        headers = request.headers
        if any(len(headers.get_all(h)) > 1 for h in ("Host", "Origin", "Authorization")):
            return conn.respond(HTTPStatus.BAD_REQUEST, "a Host, Origin or Authorization header given twice\n")
        if not netguard.host_allowed(headers.get("Host"), host, net.allow_hosts):
            return conn.respond(HTTPStatus.FORBIDDEN, "Host header not allowed (DNS rebinding guard; see --allow-hosts)\n")
        if not netguard.origin_allowed(headers.get("Origin"), net.allow_origins):
            return conn.respond(HTTPStatus.FORBIDDEN, "origin not allowed (see --allow-origins)\n")
        query = parse_qs(urlsplit(request.path).query).get("token")
        given = netguard.given_token(headers.get("Authorization"), query[0] if query else None)
        if given is not None and net.token is not None and not netguard.token_matches(given, net.token):
            return conn.respond(HTTPStatus.UNAUTHORIZED, "wrong token\n")
        if given is not None:
            shown_token.add(conn)
        return None

    async def connection(ws) -> None:
        async def session() -> None:
            ls.protocol.set_writer(_WsWriter(ws), include_headers=False)
            gate = Gate(net.token, authed=ws in shown_token)
            while True:
                data = await ws.recv(decode=False)  # text or binary: one JSON-RPC body
                if (data := gate.admit(data)) is None:
                    await ws.send(json.dumps(gate.refusal()))  # awaited: pygls' writer would send it after the close
                    await ws.close(1008, "unauthorized")
                    return
                dispatch(ls, data)
                await asyncio.sleep(0)
        try:
            await _session(ls, busy, session)
        except ConnectionRefusedError:
            log.warning("a second WebSocket client was refused: one client at a time")
            await ws.close(1013, "one client at a time")
        except ConnectionClosed as e:  # the client left, or sent a message over max_size (1009)
            log.info("WebSocket closed: %s", e)

    async with serve(connection, host, port, max_size=MAX_BODY, process_request=handshake) as server:
        print(f"completer-lsp: listening on ws://{host}:{server.sockets[0].getsockname()[1]}", file=sys.stderr,
              flush=True)
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="completer-lsp", description="Code-completion language server.")
    ap.add_argument("--tcp", type=int, metavar="PORT", help="listen on TCP instead of stdio (0: any free port)")
    ap.add_argument("--ws", type=int, metavar="PORT", help="listen on a WebSocket instead of stdio (0: any free port)")
    logs.add_argument(ap)
    config.add_arguments(ap, SCOPES)
    config.add_arguments(ap, ("trust",))
    config.add_arguments(ap, ("serve",), "--tcp and --ws (the rules of completer serve)", only=NET_OPTIONS)
    a = ap.parse_args(argv)
    net = _network_options(a) if a.tcp is not None or a.ws is not None else None
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


def _network_options(a: argparse.Namespace) -> config.ServeConfig:
    """--host, --token (else env COMPLETER_TOKEN), --allow-origins, --allow-hosts; exits with one
    line when the host is not loopback and there is no token. Config files are not read: a
    listener's reach is decided where it is started."""
    flags = config.from_args(a, ("serve",))
    if "token" not in flags and os.environ.get("COMPLETER_TOKEN"):
        flags["token"] = os.environ["COMPLETER_TOKEN"]
    r = config.resolve([config.Layer("command line", flags, "cli")], ("serve",))
    for w in r.warnings:
        print(f"completer-lsp: warning: {w}", file=sys.stderr)
    net = r.build(config.ServeConfig)
    refusal = netguard.listen_refusal(net.host, net.token)
    if refusal:
        print(f"completer-lsp: error: {refusal}", file=sys.stderr)
        raise SystemExit(2)
    return net


if __name__ == "__main__":
    main()
