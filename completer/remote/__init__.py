"""Remote engines behind the one `EngineClient` interface (completer/client.py):

| URL                              | client                    | server                                   |
|----------------------------------|---------------------------|------------------------------------------|
| `ws://HOST:PORT` (`wss://`)      | `ws.WsEngine`             | our `completer serve` (docs/websocket.md) |
| `llamacpp:http(s)://HOST:PORT`   | `llamacpp.LlamaCpp`       | llama-server's native `/infill`          |
| `openai:http(s)://HOST:PORT/v1`  | `openai.OpenAI`           | any `/v1/completions` (vLLM, SGLang, ...) |

`connect(url, ...)` picks one. The HTTP clients are wrapped in `TypeThrough` (our own server
does type-through itself). No torch anywhere here: a language server on a remote engine stays
light.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

from ..client import Completion, EngineClient, EngineError, StopText

MAX_DOCS = 1024  # type-through remembers the last completion of this many documents
SCHEMES = "ws://HOST:PORT, wss://HOST:PORT, llamacpp:http://HOST:PORT or openai:http(s)://HOST:PORT/v1"


def connect(url: str, *, token: str | None = None, api_key: str | None = None, model: str | None = None,
            fim_format: str = "auto", timeout_ms: int = 10000, retries: int = 2,
            max_new_tokens: int = 64) -> EngineClient:
    """A client for the engine at `url` (nothing is sent until warm_start or the first request).
    `token`: our service's token (else env COMPLETER_TOKEN); `api_key`: the HTTP servers' key
    (else env COMPLETER_API_KEY); `model` and `fim_format`: the OpenAI client's model and prompt
    format; `timeout_ms`: connect and read timeout; `retries`: reconnects after a connection
    failure, with back-off; `max_new_tokens`: the default length for the HTTP clients."""
    if not isinstance(url, str):
        raise EngineError(code="bad_request", message=f"engine URL must be a string, not {type(url).__name__}")
    if timeout_ms <= 0 or retries < 0:
        raise EngineError(code="bad_request", message="engine_timeout_ms must be > 0 and engine_retries >= 0")
    kind, _, rest = url.partition(":")
    if url.startswith(("ws://", "wss://")) and urlsplit(url).hostname:
        from .ws import WsEngine

        return WsEngine(url, token if token is not None else os.environ.get("COMPLETER_TOKEN"),
                        timeout_ms=timeout_ms, retries=retries)
    if kind in ("llamacpp", "openai") and rest.startswith(("http://", "https://")):
        key = api_key if api_key is not None else os.environ.get("COMPLETER_API_KEY")
        if kind == "llamacpp":
            from .llamacpp import LlamaCpp

            return TypeThrough(LlamaCpp(rest, api_key=key, timeout_ms=timeout_ms, retries=retries,
                                        max_new_tokens=max_new_tokens))
        from .openai import OpenAI

        return TypeThrough(OpenAI(rest, api_key=key, model=model, fim_format=fim_format, timeout_ms=timeout_ms,
                                  retries=retries, max_new_tokens=max_new_tokens))
    raise EngineError(code="bad_request", message=f"engine URL {url!r}: expected {SCHEMES}")


class TypeThrough:
    """Client-side type-through for engines that do not do it themselves: when the new prefix
    is the old one plus the beginning of the document's last completion (same suffix), the rest
    of that completion is returned without a request."""

    def __init__(self, inner: EngineClient):
        self.inner = inner
        self.last: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # doc → (prefix, suffix, text)
        self._lock = threading.Lock()
        self.served = 0

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None,
                 node_kind: str | None = None, language: str | None = None) -> Completion:
        t0 = time.perf_counter()
        with self._lock:
            old = self.last.get(doc_key)
        if old is not None:
            rest = _typed_rest(old, prefix, suffix)
            if rest:
                with self._lock:
                    self.last[doc_key] = (prefix, suffix, rest)
                    self.served += 1
                if on_text is not None:
                    on_text(rest)
                ms = (time.perf_counter() - t0) * 1e3
                return Completion(rest, ttft_ms=ms, total_ms=ms, stop_reason="type_through",
                                  extra={"type_through": True})
        c = self.inner.complete(prefix, suffix, doc_key=doc_key, max_new=max_new, stop_text=stop_text,
                                cancel=cancel, on_text=on_text, node_kind=node_kind, language=language)
        with self._lock:
            if c.text and c.stop_reason != "cancelled":
                self.last[doc_key] = (prefix, suffix, c.text)
                self.last.move_to_end(doc_key)
                while len(self.last) > MAX_DOCS:
                    self.last.popitem(last=False)
            else:
                self.last.pop(doc_key, None)
        c.extra.setdefault("type_through", False)
        return c

    def forget(self, doc_key: str) -> None:
        with self._lock:
            self.last.pop(doc_key, None)
        self.inner.forget(doc_key)

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default") -> int:
        return self.inner.warmup(prefix, suffix, doc_key=doc_key)

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        self.inner.feedback(doc_key, text, accepted, accepted_chars)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def prompt_budget(self, max_new: int | None = None) -> int:
        return self.inner.prompt_budget(max_new)

    def warm_start(self) -> float:
        return self.inner.warm_start()

    def stats(self) -> dict:
        return {**self.inner.stats(), "type_through": self.served}

    def close(self) -> None:
        self.inner.close()


def _typed_rest(old: tuple[str, str, str], prefix: str, suffix: str) -> str:
    """What remains of the old completion after the characters typed since, or "" if the user
    typed something else (or all of it)."""
    old_prefix, old_suffix, text = old
    if suffix != old_suffix or len(prefix) <= len(old_prefix) or not prefix.startswith(old_prefix):
        return ""
    typed = prefix[len(old_prefix):]
    return text[len(typed):] if text.startswith(typed) else ""
