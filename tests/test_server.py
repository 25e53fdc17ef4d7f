"""`completer serve` over the wire: a real subprocess on the tiny pair, a real websockets client.
Streaming, cancellation, malformed frames (each answered, the server keeps serving), auth and
origins, /health and /metrics, and the refusal to bind beyond loopback without a token."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import msgpack
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def server(tiny_pair):
    target, draft = tiny_pair
    p = subprocess.Popen(
        [sys.executable, "-m", "completer.cli", "serve", "--port", "0", "--token", TOKEN,
         "--max-frame-bytes", "4096", "--target", str(target), "--draft", str(draft),
         "--max-new-tokens", "24"], stderr=subprocess.PIPE, text=True, env=_env())
    port = None
    for line in p.stderr:  # the bound port, then readiness
        m = re.search(r"listening on ws://[^:]+:(\d+)/ws", line)
        port = int(m.group(1)) if m else port
        if "models ready" in line or "error" in line:
            break
    assert port is not None and p.poll() is None, "the server did not start"
    yield f"127.0.0.1:{port}"
    p.terminate()
    assert p.wait(timeout=30) == 0


async def ask(ws, frame) -> dict:
    await ws.send(frame if isinstance(frame, (bytes, str)) else msgpack.packb(frame))
    return msgpack.unpackb(await ws.recv())


async def run(ws, frame) -> tuple[list[str], dict]:
    """Send a complete frame; (chunk texts, done frame)."""
    await ws.send(msgpack.packb(frame))
    chunks = []
    while True:
        r = msgpack.unpackb(await ws.recv())
        assert r["id"] == frame["id"], r
        if r["type"] == "chunk":
            chunks.append(r["text"])
        else:
            return chunks, r


async def test_streams_a_completion(server):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        hello = await ask(ws, {"type": "hello", "client": "test"})
        assert hello["server"] == "completer" and hello["ready"] and hello["model"]["ctx"] == 256
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}
        frame = {"type": "complete", "id": 1, "doc": "a.py", "prefix": "def add(a, b):\n    return ",
                 "suffix": "\n"}
        chunks, done = await run(ws, frame)
        assert done["type"] == "done" and not done["cancelled"]
        assert chunks and "".join(chunks) == done["text"]
        st = done["stats"]
        assert st["new_tokens"] == 24 and st["prompt_tokens"] == st["prefill_tokens"] > 0
        for k in ("ttft_ms", "total_ms", "target_forwards", "accepted_per_forward", "queue_ms"):
            assert k in st
        # the same document again: its KV cache is kept (no prefill beyond the last token)
        _, again = await run(ws, {**frame, "id": "two", "prefix": frame["prefix"] + "a", "stream": False,
                                  "language": "python"})
        assert again["stats"].get("prefill_tokens", 0) <= 3 or again["stats"].get("type_through")


async def test_cancel_and_supersede(server):
    async with connect(f"ws://{server}/ws?token={TOKEN}") as ws:
        base = {"type": "complete", "doc": "b.py", "prefix": "import os\n", "suffix": "", "max_new_tokens": 120}
        await ws.send(msgpack.packb({**base, "id": 1}))
        await ws.send(msgpack.packb({"type": "cancel", "id": 1}))
        frames = []
        while not any(f["type"] == "done" for f in frames):
            frames.append(msgpack.unpackb(await ws.recv()))
        assert frames[-1]["cancelled"] is True
        await ws.send(msgpack.packb({"type": "cancel", "id": "never-sent"}))  # ignored, no reply
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


@pytest.mark.parametrize("frame, code", [
    (b"\xc1\x00", "bad_frame"),                                   # not msgpack
    (msgpack.packb([1, 2, 3]), "bad_frame"),                      # not a map
    (msgpack.packb({"id": 1}), "bad_frame"),                      # no type
    ("a text frame", "bad_frame"),
    (msgpack.packb({"type": "teleport", "id": 9}), "unknown_type"),
    (msgpack.packb({"type": "complete", "id": 2, "doc": 5, "prefix": "x"}), "bad_request"),
    (msgpack.packb({"type": "complete", "id": 3, "doc": "d"}), "bad_request"),
    (msgpack.packb({"type": "complete", "id": [1], "doc": "d", "prefix": "x"}), "bad_request"),
    (msgpack.packb({"type": "complete", "id": 4, "doc": "d", "prefix": "x", "max_new_tokens": 10**6}),
     "bad_request"),
    (msgpack.packb({"type": "complete", "id": 5, "doc": "d", "prefix": "x", "stream": "yes"}), "bad_request"),
    (msgpack.packb({"type": "feedback", "id": 1, "accepted": "no"}), "bad_request"),
    (msgpack.packb({"type": "warmup", "doc": "d"}), "bad_request"),
    (msgpack.packb({"type": "ping", "pad": "x" * 5000}), "too_large"),
])
async def test_malformed_frames_get_errors_and_the_server_keeps_serving(server, frame, code):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        err = await ask(ws, frame)
        assert err["type"] == "error" and err["code"] == code and err["message"]
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}  # the connection survives


async def test_oversized_beyond_the_hard_limit_closes_only_that_connection(server):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        await ws.send(b"\x00" * (64 * 1024))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


async def test_auth_and_origins(server):
    async with connect(f"ws://{server}/ws") as ws:  # no token yet: only hello may authenticate
        assert (await ask(ws, {"type": "ping"}))["code"] == "unauthorized"
        assert (await ask(ws, {"type": "complete", "id": 1, "doc": "d", "prefix": "x"}))["code"] == "unauthorized"
        assert (await ask(ws, {"type": "hello", "token": "wrong"}))["code"] == "unauthorized"
        assert (await ask(ws, {"type": "hello", "token": TOKEN}))["type"] == "hello"
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}
    with pytest.raises(InvalidStatus, match="401"):
        async with connect(f"ws://{server}/ws?token=wrong"):
            pass
    with pytest.raises(InvalidStatus, match="403"):
        async with connect(f"ws://{server}/ws", origin="https://evil.example", additional_headers=AUTH):
            pass
    async with connect(f"ws://{server}/ws", origin="http://localhost:5173", additional_headers=AUTH) as ws:
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


def test_health_and_metrics(server):
    with urllib.request.urlopen(f"http://{server}/health") as r:
        assert r.status == 200 and json.load(r)["status"] == "ready"
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(f"http://{server}/metrics")
    with urllib.request.urlopen(urllib.request.Request(f"http://{server}/metrics", headers=AUTH)) as r:
        text = r.read().decode()
    for name in ("completer_ttft_seconds_bucket", 'completer_stage_seconds_count{stage="prefill"}',
                 "completer_tokens_per_second", "completer_accepted_per_forward", "completer_engine_cache_hits",
                 "completer_kv_bytes", "completer_queue_waiting", "process_resident_memory_bytes"):
        assert name in text


def test_health_is_503_while_loading():
    from websockets.server import ServerProtocol

    from completer.server import ServerConfig, Service

    class Conn:
        def respond(self, status, text):
            return ServerProtocol().reject(status, text)

    class Req:
        path, headers = "/health", {}

    svc = Service(ServerConfig(), make_engine=lambda: None)
    assert svc.process_request(Conn(), Req()).status_code == 503


def test_non_loopback_bind_without_token_refuses_to_start():
    env = {k: v for k, v in _env().items() if k != "COMPLETER_TOKEN"}
    p = subprocess.run([sys.executable, "-m", "completer.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 2 and "--token" in p.stderr
