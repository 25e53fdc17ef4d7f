"""Remote engines behind the one `EngineClient` interface (completer/client.py):

| URL                              | client                    | server                                   |
|----------------------------------|---------------------------|------------------------------------------|
| `ws://HOST:PORT` (`wss://`)      | `ws.WsEngine`             | our `completer serve` (docs/websocket.md) |
| `llamacpp:http(s)://HOST:PORT`   | `llamacpp.LlamaCpp`       | llama-server's native `/infill`          |
| `openai:http(s)://HOST:PORT/v1`  | `openai.OpenAI`           | any `/v1/completions` (vLLM, SGLang, ...) |

`connect(url, ...)` picks one. The HTTP clients are wrapped in `TypeThrough` (typethrough.py; our
own server does type-through itself). No torch anywhere here: a language server on a remote engine stays
light.

Alternatives (`complete(n=...)`, engine/alternatives.py) are one completion here: llama-server's
`n_cmpl` and OpenAI's `n` decode n independent samples (n copies of one text under greedy decoding,
n full decodes otherwise), not branches of one decode; and over our WebSocket the syntax stop
runs on this side, whose cut cancels the request on the server before it could branch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..client import EngineClient, EngineError
from ..config import env
from .typethrough import TypeThrough

SCHEMES = "ws://HOST:PORT, wss://HOST:PORT, llamacpp:http://HOST:PORT or openai:http(s)://HOST:PORT/v1"


def connect(url: str, *, token: str | None = None, api_key: str | None = None, model: str | None = None,
            fim_format: str = "auto", timeout_ms: int = 10000, retries: int = 2,
            options: Mapping[str, Any] | None = None, **more: Any) -> EngineClient:
    """A client for the engine at `url` (nothing is sent until warm_start or the first request).
    `token`: our service's token (else env COMPLETER_TOKEN); `api_key`: the HTTP servers' key
    (else env COMPLETER_API_KEY); `model` and `fim_format`: the OpenAI client's model and prompt
    format; `timeout_ms`: connect and read timeout; `retries`: reconnects after a connection
    failure, with back-off; `options` and `more`: config's options by name, given to the
    client's `reconfigure` (it takes what a remote request carries: max_new_tokens,
    temperature, top_p, seed, min_confidence, next_edit_min_confidence, type_through, prefetch — the HTTP clients' prefetch
    is off unless given; the rest are not a remote client's).
    """
    if not isinstance(url, str):
        raise EngineError(code="bad_request", message=f"engine URL must be a string, not {type(url).__name__}")
    if timeout_ms <= 0 or retries < 0:
        raise EngineError(code="bad_request", message="engine_timeout_ms must be > 0 and engine_retries >= 0")
    kind, _, rest = url.partition(":")
    client: EngineClient
    if url.startswith(("ws://", "wss://")) and urlsplit(url).hostname:
        from .ws import WsEngine

        client = WsEngine(url, token if token is not None else env("COMPLETER_TOKEN"),
                          timeout_ms=timeout_ms, retries=retries)
    elif kind in ("llamacpp", "openai") and rest.startswith(("http://", "https://")):
        key = api_key if api_key is not None else env("COMPLETER_API_KEY")
        if kind == "llamacpp":
            from .llamacpp import LlamaCpp

            client = TypeThrough(LlamaCpp(rest, api_key=key, timeout_ms=timeout_ms, retries=retries))
        else:
            from .openai import OpenAI

            client = TypeThrough(OpenAI(rest, api_key=key, model=model, fim_format=fim_format,
                                        timeout_ms=timeout_ms, retries=retries))
    else:
        raise EngineError(code="bad_request", message=f"engine URL {url!r}: expected {SCHEMES}")
    client.reconfigure(**{**(options or {}), **more})
    return client
