"""The one table of error codes and their shape on every wire. Torch-free.

An engine raises `EngineError` with one of `client.ERROR_CODES`; `completer serve` answers with a
service code (a WebSocket error frame's `code`, an OpenAI error body's `code`, docs/websocket.md);
`/v1` carries it as an HTTP status; the language server shows it as a warning (it passes) or an
error, and a JSON-RPC error code where it answers with one. Each of those maps is read from here:
the service (serve/), the remote clients (remote/) and the language server (lsp/) import it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineShape:
    """How one EngineError code travels out of a server and into a language server."""
    service: str     # the code `completer serve` answers with
    transient: bool  # it passes by itself: the language server shows a warning, not an error
    jsonrpc: int     # JSON-RPC error code (server-defined range -32099..-32000; -32603 internal)


# EngineError code → its shapes. "unavailable" (a remote engine behind the engine) is not_ready to
# the service's client: come back later; "model" (the wrong model asked for) is its bad request.
ENGINE: dict[str, EngineShape] = {
    "unavailable": EngineShape("not_ready", True, -32010),
    "unauthorized": EngineShape("unauthorized", False, -32001),
    "overloaded": EngineShape("overloaded", True, -32011),
    "bad_request": EngineShape("bad_request", False, -32602),
    "not_ready": EngineShape("not_ready", True, -32012),
    "model": EngineShape("bad_request", False, -32013),
    "internal": EngineShape("internal", False, -32603),
}


@dataclass(frozen=True)
class ServiceShape:
    """How one code of `completer serve` looks over HTTP, and what a client of it raises."""
    http: int        # status of a /v1 answer with this code
    openai_type: str  # OpenAI's error "type"
    engine: str      # the EngineError code a remote client raises for it ("" : not an error to raise)


# service code (WebSocket error frames, /v1 error bodies) → its shapes
SERVICE: dict[str, ServiceShape] = {
    "bad_frame": ServiceShape(400, "invalid_request_error", "bad_request"),
    "bad_request": ServiceShape(400, "invalid_request_error", "bad_request"),
    "unknown_type": ServiceShape(400, "invalid_request_error", "bad_request"),
    "too_large": ServiceShape(413, "invalid_request_error", "bad_request"),
    "unauthorized": ServiceShape(401, "invalid_request_error", "unauthorized"),
    "overloaded": ServiceShape(429, "rate_limit_error", "overloaded"),
    "not_ready": ServiceShape(503, "server_error", "not_ready"),
    "internal": ServiceShape(500, "server_error", "internal"),
    # a newer request for the same document took over: the answer is obsolete, not a fault
    "superseded": ServiceShape(409, "invalid_request_error", ""),
}


def service_code(engine_code: str) -> str:
    """The service's answer to an EngineError code (an unknown one is internal)."""
    return ENGINE.get(engine_code, ENGINE["internal"]).service


def engine_code(service: str | None) -> str:
    """The EngineError code a client of the service raises for its error `code`."""
    shape = SERVICE.get(service or "")
    return shape.engine if shape is not None and shape.engine else "internal"


def http_status(service: str) -> int:
    return SERVICE.get(service, SERVICE["internal"]).http


def openai_type(status: int) -> str:
    """OpenAI's error type for an HTTP status this server answers with (404 and the guard's 403
    are invalid requests too)."""
    return next((s.openai_type for s in SERVICE.values() if s.http == status),
                "server_error" if status >= 500 else "invalid_request_error")


def from_http(status: int, message: str) -> str:
    """The EngineError code for an HTTP error status of any server (llama-server, vLLM, ours):
    the statuses of the SERVICE table, plus what other servers answer (403, 404 for an unknown
    model, 502/504 from a proxy, 503 while loading or down)."""
    if status == 403:
        return "unauthorized"
    if status == 404 and "model" in message.lower():
        return "model"
    if status == 503:
        return "not_ready" if "load" in message.lower() else "unavailable"
    if status in (502, 504):
        return "unavailable"
    for shape in SERVICE.values():
        if shape.http == status and shape.engine:
            return shape.engine
    return "bad_request" if 400 <= status < 500 else "internal"


def transient(engine_code: str) -> bool:
    """The language server shows it as a warning (it passes), not an error."""
    return ENGINE.get(engine_code, ENGINE["internal"]).transient


def jsonrpc(engine_code: str) -> int:
    return ENGINE.get(engine_code, ENGINE["internal"]).jsonrpc
