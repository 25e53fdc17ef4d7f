"""Fuzz the real server process over raw stdio framing: thousands of malformed, mistyped and random
messages (and broken frames), then check that it still answers and exits cleanly."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.fuzz import frame, junk  # the same hostile values for every transport

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def msg(**kw) -> bytes:
    return frame(json.dumps({"jsonrpc": "2.0", **kw}).encode())


class Reader(threading.Thread):
    """Collects the server's framed responses by id."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.by_id, self.count = stream, {}, 0

    def run(self):
        while True:
            line = self.stream.readline()
            if not line:
                return
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":")[1])
                while self.stream.readline().strip():  # other headers (Content-Type)
                    pass
                m = json.loads(self.stream.read(n))
                self.count += 1
                if isinstance(m.get("id"), (str, int)):
                    self.by_id[m["id"]] = m

    def wait(self, msg_id, timeout=60.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if msg_id in self.by_id:
                return self.by_id[msg_id]
            time.sleep(0.01)
        raise AssertionError(f"no response to {msg_id!r}")


METHODS = ["initialize", "initialized", "textDocument/didOpen", "textDocument/didChange",
           "textDocument/didClose", "textDocument/inlineCompletion", "completer/stats",
           "completer/feedback", "completer/documentInfo", "completer/context", "completer/nextEdit",
           "$/cancelRequest",
           "workspace/unknown", "textDocument/didSave", "workspace/didChangeWatchedFiles",
           "workspace/didChangeConfiguration", "textDocument/completion", ""]


def valid_ish(rng: random.Random, i: int) -> bytes:
    """Well-formed JSON-RPC with random or nearly right params."""
    uri = "file:///fz.py"
    pos = {"line": rng.randrange(-2, 12), "character": rng.randrange(-2, 40)}
    choice = rng.randrange(7)
    if choice == 0:
        return msg(method="textDocument/didChange", params={
            "textDocument": {"uri": uri, "version": i},
            "contentChanges": [{"range": {"start": pos, "end": pos}, "text": rng.choice(["x", "\n", "😀", "("])}]})
    if choice == 1:
        return msg(id=f"fz{i}", method="textDocument/inlineCompletion", params={
            "textDocument": {"uri": uri if rng.random() < 0.2 else "file:///nope"}, "position": pos,
            "context": {"triggerKind": 2}})
    if choice == 2:
        return msg(method="$/cancelRequest", params={"id": f"fz{i - 1}"})
    if choice == 3:
        return msg(id=i, method=rng.choice(METHODS), params=junk(rng))
    if choice == 4:
        return msg(method=rng.choice(METHODS), params=junk(rng))
    if choice == 5:
        return msg(id=junk(rng), method=rng.choice(METHODS))
    return msg(method="completer/feedback", params=junk(rng))


def broken(rng: random.Random) -> bytes:
    """Bytes that are not a well-formed message."""
    choice = rng.randrange(8)
    if choice == 0:
        return frame(b"{not json")
    if choice == 1:
        return frame(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
    if choice == 2:
        return frame(json.dumps(junk(rng)).encode())  # JSON, but not JSON-RPC
    if choice == 3:
        return frame(b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"}', 10)  # short length
    if choice == 4:
        return b"Content-Type: nonsense\r\n\r\n"  # a header block without a length
    if choice == 5:
        return b"garbage line\r\n"
    if choice == 6:
        return frame(b"", 10**12)  # an absurd length: skipped, not buffered
    return frame(json.dumps({"jsonrpc": "1.0", "id": 5, "method": "shutdown"}).encode())  # ignored


def test_fuzz_real_server(tiny_pair):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "lsp.server"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    reader = Reader(proc.stdout)
    reader.start()
    send = lambda b: (proc.stdin.write(b), proc.stdin.flush())
    try:
        # before initialize: requests get ServerNotInitialized, notifications are dropped
        send(msg(id="early", method="completer/stats"))
        assert reader.wait("early")["error"]["code"] == -32002
        target, draft = tiny_pair
        send(msg(id="init", method="initialize", params={
            "capabilities": {}, "initializationOptions": {
                "target": str(target), "draft": str(draft), "max_new_tokens": 4, "debounce_ms": 30,
                "warmup": False}}))
        assert "capabilities" in reader.wait("init")["result"]
        send(msg(method="initialized", params={}))
        send(msg(method="textDocument/didOpen", params={"textDocument": {
            "uri": "file:///fz.py", "languageId": "python", "version": 1, "text": "def f(x):\n    \n"}}))
        rng = random.Random(1234)
        for i in range(2000):
            send(valid_ish(rng, i) if rng.random() < 0.6 else broken(rng))
        # a frame cut short leaves its tail glued to the next header: resync costs at most one
        send(b"\r\n\r\n" + msg(id="sync", method="completer/stats"))
        send(msg(id="sync2", method="completer/stats"))
        reader.wait("sync2")
        # after the storm the server still keeps documents exactly and answers a real completion
        after = "def g(a):\n    return a\n"
        send(msg(method="textDocument/didOpen", params={"textDocument": {
            "uri": "file:///after.py", "languageId": "python", "version": 1, "text": after}}))
        at = {"line": 1, "character": 12}
        send(msg(method="textDocument/didChange", params={"textDocument": {"uri": "file:///after.py", "version": 2},
                                                          "contentChanges": [{"range": {"start": at, "end": at},
                                                                              "text": " + 1"}]}))
        send(msg(id="info", method="completer/documentInfo", params={"uri": "file:///after.py"}))
        assert reader.wait("info")["result"]["length"] == len(after) + 4
        send(msg(id="real", method="textDocument/inlineCompletion", params={
            "textDocument": {"uri": "file:///after.py"}, "position": {"line": 2, "character": 0},
            "context": {"triggerKind": 1}}))
        assert isinstance(reader.wait("real")["result"]["items"], list)
        assert proc.poll() is None, "the server died"
        # mistyped params of a known request: InvalidParams, not silence
        send(msg(id="bad", method="textDocument/inlineCompletion", params={"textDocument": 5}))
        assert reader.wait("bad")["error"]["code"] in (-32602, -32603)
        send(msg(id="down", method="shutdown"))
        reader.wait("down")
        send(msg(id="after", method="completer/stats"))
        assert reader.wait("after")["error"]["code"] == -32600
        send(msg(method="exit"))
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
