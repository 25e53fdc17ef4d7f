"""What the two HTTP clients (llama-server's /infill, OpenAI-compatible /v1/completions) share:
one request with bounded retries, the SSE stream read under the caller's `stop_text` and `cancel`,
and every fault turned into one `EngineError` written for the user. Stdlib only (http.client).

A streamed request is read in the calling thread; a watcher thread closes its socket when
`cancel` is set or `stop_text` fires, so the server sees the disconnect and stops generating
(tokens not paid for). The API key goes in the Authorization header and nowhere else: never in a
message, a log line or `stats()`.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from ..client import EngineError

BACKOFF_S = 0.1     # first retry after this; doubles per retry
BACKOFF_MAX_S = 2.0
TOKEN_MEMO = 16384  # the syntax layer counts line by line: each distinct line is tokenized once


class TokenMemo:
    """Token counts by text, least recently used dropped past TOKEN_MEMO; thread-safe."""

    def __init__(self, size: int = TOKEN_MEMO):
        self.size, self.lock, self.counts = size, threading.Lock(), OrderedDict()

    def get(self, text: str, count: Callable[[str], int]) -> int:
        with self.lock:
            if text in self.counts:
                self.counts.move_to_end(text)
                return self.counts[text]
        n = count(text)  # outside the lock: a request to the server
        with self.lock:
            self.counts[text] = n
            while len(self.counts) > self.size:
                self.counts.popitem(last=False)
        return n


class Http:
    """One server: `base` (scheme://host:port[/path]), per-request timeout, retries for
    connection failures. No state survives a failure: the next request connects afresh."""

    def __init__(self, base: str, *, name: str, api_key: str | None, timeout_ms: int, retries: int):
        u = urlsplit(base)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise EngineError(code="bad_request", message=f"not an http(s) URL: {base!r}")
        self.https, self.host, self.port = u.scheme == "https", u.hostname, u.port
        self.path = u.path.rstrip("/")
        self.base = f"{u.scheme}://{u.netloc}{self.path}"
        self.name = name  # "llama-server", "the OpenAI-compatible server": used in messages
        self.timeout = timeout_ms / 1e3
        self.retries = retries
        self._api_key = api_key
        self.broken = False  # a connection failed since the client last read the server's setup
        self.counters = {"requests": 0, "errors": 0, "retries": 0, "cancelled_streams": 0}

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _headers(self, body: bytes | None) -> dict:
        h = {"Accept": "application/json, text/event-stream"}
        if body is not None:
            h["Content-Type"] = "application/json"
        if self._api_key:
            h["Authorization"] = f"Bearer {self._api_key}"
        return h

    def open(self, method: str, path: str, body: dict | None = None,
             cancel: threading.Event | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one request and return (connection, response) once its status is 2xx; the caller
        reads and closes. Connection failures are retried `retries` times with back-off."""
        data = None if body is None else json.dumps(body).encode()
        self.counters["requests"] += 1
        attempt = 0
        while True:
            conn = self._connect()
            try:
                conn.request(method, self.path + path, body=data, headers=self._headers(data))
                resp = conn.getresponse()
            except OSError as e:  # refused, reset, unknown host, timeout
                conn.close()
                err = self._down(e)
                # only a connection that failed is retried: a slow server would only get slower
                if not isinstance(e, ConnectionError) or attempt == self.retries:
                    self.counters["errors"] += 1
                    raise err from None
                delay = min(BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S)
                if cancel is not None and cancel.wait(delay):
                    self.counters["errors"] += 1
                    raise err from None
                if cancel is None:
                    time.sleep(delay)
                attempt += 1
                self.counters["retries"] += 1
                continue
            except http.client.HTTPException as e:  # not HTTP (RemoteDisconnected is an OSError: above)
                conn.close()
                self.counters["errors"] += 1
                raise self._malformed(path, str(e).encode()) from None
            if 200 <= resp.status < 300:
                return conn, resp
            try:
                raw = resp.read(64 * 1024)
            except (OSError, http.client.HTTPException):
                raw = b""
            conn.close()
            self.counters["errors"] += 1
            raise self._status_error(resp, raw, path)

    def json(self, method: str, path: str, body: dict | None = None) -> dict | list:
        """A plain request whose whole answer is one JSON document."""
        conn, resp = self.open(method, path, body)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.counters["errors"] += 1
            raise self._cut(e) from None
        finally:
            conn.close()
        try:
            return json.loads(raw)
        except ValueError:
            self.counters["errors"] += 1
            raise self._malformed(path, raw) from None

    def stream(self, path: str, body: dict, cancel: threading.Event | None,
               done: Callable[[dict], bool]) -> Iterator[dict]:
        """POST `body` and yield each SSE `data:` event as a dict until `done(event)` is true or
        `data: [DONE]` arrives. Closing the generator (the caller stopped reading) or setting
        `cancel` closes the socket. A stream that ends before its last event is a fault."""
        conn, resp = self.open("POST", path, body, cancel)
        if "event-stream" not in (resp.getheader("Content-Type") or ""):
            raw = resp.read(200) if not resp.closed else b""
            conn.close()
            self.counters["errors"] += 1
            raise self._malformed(path, raw)
        finished = threading.Event()

        def watch() -> None:  # closes the socket when the caller's cancel is set
            while not finished.is_set():
                if cancel.wait(0.01):
                    _shutdown(conn)
                    return

        if cancel is not None:
            threading.Thread(target=watch, name="completer-http-cancel", daemon=True).start()
        complete = False
        try:
            for event in self._events(resp, path):
                if event is None:  # data: [DONE]
                    complete = True
                    return
                yield event
                if done(event):
                    complete = True
                    return
            if cancel is not None and cancel.is_set():
                return
            self.counters["errors"] += 1
            self.broken = True
            raise EngineError(code="unavailable", message=f"{self.name} at {self.base} closed the stream "
                                                           "before the completion finished")
        except (OSError, http.client.HTTPException) as e:
            if cancel is not None and cancel.is_set():
                return  # our own watcher closed it
            self.counters["errors"] += 1
            raise self._cut(e) from None
        finally:
            finished.set()
            if not complete:
                self.counters["cancelled_streams"] += 1
            _shutdown(conn)
            conn.close()

    def _events(self, resp: http.client.HTTPResponse, path: str) -> Iterator[dict | None]:
        """SSE: `data:` lines (possibly several per event), blank line ends an event; comments
        (`:`) and other fields are ignored. An `error` object in an event is raised."""
        lines: list[str] = []
        while True:
            raw = resp.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.startswith("data:"):
                lines.append(line[5:].removeprefix(" "))
                continue
            if line or not lines:
                continue
            data, lines = "\n".join(lines), []
            if data.strip() == "[DONE]":
                yield None
                return
            try:
                event = json.loads(data)
            except ValueError:
                raise self._malformed(path, data.encode()) from None
            if not isinstance(event, dict):
                raise self._malformed(path, data.encode())
            if "error" in event:
                raise self._server_error(event["error"], path)
            yield event

    # -- faults → EngineError ----------------------------------------------------------------
    def _down(self, e: BaseException) -> EngineError:
        self.broken = True
        if isinstance(e, TimeoutError | socket.timeout):
            why = f"no answer within {self.timeout * 1e3:.0f} ms (engine_timeout_ms)"
        elif isinstance(e, ConnectionRefusedError):
            why = "connection refused: is it running?"
        elif isinstance(e, socket.gaierror):
            why = f"unknown host {self.host!r}"
        else:
            why = f"{type(e).__name__}: {e}"
        return EngineError(code="unavailable", message=f"cannot reach {self.name} at {self.base} ({why})")

    def _cut(self, e: BaseException) -> EngineError:
        self.broken = True
        if isinstance(e, TimeoutError | socket.timeout):
            return EngineError(code="unavailable", message=f"{self.name} at {self.base} stopped answering "
                                                           f"for {self.timeout * 1e3:.0f} ms (engine_timeout_ms)")
        return EngineError(code="unavailable", message=f"the connection to {self.name} at {self.base} "
                                                       f"broke mid-reply ({type(e).__name__})")

    def _malformed(self, path: str, raw: bytes) -> EngineError:
        shown = raw[:120].decode("utf-8", "replace")
        return EngineError(code="internal", message=f"{self.name} at {self.base} sent a malformed reply to "
                                                     f"{path}: {shown!r}")

    def _server_error(self, err, path: str, status: int | None = None) -> EngineError:
        msg = err.get("message") if isinstance(err, dict) else str(err)
        status = status or (err.get("code") if isinstance(err, dict) and isinstance(err.get("code"), int) else None)
        return _by_status(status or 500, f"{self.name} at {self.base} ({path}): {str(msg)[:300]}", None)

    def _status_error(self, resp: http.client.HTTPResponse, raw: bytes, path: str) -> EngineError:
        try:
            body = json.loads(raw)
            err = body.get("error", body) if isinstance(body, dict) else body
            msg = (err.get("message") or err.get("detail")) if isinstance(err, dict) else None
            msg = str(msg or body)
        except ValueError:
            msg = raw[:200].decode("utf-8", "replace").strip() or resp.reason
        return _by_status(resp.status, f"{self.name} at {self.base} answered HTTP {resp.status} to {path}: "
                                       f"{msg[:300]}", _retry_after(resp.getheader("Retry-After")))


def _by_status(status: int, message: str, retry_after: float | None) -> EngineError:
    if status in (401, 403):
        return EngineError(code="unauthorized", message=message + " (check engine_api_key or COMPLETER_API_KEY)")
    if status == 429:
        return EngineError(code="overloaded", message=message, retry_after=retry_after)
    if status == 404 and "model" in message.lower():
        return EngineError(code="model", message=message)
    if status == 503 and "load" in message.lower():
        return EngineError(code="not_ready", message=message, retry_after=retry_after)
    if status in (502, 503, 504):
        return EngineError(code="unavailable", message=message, retry_after=retry_after)
    if 400 <= status < 500:
        return EngineError(code="bad_request", message=message)
    return EngineError(code="internal", message=message)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare for APIs and not parsed)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def _shutdown(conn: http.client.HTTPConnection) -> None:
    """Unblock a read in another thread: shut the socket down (close alone does not wake it)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def follow(events: Iterator[dict], text_of: Callable[[dict], str], stop_text, on_text,
           cancel: threading.Event | None, t0: float) -> tuple[str, dict, str | None, float | None]:
    """Read a completion stream: (text, last event, "stop" | "cancelled" | None, ttft_ms).
    Stops reading (which closes the stream) as soon as `stop_text` fires or `cancel` is set;
    `on_text` gets the deltas, never past the cut."""
    text, last, ttft = "", {}, None
    try:
        for event in events:
            last = event
            delta = text_of(event)
            if not delta:
                continue
            if ttft is None:
                ttft = (time.perf_counter() - t0) * 1e3
            sent, text = len(text), text + delta
            cut = stop_text(text) if stop_text is not None else None
            if cut is not None:
                if on_text is not None and cut > sent:
                    on_text(text[sent:cut])
                return text[:cut], last, "stop", ttft
            if on_text is not None:
                on_text(delta)
            if cancel is not None and cancel.is_set():
                break
    finally:
        events.close()  # a generator left early closes its socket: the server stops generating
    return text, last, "cancelled" if cancel is not None and cancel.is_set() else None, ttft
