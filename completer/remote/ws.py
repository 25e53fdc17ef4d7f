"""`WsEngine`: the `EngineClient` interface spoken to a running `completer serve` over its
WebSocket protocol (docs/websocket.md). Synchronous and thread-safe: callers use it from worker
threads; one reader thread per connection routes the frames of concurrent requests by id.

It carries the token (Authorization header and hello), forwards feedback and a closed document
(`forget`), and reconnects after the service restarts: a request that finds the connection gone
reconnects (`retries` tries with back-off) before failing with EngineError("unavailable").
A request in flight when the connection drops fails at once (the next one reconnects).
Nothing the server sends is taken without a bound: a frame over MAX_FRAME closes the connection
(1009), and a request ends at its deadline (`timeout_ms` from its start: an error) or after more
chunks than its `max_new` tokens can make (`read_limit`: "length"), cancelling it on the server.

Repository context (`extra`, client.Chunk) goes in the complete and warmup frames as `extra`
[{path, text}]. The options a request carries (max_new_tokens, temperature, top_p) are sent once
set (by `connect`'s options or `reconfigure`), else the server's own apply.

count_tokens is exact when the server's tokenizer file is readable on this machine (the server
reports its model path), otherwise approximate: len(text) / the server's measured characters
per token.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgpack

from .. import errors
from ..client import Chunk, Completion, EngineError, StopReason, StopText, prompt_budget, stop_reason
from ..edits.formats import EditPrompt
from .transport import BACKOFF_MAX_S, BACKOFF_S, live_options, read_limit

_CLOSED = object()
MAX_FRAME = 4 << 20  # bytes of one frame from the server: a done frame is a few KB


class WsEngine:
    def __init__(self, url: str, token: str | None = None, *, timeout_ms: int = 10000, retries: int = 2,
                 client: str = "completer-remote"):
        u = urlsplit(url)
        self.url = urlunsplit((u.scheme, u.netloc, u.path if u.path not in ("", "/") else "/ws", u.query, ""))
        self.token, self.timeout, self.retries, self.client = token, timeout_ms / 1e3, retries, client
        self.info: dict = {}  # the server's model description (hello frame)
        self._lock = threading.Lock()  # connection state and sends
        self._ws = None
        self._waiters: dict[int, queue.Queue] = {}
        self._ids = itertools.count(1)
        self._last_id: dict[str, int] = {}  # doc → its last request id (feedback names it)
        self._tok = None
        self._closed_why = ""  # why the last connection closed (shown in the error of a request it cut)
        self.counters = {"requests": 0, "errors": 0, "connects": 0, "reconnects": 0}
        self.sent: dict[str, Any] = {}  # max_new_tokens, temperature, top_p once set: sent in every complete

    def reconfigure(self, **values: Any) -> None:
        """engine_timeout_ms, engine_retries, max_new_tokens, temperature and top_p apply from the
        next request on; the rest are the server's own (its models, its engine options)."""
        live = live_options(values, ("engine_timeout_ms", "engine_retries", "max_new_tokens", "temperature",
                                     "top_p"))
        if "engine_timeout_ms" in live:
            self.timeout = live.pop("engine_timeout_ms") / 1e3
        self.retries = live.pop("engine_retries", self.retries)
        self.sent.update(live)

    # -- connection ------------------------------------------------------------------------
    def _conn(self):
        """The open connection; (re)connects with back-off when there is none."""
        with self._lock:
            if self._ws is not None:
                return self._ws
            attempt = 0
            while True:
                try:
                    self._open()
                    return self._ws
                except EngineError as e:
                    if e.code != "unavailable" or attempt == self.retries:
                        self.counters["errors"] += 1
                        raise
                time.sleep(min(BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S))
                attempt += 1

    def _open(self) -> None:
        """Connect, authenticate, and wait until the models are ready (caller holds the lock)."""
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            ws = connect(self.url, additional_headers=headers, open_timeout=self.timeout, max_size=MAX_FRAME, legacy=True,
                         compression=None)
        except InvalidStatus as e:
            status = e.response.status_code
            if status in (401, 403):
                raise EngineError(code="unauthorized", message=f"{self.url} refused the token (HTTP {status}): "
                                                               "check the engine token") from None
            raise EngineError(code="unavailable", message=f"{self.url} answered HTTP {status}") from None
        except Exception as e:  # noqa: BLE001 - one message for every way a connection fails
            why = "connection refused: is `completer serve` running?" if isinstance(e, ConnectionRefusedError) \
                else f"{type(e).__name__}: {e}"
            raise EngineError(code="unavailable", message=f"cannot connect to {self.url} ({why})") from None
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                ws.send(msgpack.packb({"type": "hello", "token": self.token, "client": self.client}
                                      if self.token else {"type": "hello", "client": self.client}))
                hello = msgpack.unpackb(ws.recv(timeout=self.timeout))
                if hello.get("type") == "error":
                    raise EngineError(code=errors.engine_code(hello.get("code")), message=hello.get("message", ""))
                if hello.get("ready"):
                    break
                if time.monotonic() > deadline:
                    raise EngineError(code="not_ready", message=f"{self.url}: models still loading after "
                                                                f"{self.timeout:g} s")
                time.sleep(0.25)
        except EngineError:
            ws.close()
            raise
        except Exception as e:  # noqa: BLE001 - the connection dropped during the handshake
            ws.close()
            raise EngineError(code="unavailable", message=f"{self.url} closed the connection during hello "
                                                          f"({type(e).__name__})") from None
        self.info = hello.get("model", {})
        self._tok = _local_tokenizer(self.info.get("target"))
        self.counters["reconnects" if self.counters["connects"] else "connects"] += 1
        self._ws = ws
        threading.Thread(target=self._read, args=(ws,), name="completer-remote-reader", daemon=True).start()

    def _read(self, ws) -> None:
        try:
            for data in ws:
                msg = msgpack.unpackb(data)
                q = self._waiters.get(msg.get("id"))
                if q is not None:
                    q.put(msg)
            self._closed_why = ""
        except Exception as e:  # noqa: BLE001 - the connection closed (a frame over MAX_FRAME: 1009); waiters are told below
            self._closed_why = f": {e}"
        with self._lock:
            if self._ws is ws:
                self._ws = None
        for q in list(self._waiters.values()):
            q.put(_CLOSED)

    def _send(self, frame: dict) -> None:
        ws = self._conn()
        try:
            with self._lock:
                ws.send(msgpack.packb(frame))
        except Exception:  # noqa: BLE001 - the connection died under us: forget it, reconnect once
            with self._lock:
                if self._ws is ws:
                    self._ws = None
            ws = self._conn()
            with self._lock:
                ws.send(msgpack.packb(frame))

    def warm_start(self) -> float:
        """Connect (hello, models ready); milliseconds spent."""
        t0 = time.perf_counter()
        self._conn()
        return (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        with self._lock:
            if self._ws is not None:
                self._ws.close()
                self._ws = None

    # -- the engine API --------------------------------------------------------------------
    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None,
                 node_kind: str | None = None,
                 extra: Sequence[Chunk] = (), n: int | None = None) -> Completion:
        """As EngineClient.complete. `cancel` sends a cancel frame; `stop_text` is applied here to
        the streamed text (a cut cancels the rest on the server)."""
        deadline = time.monotonic() + self.timeout
        rid = next(self._ids)
        self._last_id[doc_key] = rid
        q: queue.Queue = queue.Queue()
        self._waiters[rid] = q
        frame = {"type": "complete", "id": rid, "doc": doc_key, "prefix": prefix, "suffix": suffix,
                 "stream": on_text is not None or stop_text is not None, **self.sent}
        if max_new is not None:
            frame["max_new_tokens"] = max_new
        if extra:
            frame["extra"] = _chunks(extra)
        if node_kind is not None:
            frame["node_kind"] = node_kind
        self.counters["requests"] += 1
        text, cut, chunks = "", None, 0
        try:
            self._send(frame)
            limit = read_limit(frame.get("max_new_tokens") or int(self.info.get("max_new_tokens") or 64))
            for msg in self._replies(rid, q, deadline, cancel, "completion"):
                if msg["type"] == "chunk" and cut is None and (chunks := chunks + 1) > limit:
                    self._send({"type": "cancel", "id": rid})  # the server ignored max_new_tokens
                    return Completion(text, stop_reason=StopReason.LENGTH)
                if msg["type"] == "chunk" and cut is None:
                    sent, text = len(text), text + msg["text"]
                    if stop_text is not None and (cut := stop_text(text)) is not None:
                        self._send({"type": "cancel", "id": rid})  # finished: the rest is not needed
                        if on_text is not None and cut > sent:
                            on_text(text[sent:cut])
                    elif on_text is not None:
                        on_text(msg["text"])
                elif msg["type"] == "done":
                    stats = dict(msg.get("stats") or {})
                    stats["text"] = text[:cut] if cut is not None else msg["text"]
                    if cut is not None:
                        stats["stop_reason"] = stop_reason(stop_text)
                    c = Completion.from_json(stats)
                    if msg.get("cancelled") and not c.stop_reason:
                        c.stop_reason = StopReason.CANCELLED
                    return c
        except EngineError:
            self.counters["errors"] += 1
            raise
        finally:
            self._waiters.pop(rid, None)

    def rewrite(self, request: EditPrompt, *, fmt: str = "auto", doc_key: str = "_default",
                max_new: int | None = None, speculative: bool = True,
                cancel: threading.Event | None = None) -> Completion:
        """As EngineClient.rewrite: a `rewrite` frame; the service's engine reads `fmt` for its
        model and speculates with the region as the draft. `cancel` sends a cancel frame."""
        deadline = time.monotonic() + self.timeout
        rid = next(self._ids)
        q: queue.Queue = queue.Queue()
        self._waiters[rid] = q
        frame = {"type": "rewrite", "id": rid, "doc": doc_key, "path": request.path, "region": request.region,
                 "cursor": request.cursor, "before": request.before, "after": request.after, "format": fmt,
                 "speculative": speculative,
                 "history": [{"path": h.path, "old": h.old, "new": h.new} for h in request.history]}
        if max_new is not None:
            frame["max_new_tokens"] = max_new
        if request.extra:
            frame["extra"] = _chunks(request.extra)
        self.counters["requests"] += 1
        try:
            self._send(frame)
            for msg in self._replies(rid, q, deadline, cancel, "next edit"):
                if msg["type"] == "rewrite":
                    return Completion.from_json({**(msg.get("stats") or {}), "text": msg.get("text", "")})
        except EngineError:
            self.counters["errors"] += 1
            raise
        finally:
            self._waiters.pop(rid, None)

    def _replies(self, rid: int, q: queue.Queue, deadline: float, cancel: threading.Event | None,
                 what: str) -> Iterator[dict]:
        """The service's frames for request `rid` until the caller has its answer: `cancel` set
        sends one cancel frame (the answer still comes); past `deadline`, a closed connection or
        an error frame raise EngineError."""
        cancelled = False
        while True:
            if cancel is not None and cancel.is_set() and not cancelled:
                cancelled = True
                self._send({"type": "cancel", "id": rid})
            if time.monotonic() > deadline:
                self._send({"type": "cancel", "id": rid})
                raise EngineError(code="unavailable", message=f"{self.url} did not finish the {what} "
                                                              f"within {self.timeout * 1e3:.0f} ms (engine_timeout_ms)")
            try:
                msg = q.get(timeout=0.02)
            except queue.Empty:
                continue
            if msg is _CLOSED:
                raise EngineError(code="unavailable", message=f"the connection to {self.url} closed mid-{what}"
                                                              f"{self._closed_why or ' (the service stopped?)'}")
            if msg["type"] == "error":
                raise EngineError(code=errors.engine_code(msg.get("code")), message=msg.get("message", ""))
            yield msg

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        """Ask the service to prefill this document; it runs at low priority there and is not
        answered, so this returns 0 (the tokens computed are not known here)."""
        frame = {"type": "warmup", "doc": doc_key, "prefix": prefix, "suffix": suffix}
        if "max_new_tokens" in self.sent:  # the prompt budget of the complete that follows
            frame["max_new_tokens"] = self.sent["max_new_tokens"]
        if extra:
            frame["extra"] = _chunks(extra)
        self._send(frame)
        return 0

    def forget(self, doc_key: str) -> None:
        """The editor closed the document: the service frees its KV cache."""
        self._last_id.pop(doc_key, None)
        self._send({"type": "forget", "doc": doc_key})

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        frame = {"type": "feedback", "id": self._last_id.get(doc_key, 0), "doc": doc_key, "text": text,
                 "accepted": accepted}
        if accepted_chars is not None:
            frame["accepted_chars"] = accepted_chars
        self._send(frame)

    def count_tokens(self, text: str) -> int:
        self._conn()
        if self._tok is not None:
            return len(self._tok.encode(text, add_special_tokens=False).ids)
        return round(len(text) / float(self.info.get("chars_per_token") or 3.0))

    def prompt_budget(self, max_new: int | None = None) -> int:
        """The shared rule from the server's ctx and draft length."""
        self._conn()
        max_new = max_new or self.sent.get("max_new_tokens") or int(self.info["max_new_tokens"])
        return prompt_budget(int(self.info["ctx"]), max_new,
                             int(self.info["max_draft_len"]))

    def stats(self) -> dict:
        return {"engine": "ws", "url": self.url, "connected": self._ws is not None,
                "model": self.info.get("target"), **self.counters}


def _chunks(extra: Sequence[Chunk]) -> list[dict]:
    return [{"path": c.path, "text": c.text} for c in extra]


def _local_tokenizer(model_path: str | None):
    """The server's tokenizer when its model directory is on this machine, else None."""
    if not model_path:
        return None
    tj = Path(model_path) / "tokenizer.json"
    if not tj.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tj))
