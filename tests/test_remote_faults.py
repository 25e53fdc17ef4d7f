"""Fault shapes a real server cannot be made to produce on demand, from a small fake HTTP server:
a stream cut mid-way, 429 with Retry-After, 5xx, malformed JSON and SSE, an error event
mid-stream, a server that never answers, a refused connection. Each is one EngineError with the
right code and a message for the user (never the API key), and the next request recovers."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_remote_llamacpp import free_port

from completer.client import EngineError
from completer.remote import connect

KEY = "sk-fake-secret-1234"
PROPS = {"default_generation_settings": {"n_ctx": 512}, "total_slots": 2, "model_alias": "fake"}
MODELS = {"object": "list", "data": [{"id": "qwen2.5-coder-fake", "object": "model", "owned_by": "fake"}]}


def sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def chunk(text: str) -> dict:
    return {"choices": [{"text": text, "index": 0, "finish_reason": None}]}


INFILL_OK = sse({"content": "a", "stop": False}, {"content": " + b", "stop": False},
                {"content": "", "stop": True, "stop_type": "eos", "tokens_predicted": 2,
                 "timings": {"cache_n": 3, "prompt_n": 5}})
OPENAI_OK = sse(chunk("a"), chunk(" + b"), {"choices": [{"text": "", "index": 0, "finish_reason": "stop"}],
                                            "usage": {"prompt_tokens": 8, "completion_tokens": 2}}, b"[DONE]")


class Fake(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "ok"       # what POSTs get (GETs always answer /props and /models)
        self.seen_auth: list[str | None] = []
        self.hang = threading.Event()
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # no Content-Length on streams: the body ends when we close

    def log_message(self, *a) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json", headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.seen_auth.append(self.headers.get("Authorization"))
        self._send(200, json.dumps(PROPS if self.path == "/props" else MODELS).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen_auth.append(self.headers.get("Authorization"))
        mode, openai = self.server.mode, self.path.startswith("/v1/")
        if self.path == "/tokenize":
            self._send(200, b'{"tokens": [1, 2, 3]}')
        elif mode == "ok":
            self._send(200, OPENAI_OK if openai else INFILL_OK, "text/event-stream")
        elif mode == "cut":  # two deltas, then the connection closes: no final event, no [DONE]
            self._send(200, sse(chunk("a"), chunk(" +")) if openai else sse({"content": "a", "stop": False}),
                       "text/event-stream")
        elif mode == "bad_sse":
            self._send(200, b"data: {\"content\": \"a\", \"stop\": fal\n\n", "text/event-stream")
        elif mode == "bad_json":
            self._send(200, b"<html>a proxy page</html>", "text/html")
        elif mode == "error_event":
            self._send(200, sse({"error": {"code": 500, "message": "out of memory in the KV cache"}}),
                       "text/event-stream")
        elif mode == "429":
            self._send(429, b'{"error": {"code": 429, "message": "rate limited"}}', headers={"Retry-After": "7"})
        elif mode == "loading":
            self._send(503, b'{"error": {"code": 503, "message": "Loading model"}}')
        elif mode == "500":
            self._send(500, b'{"error": {"code": 500, "message": "boom"}}')
        elif mode == "502":
            self._send(502, b"Bad Gateway", "text/plain")
        elif mode == "no_model":  # vLLM's answer to an unknown model
            self._send(404, b'{"object": "error", "message": "The model `x` does not exist.", "code": 404}')
        elif mode == "hang":
            self.server.hang.wait(30)


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.hang.set()
    f.shutdown()
    f.server_close()


def clients(fake: Fake, **kw):
    return {"llamacpp": connect(f"llamacpp:{fake.base}", api_key=KEY, **kw),
            "openai": connect(f"openai:{fake.base}/v1", api_key=KEY, **kw)}


FAULTS = [  # mode, code, words in the message
    ("cut", "unavailable", "closed the stream"),
    ("bad_sse", "internal", "malformed"),
    ("bad_json", "internal", "malformed"),
    ("error_event", "internal", "out of memory"),
    ("429", "overloaded", "rate limited"),
    ("loading", "not_ready", "Loading model"),
    ("500", "internal", "boom"),
    ("502", "unavailable", "HTTP 502"),
    ("no_model", "model", "does not exist"),
]


@pytest.mark.parametrize("mode,code,words", FAULTS)
def test_each_fault_is_one_clear_error_then_recovery(fake, mode, code, words):
    for name, c in clients(fake).items():
        assert c.complete("def f(a, b):\n    return ", "\n", doc_key="f.py").text == "a + b"
        fake.mode = mode
        with pytest.raises(EngineError) as err:
            c.complete("def f(a, b):\n    return ", "\n", doc_key="g.py")
        e = err.value
        assert e.code == code, (name, e.code, e.message)
        assert words in e.message
        assert KEY not in e.message and KEY not in str(e)
        if mode == "429":
            assert e.retry_after == 7.0
        fake.mode = "ok"  # the server is back: no sticky broken state
        assert c.complete("def f(a, b):\n    return ", "\n", doc_key="h.py").text == "a + b"
    assert set(fake.seen_auth) == {f"Bearer {KEY}"}  # every request carried the key


def test_slow_server_times_out(fake):
    fake.mode = "hang"
    for c in clients(fake, timeout_ms=200, retries=3).values():
        with pytest.raises(EngineError) as err:
            c.complete("x = ", "", doc_key="s.py")
        assert err.value.code == "unavailable" and "200 ms" in err.value.message
        assert c.stats()["retries"] == 0  # a slow server is not retried: it would only get slower


def test_refused_is_retried_with_backoff_then_clear():
    port = free_port()  # nothing listens there
    c = connect(f"llamacpp:http://127.0.0.1:{port}", retries=2)
    with pytest.raises(EngineError) as err:
        c.warm_start()
    assert err.value.code == "unavailable" and "refused" in err.value.message and str(port) in err.value.message
    assert c.stats()["retries"] == 2


def test_cancel_during_backoff_gives_up_at_once():
    c = connect(f"openai:http://127.0.0.1:{free_port()}/v1", retries=50)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(EngineError):
        c.inner.http.open("GET", "/v1/models", cancel=cancel)
    assert c.stats()["retries"] == 0


def test_the_remote_package_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys, completer.remote, completer.remote.ws, completer.remote.llamacpp, completer.remote.openai; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
