"""`completer serve` as a process (completer/serve/app.py): auth and origins, /health and
/metrics, /health while the models load, and the refusal to bind beyond loopback without a token.
Its WebSocket frames: test_serve_ws.py."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import msgpack
import pytest
from helpers.serve import AUTH, TOKEN, ask, metrics, serve_env
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus


@pytest.fixture
def server(served) -> str:
    return served[1]


@pytest.mark.slow
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


async def _one_completion(server: str) -> None:
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        await ws.send(msgpack.packb({"type": "complete", "id": 1, "doc": "metrics.py", "prefix": "x = "}))
        while msgpack.unpackb(await ws.recv())["type"] != "done":
            pass


@pytest.mark.slow
def test_health_and_metrics(server):
    # the stage and speed metrics appear with a completion: one first (this file runs before
    # test_serve_ws.py, on the same session server)
    asyncio.run(_one_completion(server))
    with urllib.request.urlopen(f"http://{server}/health") as r:
        assert r.status == 200 and json.load(r)["status"] == "ok"  # llama-server's word (llama.vscode reads it)
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(f"http://{server}/metrics")
    text = metrics(server)
    for name in ("completer_ttft_seconds_bucket", 'completer_stage_seconds_count{stage="prefill"}',
                 "completer_tokens_per_second", "completer_accepted_per_forward", "completer_ready 1.0",
                 "completer_engine_cache_hits", "completer_engine_kv_bytes", "completer_engine_queue_waiting",
                 "process_resident_memory_bytes"):
        assert name in text
    # every number of the engine's stats() is exported under its own name, whatever it is
    assert re.search(r"^completer_engine_requests \d", text, re.MULTILINE)


async def test_health_is_503_while_loading():
    """A service whose models have not loaded, on a real socket."""
    from aiohttp import web

    from completer.config import ServeConfig
    from completer.serve.app import EngineService

    runner = web.AppRunner(EngineService(ServeConfig(), make_engine=lambda: None).app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        with pytest.raises(urllib.error.HTTPError, match="503") as e:
            await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/health")
        assert json.load(e.value)["status"] == "loading"
        async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            hello = await ask(ws, {"type": "hello"})
            assert hello["ready"] is False and hello["model"] == {}
            err = await ask(ws, {"type": "complete", "id": 1, "doc": "d", "prefix": "x"})
            assert err["code"] == "not_ready" and err["retry_after_ms"] > 0
    finally:
        await runner.cleanup()


def test_non_loopback_bind_without_token_refuses_to_start():
    env = {k: v for k, v in serve_env().items() if k != "COMPLETER_TOKEN"}
    p = subprocess.run([sys.executable, "-m", "completer.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 2 and "--token" in p.stderr
