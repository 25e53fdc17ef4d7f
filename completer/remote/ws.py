"""`RemoteEngine`: the engine's API (complete, warmup, count_tokens, prompt_budget) spoken to a
running `completer serve` over its WebSocket protocol (docs/websocket.md). Synchronous and
thread-safe: the language server calls it from worker threads; one reader thread routes the
frames of concurrent requests by id. No torch: a language server using it stays light.

count_tokens is exact when the server's tokenizer file is readable on this machine (the server
reports its model path), otherwise approximate: len(text) / the server's measured characters
per token.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import urlsplit, urlunsplit

import msgpack


class RemoteError(Exception):
    """The service refused or failed a request; `code` is the protocol's error code."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass
class RemoteCompletion:
    text: str
    stats: SimpleNamespace                   # the done frame's stats as attributes (ttft_ms, ...)
    token_ids: list[int] = field(default_factory=list)  # not sent over the wire
    raw: dict = field(default_factory=dict)  # the done frame's stats as sent

    def to_json(self) -> dict:
        return {**self.raw, "text": self.text}


_CLOSED = object()


class RemoteEngine:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 60.0,
                 client: str = "completer-remote"):
        u = urlsplit(url)
        self.url = urlunsplit((u.scheme, u.netloc, u.path if u.path not in ("", "/") else "/ws", u.query, ""))
        self.token, self.timeout, self.client = token, timeout, client
        self.info: dict = {}  # the server's model description (hello frame)
        self._lock = threading.Lock()  # connection state and sends
        self._ws = None
        self._waiters: dict[int, queue.Queue] = {}
        self._ids = itertools.count(1)
        self._tok = None

    # -- connection ------------------------------------------------------------------------
    def _conn(self):
        with self._lock:
            if self._ws is None:
                self._open()
            return self._ws

    def _open(self) -> None:
        """Connect, authenticate, and wait until the models are ready (caller holds the lock)."""
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            ws = connect(self.url, additional_headers=headers, open_timeout=self.timeout, max_size=None, legacy=True,
                         compression=None)
        except Exception as e:  # noqa: BLE001 - one message for every way a connection fails
            raise RemoteError("unavailable", f"cannot connect to {self.url}: {e}") from None
        deadline = time.monotonic() + self.timeout
        while True:
            ws.send(msgpack.packb({"type": "hello", "token": self.token, "client": self.client}
                                  if self.token else {"type": "hello", "client": self.client}))
            hello = msgpack.unpackb(ws.recv(timeout=self.timeout))
            if hello.get("type") == "error":
                ws.close()
                raise RemoteError(hello["code"], hello["message"])
            if hello.get("ready"):
                break
            if time.monotonic() > deadline:
                ws.close()
                raise RemoteError("not_ready", f"{self.url}: models still loading after {self.timeout:g} s")
            time.sleep(0.25)
        self.info = hello.get("model", {})
        self._tok = _local_tokenizer(self.info.get("target"))
        self._ws = ws
        threading.Thread(target=self._read, args=(ws,), name="completer-remote-reader", daemon=True).start()

    def _read(self, ws) -> None:
        try:
            for data in ws:
                msg = msgpack.unpackb(data)
                q = self._waiters.get(msg.get("id"))
                if q is not None:
                    q.put(msg)
        except Exception:  # noqa: BLE001, S110 - the connection closed; waiters are told below
            pass
        with self._lock:
            if self._ws is ws:
                self._ws = None
        for q in list(self._waiters.values()):
            q.put(_CLOSED)

    def _send(self, frame: dict) -> None:
        ws = self._conn()
        with self._lock:
            ws.send(msgpack.packb(frame))

    def close(self) -> None:
        with self._lock:
            if self._ws is not None:
                self._ws.close()
                self._ws = None

    # -- the engine API --------------------------------------------------------------------
    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: Callable[[str], int | None] | None = None,
                 cancel: threading.Event | None = None,
                 on_text: Callable[[str], None] | None = None, language: str | None = None,
                 node_kind: str | None = None) -> RemoteCompletion:
        """As Engine.complete. `cancel` sends a cancel frame; `stop_text` is applied here to the
        streamed text (a cut cancels the rest on the server)."""
        rid = next(self._ids)
        q: queue.Queue = queue.Queue()
        self._waiters[rid] = q
        frame = {"type": "complete", "id": rid, "doc": doc_key, "prefix": prefix, "suffix": suffix,
                 "stream": on_text is not None or stop_text is not None}
        if max_new is not None:
            frame["max_new_tokens"] = max_new
        if language is not None:
            frame["language"] = language
        if node_kind is not None:
            frame["node_kind"] = node_kind
        text, cut, cancelled = "", None, False
        try:
            self._send(frame)
            while True:
                if cancel is not None and cancel.is_set() and not cancelled:
                    cancelled = True
                    self._send({"type": "cancel", "id": rid})
                try:
                    msg = q.get(timeout=0.02)
                except queue.Empty:
                    continue
                if msg is _CLOSED:
                    raise RemoteError("unavailable", "the connection to the engine service closed")
                if msg["type"] == "error":
                    raise RemoteError(msg["code"], msg["message"])
                if msg["type"] == "chunk" and cut is None:
                    text += msg["text"]
                    if on_text is not None:
                        on_text(msg["text"])
                    if stop_text is not None and (cut := stop_text(text)) is not None:
                        self._send({"type": "cancel", "id": rid})  # finished: the rest is not needed
                elif msg["type"] == "done":
                    stats = {**(msg.get("stats") or {}), "cancelled": msg.get("cancelled", False)}
                    final = text[:cut] if cut is not None else msg["text"]
                    if cut is not None:
                        stats["stop_reason"] = "stop"
                    return RemoteCompletion(final, SimpleNamespace(**stats), raw=stats)
        finally:
            self._waiters.pop(rid, None)

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default") -> int:
        """Ask the service to prefill this document; it runs at low priority there and is not
        answered, so this returns 0 (the tokens computed are not known here)."""
        self._send({"type": "warmup", "doc": doc_key, "prefix": prefix, "suffix": suffix})
        return 0

    def count_tokens(self, text: str) -> int:
        self._conn()
        if self._tok is not None:
            return len(self._tok.encode(text, add_special_tokens=False).ids)
        return round(len(text) / float(self.info.get("chars_per_token") or 3.0))

    def prompt_budget(self, max_new: int | None = None) -> int:
        """Engine.prompt_budget's rule from the server's ctx and draft length."""
        self._conn()
        ctx = int(self.info["ctx"])
        room = ctx - (max_new or int(self.info["max_new_tokens"])) - int(self.info["max_draft_len"]) - 1
        return max(room, ctx // 2)


def _local_tokenizer(model_path: str | None):
    """The server's tokenizer when its model directory is on this machine, else None."""
    from pathlib import Path

    if not model_path:
        return None
    tj = Path(model_path) / "tokenizer.json"
    if not tj.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tj))
