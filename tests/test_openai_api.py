"""The OpenAI-compatible endpoints of `completer serve`, through plain HTTP clients against a real
server on the embedded pair: a completion (plain and streamed) equals the WebSocket's for the same
prompt, stop sequences, /v1/models, the token and Origin rules, OpenAI's error shapes (400, 401,
403, 404, 413), and a client that hangs up mid-stream cancels its generation."""
from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request

import msgpack
import pytest
from test_server import metric, start_server, stop_server
from websockets.asyncio.client import connect

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "def fib(n):\n    if n < 2:\n        return n\n    return "
SUFFIX = "\n\n\nprint(fib(10))\n"


@pytest.fixture(scope="module")
def server():
    p, addr = start_server("--token", TOKEN, "--max-frame-bytes", "65536", "--max-new-tokens", "32")
    yield addr
    stop_server(p)


def call(server: str, path: str, body=None, headers=AUTH, raw: bytes | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or a POST."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{server}{path}", data=data,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def stream(server: str, body: dict) -> list:
    """The events of a streamed completion: chunk objects, then "[DONE]"."""
    conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), AUTH)
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = [line[len(b"data: "):].strip() for line in r if line.startswith(b"data: ")]
    conn.close()
    return [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]


def is_error(status: int, body: dict, want_status: int, code: str | None = None) -> bool:
    e = body["error"]
    return (status == want_status and set(e) == {"message", "type", "param", "code"} and bool(e["message"])
            and (code is None or e["code"] == code))


async def test_a_completion_equals_the_websocket_one(server):
    status, models = await asyncio.to_thread(call, server, "/v1/models")
    assert status == 200 and models["object"] == "list"
    model = models["data"][0]["id"]
    body = {"model": model, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 24, "temperature": 0, "user": "fib"}
    status, r = await asyncio.to_thread(call, server, "/v1/completions", body)
    assert status == 200 and r["object"] == "text_completion" and r["model"] == model and r["id"]
    (choice,) = r["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] in ("stop", "length")
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        await ws.send(msgpack.packb({"type": "complete", "id": 1, "doc": "fib.py", "prefix": PREFIX,
                                     "suffix": SUFFIX, "max_new_tokens": 24, "stream": False}))
        done = msgpack.unpackb(await ws.recv())
    assert done["type"] == "done" and choice["text"] == done["text"] != ""  # greedy: the same tokens
    u = r["usage"]
    assert u["completion_tokens"] == done["stats"]["new_tokens"] > 0
    assert u["prompt_tokens"] == done["stats"]["prompt_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_streamed_equals_plain_and_stop_sequences_cut_both(server):
    body = {"prompt": "import os\nimport sys\n", "max_tokens": 24}
    status, r = call(server, "/v1/completions", body)
    text = r["choices"][0]["text"]
    assert status == 200 and len(text) >= 6
    events = stream(server, body)
    assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    chunks = events[:-1]
    assert len({e["id"] for e in chunks}) == 1 and all(e["object"] == "text_completion" for e in chunks)
    assert [e["choices"][0]["finish_reason"] for e in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]
    assert "".join(e["choices"][0]["text"] for e in chunks) == text
    stop = text[4:6]
    cut = text[: text.find(stop)]
    status, r = call(server, "/v1/completions", {**body, "stop": [stop, "never-generated"]})
    assert status == 200 and r["choices"][0]["text"] == cut and r["choices"][0]["finish_reason"] == "stop"
    chunks = stream(server, {**body, "stop": stop})[:-1]
    assert "".join(e["choices"][0]["text"] for e in chunks) == cut  # not even part of the stop went out
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body, raw, status, code", [
    (None, b"{not json", 400, "bad_request"),
    (None, b"[" * 100_00 + b"]" * 100_00, 400, "bad_request"),          # nesting beyond the parser
    ([1, 2], None, 400, "bad_request"),
    ({"suffix": "x"}, None, 400, "bad_request"),                        # no prompt
    ({"prompt": ["a", "b"]}, None, 400, "bad_request"),
    ({"prompt": "x", "max_tokens": "9"}, None, 400, "bad_request"),
    ({"prompt": "x", "max_tokens": 10**6}, None, 400, "bad_request"),
    ({"prompt": "x", "temperature": 7}, None, 400, "bad_request"),
    ({"prompt": "x", "stop": ["a", 1]}, None, 400, "bad_request"),
    ({"prompt": "x", "stream": "yes"}, None, 400, "bad_request"),
    ({"prompt": "x", "n": 2}, None, 400, "bad_request"),
    ({"prompt": "x", "model": "gpt-4"}, None, 404, "model_not_found"),
    ({"prompt": "x" * 70_000}, None, 413, "too_large"),
])
def test_bad_requests_get_openai_errors(server, body, raw, status, code):
    got, r = call(server, "/v1/completions", body, raw=raw)
    assert is_error(got, r, status, code), r
    assert call(server, "/v1/models")[0] == 200  # the server keeps serving


def test_token_origin_and_paths(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert is_error(*call(server, "/v1/models", headers=headers), 401)
        assert is_error(*call(server, "/v1/completions", {"prompt": "x"}, headers=headers), 401)
    assert call(server, "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert is_error(*call(server, "/v1/models", headers={**AUTH, "Origin": "https://evil.example"}), 403)
    req = urllib.request.Request(f"http://{server}/v1/models", headers={**AUTH, "Origin": "http://localhost:5173"})
    with urllib.request.urlopen(req) as r:  # a local page may read the answer
        assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert is_error(*call(server, "/v1/chat/nope"), 404)


def test_hanging_up_mid_stream_cancels_the_generation(server):
    def cancelled() -> float:
        with urllib.request.urlopen(urllib.request.Request(f"http://{server}/metrics", headers=AUTH)) as r:
            return metric(r.read().decode(), "completer_engine_stops_cancelled")

    before = cancelled()
    conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "import os\nimport sys\n", "max_tokens": 256,
                                                        "stream": True, "user": "gone"}), AUTH)
    r = conn.getresponse()
    assert r.status == 200 and next(line for line in r if line.startswith(b"data: "))
    r.close()  # hang up after the first chunk: 256 tokens take far longer than one
    conn.close()
    deadline = time.monotonic() + 60
    while cancelled() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled() == before + 1


def test_a_full_queue_is_429_with_a_retry_hint():
    """One generation at a time and one waiting: of two more requests one waits, the other is
    refused at once with 429 and Retry-After; once the first client hangs up the waiting one runs."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    p, server = start_server("--token", TOKEN, "--max-batch", "1", "--max-queue", "1")
    try:
        conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "import os\n", "max_tokens": 256,
                                                            "stream": True, "user": "a"}), AUTH)
        r = conn.getresponse()
        assert next(line for line in r if line.startswith(b"data: "))  # generating (256 tokens: seconds)
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(call_with_headers, server, {"prompt": "x = ", "max_tokens": 4, "user": u})
                    for u in ("b", "c")]
            first = wait(futs, return_when=FIRST_COMPLETED).done.pop()
            status, headers, body = first.result()
            assert is_error(status, body, 429, "overloaded") and int(headers["Retry-After"]) >= 1
            r.close()
            conn.close()  # the first client hangs up: the waiting request runs
            (other,) = [f for f in futs if f is not first]
            assert other.result()[0] == 200
    finally:
        stop_server(p)


def call_with_headers(server: str, body: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(f"http://{server}/v1/completions", data=json.dumps(body).encode(), headers=AUTH)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.load(e)
