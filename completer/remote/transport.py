"""What the two HTTP clients (llama-server's /infill, OpenAI-compatible /v1/completions) share:
one request with bounded retries, the SSE stream read under the caller's `stop_text` and `cancel`,
and every fault turned into one `EngineError` written for the user. Stdlib only (http.client).

A request is read in the calling thread; from its connection on, a watcher thread shuts its socket
when `cancel` is set or the request's deadline (`engine_timeout_ms` from its start) passes, and a
stream's reader does when `stop_text` fires, so the server sees the disconnect and stops
generating (tokens not paid for). The watch covers the wait for the status line too: a server
answering a non-streamed request sends nothing until it is done. Nothing a server sends is read
without a bound: a line, an event and a JSON answer have a byte cap, and a stream ends after
`read_limit(max_new)` text events, however many the server keeps sending.
The API key goes in the Authorization header and nowhere else: never in a message, a log line
or `stats()`.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from .. import errors
from ..client import EngineError, StopReason, stop_reason
from ..edits.formats import EditFormat
from ..edits.formats import detect as detect_edit_format

BACKOFF_S = 0.1     # first retry after this; doubles per retry
BACKOFF_MAX_S = 2.0
TOKEN_MEMO = 16384  # the syntax layer counts line by line: each distinct line is tokenized once
MAX_LINE = 1 << 20      # bytes of one SSE line or event: a delta is a few bytes, a final event a few KB
MAX_BODY = 16 << 20     # bytes of one JSON answer (/v1/models, /tokenize of a long text)
MAX_TOKEN_CHARS = 256   # characters one token may decode to, for the bound on a stream's text


SAMPLING = ("max_new_tokens", "temperature", "top_p", "seed")  # options a remote request carries


GATES = ("min_confidence", "next_edit_min_confidence")  # the confidence gates' options (completer/confidence.py)


def set_gates(client: Any, values: dict) -> None:
    """The confidence gates' options among `values` set on `client` (None: off; a remote model has
    no calibration here), applied on the log-probabilities its server sends."""
    for name in GATES:
        if name in values:
            setattr(client, name, None if values[name] is None else live_options(values, (name,))[name])


def live_options(values: dict, names: tuple[str, ...]) -> dict:
    """The options among `values` that are in `names`, checked against the schema (config.py)
    and in its types; the others are not the caller's to apply. Raises EngineError
    ("bad_request") naming a value outside the schema."""
    from ..config import OPTIONS, coerce

    out = {}
    for name in names:
        if name in values:
            ok, value = coerce(OPTIONS[name], values[name], values)
            if not ok or value is None:
                raise EngineError(code="bad_request", message=f"{name} = {values[name]!r} is not allowed")
            out[name] = value
    return out


def edit_format(name: str, *, fim: str | None, model: str) -> EditFormat:
    """The next-edit format `name` (or "auto": from the model's FIM format and name) of a remote
    model; EngineError("bad_request") for an unknown name."""
    try:
        return detect_edit_format(name, fim=fim, model=model)
    except ValueError as e:
        raise EngineError(str(e), "bad_request") from None


def read_limit(max_new: int) -> int:
    """Text events (≈ tokens) read from a stream asked for `max_new` tokens: a server that sends
    more ignored `max_tokens`/`n_predict`; the margin lets one split a token across events."""
    return max_new + max(8, max_new // 4)


class Cancelled(Exception):
    """The caller's `cancel` was set before the answer's status line came (or during a back-off):
    not a fault; a stream ends without events."""


class Superseded(Exception):
    """Our `completer serve` said a newer request for the same document (`user`) took over: HTTP
    409 or an error event with code "superseded". Not a fault: the caller's answer is obsolete."""


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
        self.timeout, self.retries = timeout_ms / 1e3, retries
        self._api_key = api_key
        self.broken = False  # a connection failed since the client last read the server's setup
        self.counters = {"requests": 0, "errors": 0, "retries": 0, "cancelled_streams": 0}

    def reconfigure(self, **values) -> None:
        """engine_timeout_ms and engine_retries apply from the next request on."""
        live = live_options(values, ("engine_timeout_ms", "engine_retries"))
        if "engine_timeout_ms" in live:
            self.timeout = live["engine_timeout_ms"] / 1e3
        self.retries = live.get("engine_retries", self.retries)

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
             cancel: threading.Event | None = None) -> Reply:
        """Send one request and return its answer once its status is 2xx; the caller reads and
        closes. The answer is watched (_Watch) from the connection on, its headers included:
        `cancel` raises Cancelled, the deadline (`timeout` after this call) the "late" error.
        Connection failures are retried `retries` times with back-off."""
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + self.timeout
        self.counters["requests"] += 1
        attempt = 0
        while True:
            conn, watch, failed = self._connect(), None, None
            try:
                conn.connect()
                # conn.sock now: getresponse may hand it to the response and forget it
                sock, watch = conn.sock, _Watch(conn.sock, cancel, deadline)
                conn.request(method, self.path + path, body=data, headers=self._headers(data))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:  # refused, reset, unknown host, timeout; not HTTP
                failed = e
            if watch is not None and watch.shut.is_set():  # ours (headers cut short may even parse as an answer)
                conn.close()
                if not watch.expired.is_set():
                    raise Cancelled
                self.counters["errors"] += 1
                raise self._late(path)
            if failed is not None:
                conn.close()
                if watch is not None:
                    watch.stop()
                if isinstance(failed, http.client.HTTPException):  # RemoteDisconnected is an OSError: below
                    self.counters["errors"] += 1
                    raise self._malformed(path, str(failed).encode())
                err = self._down(failed)
                # only a connection that failed is retried: a slow server would only get slower
                if not isinstance(failed, ConnectionError) or attempt == self.retries:
                    self.counters["errors"] += 1
                    raise err
                delay = min(BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S)
                if cancel is not None and cancel.wait(delay):
                    raise Cancelled
                if cancel is None:
                    time.sleep(delay)
                attempt += 1
                self.counters["retries"] += 1
                continue
            if 200 <= resp.status < 300:
                return Reply(conn, resp, sock, watch)
            try:
                raw = resp.read(64 * 1024)
            except (OSError, http.client.HTTPException):
                raw = b""
            conn.close()
            watch.stop()
            if resp.status == 409 and _error_code(raw) == "superseded":
                raise Superseded
            self.counters["errors"] += 1
            raise self._status_error(resp, raw, path)

    def json(self, method: str, path: str, body: dict | None = None) -> dict | list:
        """A plain request whose whole answer is one JSON document."""
        reply = self.open(method, path, body)
        try:
            raw = reply.resp.read(MAX_BODY + 1)
        except (OSError, http.client.HTTPException) as e:
            self.counters["errors"] += 1
            raise (self._late(path) if reply.watch.expired.is_set() else self._cut(e)) from None
        finally:
            reply.close()
        if len(raw) > MAX_BODY:
            self.counters["errors"] += 1
            raise EngineError(code="internal", message=f"{self.name} at {self.base} answered {path} with more "
                                                       f"than {MAX_BODY >> 20} MiB")
        try:
            return json.loads(raw)
        except ValueError:
            self.counters["errors"] += 1
            raise self._malformed(path, raw) from None

    def stream(self, path: str, body: dict, cancel: threading.Event | None,
               done: Callable[[dict], bool]) -> Iterator[dict]:
        """POST `body` and yield each SSE `data:` event as a dict until `done(event)` is true or
        `data: [DONE]` arrives. Closing the generator (the caller stopped reading) or setting
        `cancel` closes the socket, before the answer's headers too. A stream that ends before
        its last event, or is still going at the deadline (`timeout` after this call), is a fault."""
        try:
            reply = self.open("POST", path, body, cancel)
        except Cancelled:
            self.counters["cancelled_streams"] += 1
            return
        if "event-stream" not in (reply.resp.getheader("Content-Type") or ""):
            raw = reply.resp.read(200) if not reply.resp.closed else b""
            reply.close()
            self.counters["errors"] += 1
            raise self._malformed(path, raw)
        complete = False
        try:
            for event in self._events(reply.resp, path):
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
            if reply.watch.expired.is_set():
                raise self._late(path)
            self.broken = True
            raise EngineError(code="unavailable", message=f"{self.name} at {self.base} closed the stream "
                                                           "before the completion finished")
        except (OSError, http.client.HTTPException) as e:
            if cancel is not None and cancel.is_set():
                return  # our own watcher closed it
            self.counters["errors"] += 1
            raise (self._late(path) if reply.watch.expired.is_set() else self._cut(e)) from None
        finally:
            if not complete:
                self.counters["cancelled_streams"] += 1
            reply.shutdown()  # the server sees the hang-up at once (and stops generating)
            reply.close()

    def _events(self, resp: http.client.HTTPResponse, path: str) -> Iterator[dict | None]:
        """SSE: `data:` lines (possibly several per event), blank line ends an event; comments
        (`:`) and other fields are ignored. An `error` object in an event is raised."""
        lines: list[str] = []
        size = 0
        while True:
            raw = resp.readline(MAX_LINE + 1)
            if not raw:
                return
            size = size + len(raw) if lines else len(raw)
            if size > MAX_LINE:
                raise EngineError(code="internal", message=f"{self.name} at {self.base} sent an SSE line or "
                                                           f"event over {MAX_LINE >> 20} MiB on {path}")
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
                if isinstance(event["error"], dict) and event["error"].get("code") == "superseded":
                    raise Superseded
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

    def _late(self, path: str) -> EngineError:
        return EngineError(code="unavailable", message=f"{self.name} at {self.base} did not finish {path} within "
                                                       f"{self.timeout * 1e3:.0f} ms (engine_timeout_ms)")

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
    code = errors.from_http(status, message)
    if code == "unauthorized":
        message += " (check engine_api_key or COMPLETER_API_KEY)"
    return EngineError(code=code, message=message,
                       retry_after=retry_after if code in ("overloaded", "not_ready", "unavailable") else None)


def _error_code(raw: bytes) -> str | None:
    """The `code` of an OpenAI-shaped error body, if it is one."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return None
    return err.get("code") if isinstance(err, dict) else None


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare for APIs and not parsed)."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


class Reply:
    """One 2xx answer: the connection, its response, the socket under both and the request's
    watch. http.client hands the socket of an answer that closes its connection (HTTP/1.0,
    `Connection: close`) to the response and drops its own reference: shutting it down needs
    this one."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, sock: socket.socket,
                 watch: _Watch):
        self.conn, self.resp, self.sock, self.watch = conn, resp, sock, watch

    def shutdown(self) -> None:
        _hang_up(self.sock)

    def close(self) -> None:
        self.watch.stop()
        self.resp.close()
        self.conn.close()
        self.sock.close()


def _hang_up(sock: socket.socket) -> None:
    """Unblock a read in another thread (close alone does not wake it) and hang up."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Watch:
    """Until `stop`, a thread that shuts `sock` when `cancel` is set or at `deadline`
    (time.monotonic()), waking the send or read blocked on it; `shut` says it did, `expired` that
    the deadline made it."""

    def __init__(self, sock: socket.socket, cancel: threading.Event | None, deadline: float):
        self.sock, self.cancel, self.deadline = sock, cancel, deadline
        self.finished, self.shut, self.expired = threading.Event(), threading.Event(), threading.Event()
        threading.Thread(target=self._run, name="completer-http-watch", daemon=True).start()

    def stop(self) -> None:
        self.finished.set()

    def _run(self) -> None:
        while not self.finished.is_set():
            left = self.deadline - time.monotonic()
            if left <= 0 or (self.cancel is not None and self.cancel.is_set()):
                if left <= 0:
                    self.expired.set()
                self.shut.set()
                _hang_up(self.sock)
                return
            self.finished.wait(min(left, 0.01) if self.cancel is not None else left)


def follow(events: Iterator[dict], text_of: Callable[[dict], str], stop_text, on_text,
           cancel: threading.Event | None, t0: float,
           max_new: int) -> tuple[str, dict, StopReason | None, float | None]:
    """Read a completion stream: (text, last event, why it stopped reading (the stop rule's reason,
    CANCELLED, LENGTH, SUPERSEDED) or None, ttft_ms). Stops reading (which closes the stream) as soon as `stop_text` fires, `cancel`
    is set, or the server sent more text than `max_new` tokens can be (`read_limit`,
    MAX_TOKEN_CHARS: it ignored the limit; "length"); `on_text` gets the deltas, never past the cut."""
    text, last, ttft, n = "", {}, None, 0
    limit = read_limit(max_new)
    try:
        for event in events:
            last = event
            delta = text_of(event)
            if not delta:
                continue
            n += 1
            if n > limit or len(text) + len(delta) > limit * MAX_TOKEN_CHARS:
                return text, last, StopReason.LENGTH, ttft
            if ttft is None:
                ttft = (time.perf_counter() - t0) * 1e3
            sent, text = len(text), text + delta
            cut = stop_text(text) if stop_text is not None else None
            if cut is not None:
                if on_text is not None and cut > sent:
                    on_text(text[sent:cut])
                return text[:cut], last, stop_reason(stop_text), ttft
            if on_text is not None:
                on_text(delta)
            if cancel is not None and cancel.is_set():
                break
    except Superseded:
        return text, last, StopReason.SUPERSEDED, ttft
    finally:
        events.close()  # a generator left early closes its socket: the server stops generating
    return text, last, StopReason.CANCELLED if cancel is not None and cancel.is_set() else None, ttft
