"""Fault shapes a real server cannot be made to produce on demand, from a small fake HTTP server:
a stream cut mid-way, 429 with Retry-After, 5xx, malformed JSON and SSE, an error event
mid-stream, a server that never answers, a refused connection. Each is one EngineError with the
right code and a message for the user (never the API key), and the next request recovers.
And servers that never stop sending (an SSE line without end, deltas past `max_tokens`, a stream
that trickles past the deadline, an endless JSON body; a WebSocket server with a huge frame,
endless chunks or no answer): each read is bounded and the client hangs up."""
from __future__ import annotations

import threading
import time

import pytest
from helpers import free_port
from helpers.fake_http import KEY, clients

from completer.client import EngineError
from completer.remote import connect

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
    from completer.remote.transport import Cancelled

    c = connect(f"openai:http://127.0.0.1:{free_port()}/v1", retries=50)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        c.inner.http.open("GET", "/v1/models", cancel=cancel)
    assert c.stats()["retries"] == 0


@pytest.mark.parametrize("name", ["llamacpp", "openai"])
def test_cancel_while_the_server_has_not_answered_hangs_up(fake, name):
    from completer.edits.formats import EditPrompt

    c = clients(fake, timeout_ms=5000)[name]
    c.warm_start()
    fake.mode = "silent"
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    got = c.rewrite(EditPrompt((), "a.py", "x = 1\n"), fmt="sweep", doc_key="a.py", cancel=cancel)
    assert got.stop_reason == "cancelled" and time.monotonic() - t0 < 2.0  # not the 5 s timeout
    assert fake.hung_up.wait(5)  # the server saw the hang-up: its slot is free
    assert c.stats()["cancelled_streams"] == 1 and c.stats()["errors"] == 0


@pytest.mark.parametrize("name", ["llamacpp", "openai"])
def test_headers_that_never_end_are_cut_at_the_deadline(fake, name):
    c = clients(fake, timeout_ms=400)[name]
    c.warm_start()
    fake.mode = "slow_headers"  # no socket timeout fires: a header every 50 ms
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        c.warmup("x = ", "", doc_key="w.py")
    assert err.value.code == "unavailable" and "within 400 ms" in err.value.message
    assert time.monotonic() - t0 < 2.0
    assert fake.hung_up.wait(5)


def test_the_remote_package_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys, completer.remote, completer.remote.ws, completer.remote.llamacpp, completer.remote.openai; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


@pytest.mark.parametrize("name", ["llamacpp", "openai"])
def test_an_sse_line_without_end_is_cut_at_its_cap(fake, name):
    from completer.remote.transport import MAX_LINE

    c = clients(fake)[name]
    c.warm_start()
    fake.mode = "long_line"
    with pytest.raises(EngineError) as err:
        c.complete("x = ", "", doc_key="l.py")
    assert err.value.code == "internal" and "SSE line" in err.value.message
    assert fake.hung_up.wait(30)
    assert fake.sent < MAX_LINE + 8 * 2**20  # what the client read, plus what the sockets' buffers took


@pytest.mark.parametrize("name", ["llamacpp", "openai"])
def test_deltas_past_max_tokens_stop_at_the_limit(fake, name):
    from completer.remote.transport import read_limit

    c = clients(fake)[name]
    fake.mode = "endless"
    r = c.complete("x = ", "", doc_key="e.py", max_new=16)
    assert r.stop_reason == "length" and r.text == "a" * read_limit(16)
    assert fake.hung_up.wait(30)  # the client hung up: the server stops generating


@pytest.mark.parametrize("name", ["llamacpp", "openai"])
def test_a_stream_still_going_at_the_deadline_fails(fake, name):
    c = clients(fake, timeout_ms=400)[name]
    c.warm_start()
    fake.mode = "trickle"  # a delta every 50 ms: 80 of them (the limit for 64 tokens) would take 4 s
    with pytest.raises(EngineError) as err:
        c.complete("x = ", "", doc_key="t.py", max_new=64)
    assert err.value.code == "unavailable" and "within 400 ms" in err.value.message
    assert fake.hung_up.wait(30)
    fake.mode = "ok"
    assert c.complete("def f(a, b):\n    return ", "\n", doc_key="h.py").text == "a + b"


@pytest.mark.parametrize("name", ["llamacpp", "openai"])
def test_an_endless_json_answer_is_cut_at_its_cap(fake, name):
    from completer.remote.transport import MAX_BODY

    c = clients(fake)[name]
    c.warm_start()
    fake.mode = "huge_json"
    with pytest.raises(EngineError) as err:
        c.warmup("x = ", "", doc_key="j.py")
    assert err.value.code == "internal" and "MiB" in err.value.message
    assert fake.hung_up.wait(30)
    assert fake.sent < MAX_BODY + 16 * 2**20  # the cap, plus what the kernel's socket buffers took
    # (autotuned up to several MiB a side: 8.6 MiB past the cap was seen on a loaded machine)


class FakeWs:
    """A WebSocket server that says hello (ready) and answers each complete frame by `mode`:
    "huge" (one frame over the client's MAX_FRAME), "endless" (chunks until cancelled),
    "silent" (nothing). It records the frame types it received."""

    def __init__(self, mode: str):
        import msgpack
        from websockets.sync.server import serve

        self.mode, self.seen, self.pack, self.unpack = mode, [], msgpack.packb, msgpack.unpackb
        self.server = serve(self._handle, "127.0.0.1", 0, max_size=None, compression=None)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"

    def _handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        from completer.remote.ws import MAX_FRAME

        cancelled: set = set()
        try:
            for data in ws:
                msg = self.unpack(data)
                self.seen.append(msg["type"])
                if msg["type"] == "hello":
                    ws.send(self.pack({"type": "hello", "ready": True, "model": {"max_new_tokens": 16}}))
                elif msg["type"] == "cancel":
                    cancelled.add(msg["id"])
                elif msg["type"] == "complete" and self.mode == "huge":
                    ws.send(self.pack({"type": "chunk", "id": msg["id"], "text": "x" * MAX_FRAME}))
                elif msg["type"] == "complete" and self.mode == "endless":
                    threading.Thread(target=self._chunks, args=(ws, msg["id"], cancelled), daemon=True).start()
        except ConnectionClosed:
            pass

    def _chunks(self, ws, id_, cancelled: set) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while id_ not in cancelled:
                ws.send(self.pack({"type": "chunk", "id": id_, "text": "a"}))
        except ConnectionClosed:
            pass

    def close(self) -> None:
        self.server.shutdown()


@pytest.mark.parametrize("mode", ["huge", "endless", "silent"])
def test_a_websocket_server_that_never_stops_is_bounded(mode):
    from completer.remote.transport import read_limit

    fake = FakeWs(mode)
    c = connect(fake.url, timeout_ms=1500, retries=0)
    try:
        if mode == "endless":
            r = c.complete("x = ", "", doc_key="w.py", max_new=8)
            assert r.stop_reason == "length" and r.text == "a" * read_limit(8)
        else:
            with pytest.raises(EngineError) as err:
                c.complete("x = ", "", doc_key="w.py")
            assert err.value.code == "unavailable"
            assert ("1009" in err.value.message) if mode == "huge" else ("within 1500 ms" in err.value.message)
        for _ in range(200):  # the cancel frame may arrive after the call returned
            if mode == "huge" or "cancel" in fake.seen:
                break
            time.sleep(0.01)
        assert mode == "huge" or "cancel" in fake.seen  # the server was told to stop
    finally:
        c.close()
        fake.close()


@pytest.mark.parametrize("mode", ["superseded", "superseded_event"])
def test_superseded_by_our_server_is_not_a_fault(fake, mode):
    """completer serve answers a request a newer one for the same `user` superseded with 409 or an
    error event "superseded": the OpenAI client returns it as superseded, and a warmup as done."""
    c = clients(fake)["openai"]
    c.warm_start()
    fake.mode = mode
    r = c.complete("x = ", "", doc_key="s.py")
    assert r.stop_reason == "superseded" and r.text == ("a" if mode == "superseded_event" else "")
    if mode == "superseded":  # a warmup is a plain request
        assert c.warmup("x = ", "", doc_key="s.py") == 0
    assert c.stats()["errors"] == 0
