"""A real `completer serve` subprocess, its WebSocket frames and its /metrics."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import msgpack

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def serve_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    """`completer serve ARGS` on a free port, once its models are ready → (process, host:port)."""
    p = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--port", "0", *args],
                         stderr=subprocess.PIPE, text=True, env=serve_env())
    port = None
    for line in p.stderr:  # the bound port, then readiness
        m = re.search(r"listening on ws://[^:]+:(\d+)/ws", line)
        port = int(m.group(1)) if m else port
        if "models ready" in line or "error" in line:
            break
    assert port is not None and p.poll() is None, "the server did not start"
    return p, f"127.0.0.1:{port}"


def stop_server(p: subprocess.Popen) -> None:
    p.terminate()
    assert p.wait(timeout=30) == 0


async def ask(ws, frame) -> dict:
    """Send one frame (a dict is packed; bytes and str go as they are) → the next frame back."""
    await ws.send(frame if isinstance(frame, (bytes, str)) else msgpack.packb(frame))
    return msgpack.unpackb(await ws.recv())


def metrics(server: str, headers: dict = AUTH) -> str:
    with urllib.request.urlopen(urllib.request.Request(f"http://{server}/metrics", headers=headers)) as r:
        return r.read().decode()


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0
