"""The language server's transports: stdio, `--tcp` and `--ws`, each reading frames and handing
their bodies to `protocol.dispatch`; one client at a time on the network ones, each new
connection a new session. The network transports follow `completer serve`'s rules
(completer.netguard): loopback unless a token is given, browser pages and foreign Host names
refused, a client with no token at the handshake shows it in the first message (`Gate`)."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from completer import config, errors, netguard

from .protocol import MAX_BODY, dispatch, request_id

log = logging.getLogger("completer.lsp")
HEADER = re.compile(rb"Content-Length:\s*(\d+)", re.IGNORECASE)
MAX_LINE = 64 * 2**10      # bytes of one header line; a longer line is garbage between frames
NET_OPTIONS = ("host", "token", "allow_origins", "allow_hosts")  # completer serve's, for --tcp and --ws
UNAUTHORIZED = errors.jsonrpc("unauthorized")  # the first message lacked the token
UNAUTHORIZED_MESSAGE = ("unauthorized: send the token as initializationOptions.token in initialize, or at the "
                        "WebSocket handshake (Authorization: Bearer or ?token=)")


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
            self.refused_id = request_id(data) if isinstance(data, dict) else None
            return None
        self.authed = True
        return json.dumps(data).encode() if given is not None else body


async def read_frames(ls: LanguageServer, stream: ByteStream, gate: Gate | None = None) -> None:
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


def serve_stdio(ls: LanguageServer, stdin, stdout) -> None:
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


async def _session(ls: LanguageServer, busy: list[bool], serve) -> None:
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


async def serve_tcp(ls: LanguageServer, net: config.ServeConfig, port: int) -> None:
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


async def serve_ws(ls: LanguageServer, net: config.ServeConfig, port: int) -> None:
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


def network_options(a: argparse.Namespace) -> config.ServeConfig:
    """--host, --token (else env COMPLETER_TOKEN), --allow-origins, --allow-hosts; exits with one
    line when the host is not loopback and there is no token. Config files are not read: a
    listener's reach is decided where it is started."""
    flags = config.from_args(a, ("serve",))
    if "token" not in flags and config.env("COMPLETER_TOKEN"):
        flags["token"] = config.env("COMPLETER_TOKEN")
    r = config.resolve([config.Layer("command line", flags, "cli")], ("serve",))
    for w in r.warnings:
        print(f"completer-lsp: warning: {w}", file=sys.stderr)
    net = r.build(config.ServeConfig)
    refusal = netguard.listen_refusal(net.host, net.token)
    if refusal:
        print(f"completer-lsp: error: {refusal}", file=sys.stderr)
        raise SystemExit(2)
    return net
