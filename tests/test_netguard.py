"""completer.netguard's rules as each listener applies them, over real sockets on 127.0.0.1: a real
`completer serve` refuses a foreign Host name (DNS rebinding) and answers a non-ASCII
Authorization header with 401; the real `completer-lsp --ws` refuses browser pages and foreign
Hosts at the handshake and, with a token, a first message without it; `--tcp` closes on an HTTP
request (a page's POST) and takes the token in initialize; neither starts on a non-loopback
host without a token. The rules' edge cases are tables at the end."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from completer import netguard

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "t0ken"
ENV = {**{k: v for k, v in os.environ.items() if k != "COMPLETER_TOKEN"}, "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def listening(cmd: list[str], ready: str | None = None) -> tuple[subprocess.Popen, int]:
    """Start a server process; (process, port) once it says where it listens (and `ready`)."""
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT)
    port = None
    for line in p.stderr:
        if m := re.search(r"listening on \w+://[^:]+:(\d+)", line):
            port = int(m.group(1))
        if port is not None and (ready is None or ready in line):
            return p, port
    raise AssertionError(f"{cmd} did not start")


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    p.wait(timeout=30)


def raw_get(port: int, path: str, headers: dict[str, bytes]) -> tuple[int, bytes]:
    """GET with headers sent as the given bytes (http.client would refuse some of them)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        head = b"".join(k.encode() + b": " + v + b"\r\n" for k, v in headers.items())
        s.sendall(f"GET {path} HTTP/1.1\r\n".encode() + head + b"Connection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if data.startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in data:
                break  # switched to WebSocket: the connection stays open, nothing more to read
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


# -- completer serve ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def serve(tiny_pair):
    target, draft = tiny_pair
    p, port = listening([sys.executable, "-m", "completer.cli", "serve", "--port", "0", "--target", str(target),
                         "--draft", str(draft), "--allow-hosts", "devbox.lan"], ready="models ready")
    yield port
    stop(p)


@pytest.fixture(scope="module")
def serve_with_token(tiny_pair):
    target, draft = tiny_pair
    p, port = listening([sys.executable, "-m", "completer.cli", "serve", "--port", "0", "--target", str(target),
                         "--draft", str(draft), "--token", TOKEN], ready="models ready")
    yield port
    stop(p)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/health", "/ws"])
def test_serve_refuses_a_rebound_host_name(serve, path):
    status, body = raw_get(serve, path, {"Host": f"attacker.example:{serve}".encode()})
    assert status == 403 and b"Host" in body and b"target" not in body


@pytest.mark.slow
@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "devbox.lan:{port}",
                                  "LOCALHOST."])
def test_serve_accepts_addresses_localhost_and_allowed_names(serve, host):
    status, body = raw_get(serve, "/v1/models", {"Host": host.format(port=serve).encode()})
    assert status == 200 and b'"data"' in body


@pytest.mark.slow
@pytest.mark.parametrize("auth", ["Bearer caf\xe9".encode("latin-1"), "Bearer €".encode(), b"Bearer \xff\xfe"])
def test_serve_answers_a_non_ascii_authorization_with_401(serve_with_token, auth):
    port = serve_with_token
    for path in ("/v1/models", "/metrics"):
        status, body = raw_get(port, path, {"Host": b"127.0.0.1", "Authorization": auth})
        assert status == 401 and b"Traceback" not in body, (path, body)
    with pytest.raises(InvalidStatus) as e:  # the WebSocket upgrade too, and the server lives on
        connect(f"ws://127.0.0.1:{port}/ws", additional_headers={"Authorization": auth.decode("latin-1")})
    assert e.value.response.status_code == 401
    assert raw_get(port, "/v1/models", {"Host": b"127.0.0.1", "Authorization": f"Bearer {TOKEN}".encode()})[0] == 200


# -- completer-lsp --ws / --tcp --------------------------------------------------------------------
def lsp(*args: str) -> tuple[subprocess.Popen, int]:
    return listening([sys.executable, "-m", "lsp.server", "--log-level", "ERROR", *args])


def initialize(options: dict | None = None) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"processId": None, "rootUri": None, "capabilities": {},
                                  "initializationOptions": options or {}}})


@pytest.mark.slow
def test_ws_refuses_web_pages_and_foreign_hosts():
    p, port = lsp("--ws", "0")
    try:
        url = f"ws://127.0.0.1:{port}"
        for kw in ({"origin": "https://evil.example"}, {"origin": "null"}):
            with pytest.raises(InvalidStatus) as e:
                connect(url, **kw)
            assert e.value.response.status_code == 403, kw
        upgrade = {"Upgrade": b"websocket", "Connection": b"Upgrade", "Sec-WebSocket-Version": b"13",
                   "Sec-WebSocket-Key": b"dGhlIHNhbXBsZSBub25jZQ=="}
        assert raw_get(port, "/", {"Host": b"attacker.example", **upgrade})[0] == 403  # rebound
        assert raw_get(port, "/", {"Host": f"127.0.0.1:{port}".encode(), **upgrade})[0] == 101
        with pytest.raises(InvalidStatus) as e:  # a second Host: ambiguous, refused, not a crash
            connect(url, additional_headers={"Host": "attacker.example"})
        assert e.value.response.status_code == 400
        with connect(url, origin="http://localhost:5173") as ws:  # a page of the user's own dev server
            ws.send(initialize())
            assert "capabilities" in json.loads(ws.recv(timeout=60))["result"]
    finally:
        stop(p)


@pytest.mark.slow
def test_ws_with_a_token_wants_it_at_the_handshake_or_in_initialize():
    p, port = lsp("--ws", "0", "--token", TOKEN)
    try:
        url = f"ws://127.0.0.1:{port}"
        with connect(url) as ws:  # no token: the first message is refused and the connection closed
            ws.send(initialize())
            reply = json.loads(ws.recv(timeout=60))
            assert reply["id"] == 1 and reply["error"]["code"] == -32001 and "token" in reply["error"]["message"]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=60)
        with pytest.raises(InvalidStatus) as e:
            connect(f"{url}/?token=wrong")
        assert e.value.response.status_code == 401
        for kw, options in (({"additional_headers": {"Authorization": f"Bearer {TOKEN}"}}, {}),
                            ({}, {"token": TOKEN}), ({"uri": f"{url}/?token={TOKEN}"}, {})):
            with connect(kw.pop("uri", url), **kw) as ws:
                ws.send(initialize(options))
                assert "capabilities" in json.loads(ws.recv(timeout=60))["result"], kw
    finally:
        stop(p)


def read_message(f) -> dict | None:
    length = None
    while (line := f.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return None if length is None else json.loads(f.read(length))


def framed(body: str) -> bytes:
    return f"Content-Length: {len(body.encode())}\r\n\r\n{body}".encode()


@pytest.mark.slow
def test_tcp_closes_on_an_http_request_and_takes_the_token_in_initialize():
    p, port = lsp("--tcp", "0", "--token", TOKEN)
    try:
        body = initialize({"token": TOKEN})
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:  # what a page's fetch() sends
            s.sendall(f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
            assert s.recv(65536) == b""  # closed, nothing answered
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(framed(initialize()))
            f = s.makefile("rb")
            assert read_message(f)["error"]["code"] == -32001 and read_message(f) is None
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(framed(body))
            assert "capabilities" in read_message(s.makefile("rb"))["result"]
    finally:
        stop(p)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["--tcp", "--ws"])
@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.com"])
def test_no_token_off_loopback_refuses_to_start(transport, host):
    r = subprocess.run([sys.executable, "-m", "lsp.server", transport, "0", "--host", host], capture_output=True,
                       text=True, env=ENV, cwd=ROOT, timeout=120, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"completer-lsp: error: {netguard.listen_refusal(host, None)}"
    assert "--token" in r.stderr and "loopback" in r.stderr


# -- the rules' tables -----------------------------------------------------------------------------
@pytest.mark.parametrize("host,bound,allow,ok", [
    (None, "127.0.0.1", (), True), ("127.0.0.1:7421", "127.0.0.1", (), True), ("[::1]:80", "::1", (), True),
    ("localhost", "127.0.0.1", (), True), ("10.0.0.5:7421", "0.0.0.0", (), True),
    ("attacker.example", "127.0.0.1", (), False), ("attacker.example:7421", "0.0.0.0", (), False),
    ("devbox", "devbox", (), True), ("DevBox.:1", "127.0.0.1", ("devbox",), True),
    ("x.localhost", "127.0.0.1", (), False), ("anything", "127.0.0.1", ("*",), True),
    ("[bad", "127.0.0.1", (), False), ("", "127.0.0.1", (), False), ("a:b:c", "127.0.0.1", (), False),
])
def test_host_allowed(host, bound, allow, ok):
    assert netguard.host_allowed(host, bound, allow) is ok


@pytest.mark.parametrize("origin,allow,ok", [
    (None, (), True), ("http://localhost:5173", (), True), ("https://127.0.0.1", (), True),
    ("http://[::1]:8080", (), True), ("https://evil.example", (), False), ("null", (), False),
    ("file://", (), False), ("http://localhost:bad", (), False), ("https://app.example", ("https://app.example",), True),
    ("https://evil.example", ("*",), True), ("http://localhost.evil.example", (), False),
])
def test_origin_allowed(origin, allow, ok):
    assert netguard.origin_allowed(origin, allow) is ok


def test_tokens_and_request_lines():
    assert netguard.token_matches("s", "s") and not netguard.token_matches(None, "s")
    assert not netguard.token_matches("caf\udce9", "café") and not netguard.token_matches("\ud800", "s")
    assert netguard.given_token("Bearer  abc ", None) == "abc" and netguard.given_token("Basic abc", None) is None
    assert netguard.given_token("Bearer abc", "q") == "q"
    assert netguard.looks_like_http(b"POST / HTTP/1.1\r\n") and netguard.looks_like_http(b"GET /x?y HTTP/1.0\r\n")
    assert not netguard.looks_like_http(b"Content-Length: 10\r\n")
    assert netguard.listen_refusal("127.0.0.2", None) is None and netguard.listen_refusal("::1", None) is None
    assert netguard.listen_refusal("0.0.0.0", "t") is None and "--token" in netguard.listen_refusal("0.0.0.0", None)
