"""Fuzz the real server process over each transport (stdio, --tcp, --ws): 10 000 hostile frames
(random bytes, truncated and deeply nested JSON, wrong JSON-RPC shapes, real methods with wrong
params, absurd / negative / non-numeric Content-Length, headers without a body, non-UTF-8 bodies,
10 MB documents, edits to unknown documents, cancel storms), and after every 500 a real inline
completion on the embedded pair that must come back non-empty. The process ends only on `exit`,
and its resident memory grows less than 10 % from the first probe to the last."""
from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.fuzz import PROBE, URI, frame, junk

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIG = "file:///big.py"
FRAMES, EVERY = 10_000, 500
METHODS = ["initialize", "initialized", "textDocument/didOpen", "textDocument/didChange", "textDocument/didClose",
           "textDocument/inlineCompletion", "completer/stats", "completer/feedback", "completer/documentInfo",
           "$/cancelRequest", "workspace/didChangeConfiguration", "textDocument/completion", "workspace/unknown", ""]


def rpc(**kw) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **kw}).encode()


def bodies(rng: random.Random, i: int) -> list[bytes]:
    """Hostile message bodies (never `exit`, `shutdown` or the probe's document)."""
    pos = {"line": rng.randrange(-2, 12), "character": rng.randrange(-2, 40)}
    k = rng.randrange(14)
    if k == 0:
        return [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))]
    if k == 1:  # truncated JSON
        whole = rpc(id=i, method="textDocument/inlineCompletion", params={"textDocument": {"uri": URI}, "position": pos})
        return [whole[:rng.randrange(len(whole))]]
    if k == 2:  # deeply nested, alone or inside a real request's params
        n = rng.choice([65, 1000, 100_000])
        deep = rng.choice([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n, b"[" * n])
        return [rng.choice([deep, b'{"jsonrpc":"2.0","id":%d,"method":"completer/stats","params":%s}' % (i, deep)])]
    if k == 3:  # JSON, but not a JSON-RPC object
        return [json.dumps(rng.choice([5, "x", [], [1, {"id": 2}], None, {}, junk(rng)])).encode()]
    if k == 4:  # wrong JSON-RPC shapes
        return [json.dumps(rng.choice([
            {"jsonrpc": "1.0", "id": i, "method": "completer/stats"}, {"jsonrpc": "2.0", "id": i},
            {"jsonrpc": "2.0", "id": 1.5, "method": "completer/stats"}, {"jsonrpc": "2.0", "id": True, "method": "x"},
            {"jsonrpc": "2.0", "id": {"a": 1}, "method": "completer/stats"}, {"jsonrpc": "2.0", "method": 7},
            {"jsonrpc": "2.0", "id": None, "method": "completer/stats"}, {"jsonrpc": "2.0", "result": 1},
            {"jsonrpc": "2.0", "id": 99999, "result": {"x": 1}}, {"jsonrpc": "2.0", "id": 7, "error": "bad"},
            {"jsonrpc": 2, "method": "textDocument/didOpen", "params": {}}])).encode()]
    if k == 5:  # real methods, wrong params (requests)
        return [rpc(id=i, method=rng.choice(METHODS), params=junk(rng))]
    if k == 6:  # real methods, wrong params (notifications)
        return [rpc(method=rng.choice(METHODS), params=junk(rng))]
    if k == 7:  # not UTF-8
        return [rng.choice([b'{"jsonrpc":"2.0","id":%d,"method":"completer/stats","params":{"x":"\xff\xfe"}}' % i,
                            b"\xff\xfe\x00{\x00", (b'{"jsonrpc":"2.0","method":"textDocument/didOpen","params":'
                            b'{"textDocument":{"uri":"file:///u.py","languageId":"python","version":1,"text":"\xc3("}}}')])]
    if k == 8:  # edits to unknown documents, and ranges outside the document
        uri = rng.choice(["file:///nope.py", URI])
        return [rpc(method="textDocument/didChange", params={
            "textDocument": {"uri": uri, "version": i}, "contentChanges": [
                {"range": {"start": pos, "end": {"line": rng.randrange(-1, 99), "character": 10**9}}, "text": "x("}]})]
    if k == 9:  # a cancel storm around real requests
        out = []
        for j in range(rng.randrange(5, 40)):
            out.append(rpc(id=f"c{i}.{j}", method="textDocument/inlineCompletion", params={
                "textDocument": {"uri": URI}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 2}}))
            out.append(rpc(method="$/cancelRequest", params={"id": rng.choice([f"c{i}.{j}", f"c{i}.{j - 1}", i, None])}))
        return out + [rpc(method="$/cancelRequest", params={"id": f"c{i}.{j}"})]
    if k == 10:  # real edits of the fuzz document, and requests on it
        return [rpc(method="textDocument/didChange", params={
            "textDocument": {"uri": URI, "version": i},
            "contentChanges": [{"range": {"start": pos, "end": pos}, "text": rng.choice(["x", "\n", "😀", "(", "é\r\n"])}]}),
            rpc(id=f"r{i}", method="textDocument/inlineCompletion", params={
                "textDocument": {"uri": URI}, "position": pos, "context": {"triggerKind": 2}})]
    if k == 11:
        return [rpc(id=i, method=rng.choice(["completer/documentInfo", "completer/feedback"]), params=junk(rng)),
                rpc(method="completer/feedback", params={"uri": URI, "text": "ab", "accepted": rng.random() < 0.5})]
    if k == 12:
        return [rpc(method="workspace/didChangeConfiguration", params={"settings": rng.choice([
            junk(rng), {"completer": junk(rng)}, {"debounce_ms": "soon"}, {"completer": {"max_lines": -3}}])})]
    return [rpc(method="textDocument/didOpen", params={"textDocument": {
        "uri": rng.choice([URI, "file:///other.py", "file:///x.bin"]), "languageId": rng.choice(["python", "binary", None]),
        "version": 1, "text": rng.choice(["def f(x):\n    \n", "\x00\x01", "", "é" * 1000])}})]


def broken_frame(rng: random.Random, body: bytes) -> bytes:
    """`body` badly framed (stream transports): the server resynchronises on the next header."""
    k = rng.randrange(9)
    if k == 0:
        return frame(body, rng.choice([10**12, 64 * 2**20 + 1, 2**70]))  # absurd: answered, skipped
    if k == 1:
        return b"Content-Length: -%d\r\n\r\n" % len(body) + body
    if k == 2:
        return b"Content-Length: " + rng.choice([b"abc", b"1e3", b"", b"0x10"]) + b"\r\n\r\n" + body
    if k == 3:
        return b"Content-Length: %d\r\n\r\n" % rng.randrange(1, 300)  # a header without its body
    if k == 4:
        return frame(body, max(0, len(body) - rng.randrange(1, 10)))  # short: the tail is garbage
    if k == 5:
        return frame(body, len(body) + rng.randrange(1, 100))  # long: eats the next frame's start
    if k == 6:
        return b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + body
    if k == 7:
        return b"garbage " * rng.randrange(1, 20000) + b"\r\n"  # up to 160 KB without a newline
    return b"content-length:%d\r\nContent-Type: x\r\n\r\n" % len(body) + body  # other spelling: fine


class Responses:
    """The server's messages by id, read on a thread."""

    def __init__(self):
        self.by_id, self.count, self.lock = {}, 0, threading.Lock()
        self.anonymous: list[dict] = []  # errors with id null: for a message whose id was unreadable

    def add(self, raw: bytes) -> None:
        m = json.loads(raw)
        with self.lock:
            self.count += 1
            if isinstance(m, dict) and isinstance(m.get("id"), (str, int)):
                self.by_id[m["id"]] = m
            elif isinstance(m, dict) and "id" in m and "error" in m:
                self.anonymous.append(m)

    def wait(self, msg_id, proc, timeout=60.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if msg_id in self.by_id:
                return self.by_id.pop(msg_id)
            assert proc.poll() is None, f"the server died (exit code {proc.returncode})"
            time.sleep(0.005)
        raise AssertionError(f"no response to {msg_id!r}")


def read_stream(read, out: Responses) -> None:
    """Content-Length framed messages from a binary reader."""
    while True:
        line = read.readline()
        if not line:
            return
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
            while read.readline().strip():
                pass
            out.add(read.read(n))


class Transport:
    """A server process and a client connection: `send(body)` frames it, `raw(bytes)` sends as is."""

    def __init__(self, kind: str):
        self.kind, self.out, self.exits = kind, Responses(), contextlib.ExitStack()
        args = {"stdio": [], "tcp": ["--tcp", "0"], "ws": ["--ws", "0"]}[kind]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "lsp.server", "--log-level", "ERROR", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.stderr: list[bytes] = []
        if kind == "stdio":
            self.raw = lambda b: (self.proc.stdin.write(b), self.proc.stdin.flush())
            self.send = lambda body: self.raw(frame(body))
            threading.Thread(target=read_stream, args=(self.proc.stdout, self.out), daemon=True).start()
            threading.Thread(target=self._drain, daemon=True).start()
            return
        line = self.proc.stderr.readline()  # completer-lsp: listening on tcp://127.0.0.1:PORT
        assert b"listening on" in line, line
        threading.Thread(target=self._drain, daemon=True).start()
        self.port = port = int(line.rsplit(b":", 1)[1])
        if kind == "tcp":
            self.connect()
            return
        from websockets.sync.client import connect

        self.ws = self.exits.enter_context(connect(f"ws://127.0.0.1:{port}", max_size=None))
        self.send = self._ws_send
        self.raw = None

        def read_ws():
            try:
                while True:
                    self.out.add(self.ws.recv())
            except Exception:  # noqa: BLE001 - the connection closed
                return
        threading.Thread(target=read_ws, daemon=True).start()

    def connect(self) -> socket.socket:
        """A (new) TCP connection, now the one `send` and `raw` use."""
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.raw = self.sock.sendall
        self.send = lambda body: self.raw(frame(body))
        threading.Thread(target=read_stream, args=(self.sock.makefile("rb"), self.out), daemon=True).start()
        return self.sock

    def _ws_send(self, body: bytes) -> None:
        """A text message when the body is UTF-8, else a binary one: each is one JSON-RPC body."""
        try:
            self.ws.send(body.decode())
        except UnicodeDecodeError:
            self.ws.send(body)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    def request(self, msg_id, method: str, params=None, timeout: float = 60.0) -> dict:
        self.send(rpc(id=msg_id, method=method, params=params))
        return self.out.wait(msg_id, self.proc, timeout)

    def rss_kb(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS:")).split()[1])

    def close(self) -> None:
        self.exits.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def big_document(rng: random.Random) -> str:
    """About 10 MB of Python-looking lines."""
    lines = [f"    value_{i} = compute(value_{i - 1}, {rng.randrange(10**6)})  # step {i}\n" for i in range(165_000)]
    return "def big():\n" + "".join(lines)


def big_cycle(srv: Transport, rng: random.Random, n: int) -> None:
    """The 10 MB document reopened, edited and completed in."""
    srv.send(rpc(method="textDocument/didOpen", params={"textDocument": {
        "uri": BIG, "languageId": "python", "version": 1, "text": big_document(rng)}}))
    at = {"line": 9, "character": 0}
    srv.send(rpc(method="textDocument/didChange", params={"textDocument": {"uri": BIG, "version": 2},
                 "contentChanges": [{"range": {"start": at, "end": at}, "text": "    x = "}]}))
    got = srv.request(f"big{n}", "textDocument/inlineCompletion", {
        "textDocument": {"uri": BIG}, "position": {"line": 9, "character": 8}, "context": {"triggerKind": 1}})
    assert isinstance(got["result"]["items"], list), got


@pytest.mark.parametrize("kind", ["stdio", "tcp", "ws"])
def test_transport_survives_hostile_frames(kind):
    rng = random.Random({"stdio": 1, "tcp": 2, "ws": 3}[kind])
    srv = Transport(kind)
    try:
        assert srv.request("early", "completer/stats")["error"]["code"] == -32002  # before initialize
        init = srv.request("init", "initialize", {"capabilities": {}, "initializationOptions": {
            "max_new_tokens": 24, "debounce_ms": 0, "device": "cpu", "warmup": False}})
        assert "inlineCompletionProvider" in init["result"]["capabilities"]
        srv.send(rpc(method="initialized", params={}))
        for uri, text in ((PROBE, (ROOT / "examples" / "stack.py").read_text()), (URI, "def f(x):\n    \n"),
                          (BIG, big_document(rng))):
            srv.send(rpc(method="textDocument/didOpen", params={"textDocument": {
                "uri": uri, "languageId": "python", "version": 1, "text": text}}))
        big_cycle(srv, rng, 0)  # once before the first RSS reading: what a 10 MB document costs
        rss, sent, probes = [], 0, 0
        while sent < FRAMES:
            for body in bodies(rng, sent):
                if srv.raw is not None and rng.random() < 0.1:
                    srv.raw(broken_frame(rng, body))
                else:
                    srv.send(body)
                sent += 1
            if sent // EVERY > probes:
                probes += 1
                if sent // EVERY in (8, 16):  # the 10 MB document again: reopened, edited, completed in
                    big_cycle(srv, rng, probes)
                if srv.raw is not None:
                    srv.raw(b"\r\n" * 512)  # ends a frame cut short or a header left without its body
                got = srv.request(f"probe{probes}", "textDocument/inlineCompletion", {
                    "textDocument": {"uri": PROBE}, "position": {"line": 7, "character": 19},
                    "context": {"triggerKind": 1}})
                assert got["result"]["items"] and got["result"]["items"][0]["insertText"].strip(), got
                rss.append(srv.rss_kb())
        stats = srv.request("stats", "completer/stats")["result"]
        assert stats["engine"] == "ready" and stats["shown"] >= probes
        assert srv.request("info", "completer/documentInfo", {"uri": BIG})["result"]["length"] > 10**7
        # the lowest of the last four readings against the lowest of the first four: a leak lifts every
        # reading, while one taken before the server gave back what a 10 MB message and the work it
        # started freed (completer.memory.AFTER_S, the last 10 s after it) still holds its copies —
        # so read again once the server says none is pending; a leak stays up
        first, last = min(rss[:4]), min(rss[-4:])
        hang = time.monotonic() + 300  # a bound on a hang only: the wait ends on the server's word
        while srv.request(f"mem{time.monotonic()}", "completer/stats")["result"]["memory_give_backs_pending"]:
            assert time.monotonic() < hang, "the server's memory give-backs never ran"
            time.sleep(0.5)
        last = min(last, srv.rss_kb())
        assert last < 1.1 * first, f"RSS grew from {first} kB to {last} kB: {rss}"
        assert srv.proc.poll() is None
        srv.request("down", "shutdown")
        assert srv.request("after", "completer/stats")["error"]["code"] == -32600
        srv.send(rpc(method="exit"))
        assert srv.proc.wait(timeout=30) == 0
        log = b"".join(srv.stderr).decode(errors="replace")
        assert "message handling failed" not in log, log[-3000:]
        print(f"{kind}: {sent} frames, {srv.out.count} messages back, RSS {rss}")
    finally:
        srv.close()


def test_tcp_serves_one_client_at_a_time_and_a_new_session_after_it():
    with socket.socket() as s:  # an engine address where nothing listens: the load fails at once
        s.bind(("127.0.0.1", 0))
        engine = f"ws://127.0.0.1:{s.getsockname()[1]}"
    srv = Transport("tcp")
    try:
        options = {"capabilities": {}, "initializationOptions": {"engine": engine, "engine_retries": 0}}
        assert "result" in srv.request("init", "initialize", options)
        srv.send(rpc(method="initialized", params={}))
        srv.send(rpc(method="textDocument/didOpen", params={"textDocument": {
            "uri": URI, "languageId": "python", "version": 1, "text": "x = 1\n"}}))
        assert srv.request("s1", "completer/stats")["result"]["documents"] == 1
        with socket.create_connection(("127.0.0.1", srv.port)) as second:  # refused while the first is on
            second.settimeout(30)
            assert second.recv(1) == b""
        srv.sock.shutdown(socket.SHUT_RDWR)  # the first client leaves; the next one has a session of its own
        for attempt in range(20):  # refused until the server has seen the first one go
            srv.connect()
            try:
                assert "result" in srv.request(f"init{attempt}", "initialize", {  # a root the OS refuses: a warning
                    **options, "rootUri": "file:///tmp/\u0000" + "a" * 5000}, timeout=2)
                break
            except AssertionError:
                srv.sock.close()
        else:
            raise AssertionError("no new session after the first client left")
        stats = srv.request("s2", "completer/stats")["result"]
        assert stats["documents"] == 0 and stats["loads"] == 1  # a new session; the engine is kept
        srv.send(rpc(method="exit"))  # without shutdown: exit code 1, as the spec says
        assert srv.proc.wait(timeout=30) == 1
    finally:
        srv.close()


def test_each_malformed_message_gets_the_error_the_spec_names():
    with socket.socket() as s:  # an engine address where nothing listens: no models to load
        s.bind(("127.0.0.1", 0))
        engine = f"ws://127.0.0.1:{s.getsockname()[1]}"
    srv = Transport("stdio")
    try:
        assert srv.request("early", "completer/stats")["error"]["code"] == -32002  # before initialize
        assert "result" in srv.request("init", "initialize", {
            "capabilities": {}, "initializationOptions": {"engine": engine, "engine_retries": 0}})
        srv.send(rpc(method="initialized", params={}))
        anonymous = [  # the id cannot be read: error with id null
            (frame(b"{not json"), -32700), (frame(b'\xff\xfe{"a": 1}'), -32700),
            (frame(b"[" * 65 + b"]" * 65), -32700), (frame(b"[" * 100_000), -32700),  # too deep, at any depth
            (frame(b"5"), -32600), (frame(rpc(id=1.5, method="completer/stats")), -32600),
            (frame(b'{"jsonrpc": "2.0"}'), -32600), (frame(b"", 64 * 2**20 + 1), -32600)]  # over the size limit
        for raw, code in anonymous:
            before = len(srv.out.anonymous)
            srv.raw(raw)
            srv.request("sync", "completer/stats")  # answered in order: anything for `raw` came first
            assert [e["error"]["code"] for e in srv.out.anonymous[before:]] == [code], raw[:80]
        named = [(json.dumps({"jsonrpc": "1.0", "id": "v", "method": "completer/stats"}).encode(), "v", -32600),
                 (rpc(id="p", method="textDocument/inlineCompletion", params={"textDocument": 5}), "p", -32602),
                 (rpc(id="d", method="completer/documentInfo", params={"uri": 5}), "d", -32602),
                 (rpc(id="m", method="no/such/method"), "m", -32601),
                 (rpc(id="i", method="initialize", params={"capabilities": {}}), "i", -32600)]  # only once
        for body, msg_id, code in named:
            srv.send(body)
            assert srv.out.wait(msg_id, srv.proc)["error"]["code"] == code, body
        before = len(srv.out.anonymous)  # notifications and responses are never answered
        for body in (rpc(method="textDocument/didOpen", params={"textDocument": 5}), rpc(method="$/cancelRequest"),
                     rpc(method="no/such/notification"), rpc(id=12345, result={"x": 1}), rpc(id=7, error="bad")):
            srv.send(body)
        srv.request("sync", "completer/stats")
        assert srv.out.anonymous[before:] == [] and not srv.out.by_id
        srv.request("down", "shutdown")
        assert srv.request("after", "completer/stats")["error"]["code"] == -32600
        srv.send(rpc(method="exit"))
        assert srv.proc.wait(timeout=30) == 0
    finally:
        srv.close()
