"""A small fake HTTP engine (llama-server's /infill and /props, OpenAI's /v1) that records what it
is sent and answers in the mode a test sets: the ordinary answers, and the faults and endless
streams a real server cannot be made to produce on demand. The `fake` fixture in conftest.py
starts one per test."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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

INFILL_NONE = {"content": "", "stop": True, "timings": {"cache_n": 0, "prompt_n": 5}}  # n_predict: 0
OPENAI_ONE = {"choices": [{"text": "a", "index": 0, "finish_reason": "length"}],
              "usage": {"prompt_tokens": 8, "completion_tokens": 1}}


class Fake(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "ok"       # what POSTs get (GETs always answer /props and /models)
        self.seen_auth: list[str | None] = []
        self.bodies: list[dict] = []       # the JSON bodies of the POSTs, in order
        self.hang = threading.Event()
        self.sent = 0                      # bytes of the last endless answer written before the client hung up
        self.hung_up = threading.Event()   # the client closed an endless answer
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
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"))
        self.server.seen_auth.append(self.headers.get("Authorization"))
        mode, openai = self.server.mode, self.path.startswith("/v1/")
        if self.path == "/tokenize":
            self._send(200, b'{"tokens": [1, 2, 3]}')
        elif mode == "ok" and self.server.bodies[-1].get("stream") is False:  # a warmup
            self._send(200, json.dumps(OPENAI_ONE if openai else INFILL_NONE).encode())
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
        elif mode == "silent":  # a non-streamed answer still being computed: nothing until the client hangs up
            self.connection.settimeout(30)
            if self.rfile.read(1) == b"":
                self.server.hung_up.set()
        elif mode == "slow_headers":  # a status line, then a header every 50 ms, never the blank line
            try:
                self.wfile.write(b"HTTP/1.0 200 OK\r\n")
                while not self.server.hang.wait(0.05):
                    self.wfile.write(b"X-Wait: 1\r\n")
            except OSError:
                self.server.hung_up.set()
        elif mode == "superseded":  # our completer serve: a newer request with the same `user` took over
            self._send(409, b'{"error": {"message": "superseded", "type": "invalid_request_error", "param": null, '
                            b'"code": "superseded"}}', headers={"x-should-retry": "false"})
        elif mode == "superseded_event":
            self._send(200, sse(chunk("a"), {"error": {"message": "superseded", "code": "superseded"}}),
                       "text/event-stream")
        elif mode in ENDLESS:
            self._endless(*ENDLESS[mode])

    def _endless(self, ctype: str, head: bytes, piece: bytes, pause: float) -> None:
        """`head`, then `piece` again and again until the client hangs up (or the test ends)."""
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.end_headers()
        self.server.sent = 0
        try:
            self.wfile.write(head)
            while not self.server.hang.is_set():
                self.wfile.write(piece)
                self.server.sent += len(piece)
                if pause:
                    self.server.hang.wait(pause)
        except OSError:
            self.server.hung_up.set()


ENDLESS = {  # mode → (content type, head, piece repeated, pause between pieces in s)
    "long_line": ("text/event-stream", b'data: {"content": "', b"x" * 65536, 0.0),
    "endless": ("text/event-stream", b"", sse(chunk("a"), {"content": "a", "stop": False}), 0.0),
    "trickle": ("text/event-stream", b"", sse(chunk("a"), {"content": "a", "stop": False}), 0.05),
    "huge_json": ("application/json", b'{"content": "', b"x" * 65536, 0.0),
}


def clients(fake: Fake, **kw):
    return {"llamacpp": connect(f"llamacpp:{fake.base}", api_key=KEY, **kw),
            "openai": connect(f"openai:{fake.base}/v1", api_key=KEY, **kw)}
