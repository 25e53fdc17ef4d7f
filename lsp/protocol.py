"""JSON-RPC hardening for the language server: every transport hands message bodies to `dispatch`,
which keeps the server alive and spec-conformant on any input: a frame that is too large, nested
too deep, not JSON, not JSON-RPC or of the wrong shape gets the error the spec names (or is dropped
if it was a notification); a handler's exception never reaches the loop. `Protocol` is pygls'
LSP protocol with those checks, initialize-once and shutdown rules, and document sync left to the
service (no second copy of each document)."""
from __future__ import annotations

import json
import logging
from typing import Any

from lsprotocol import types as t
from lsprotocol.types import ResponseErrorMessage
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
    JsonRpcServerNotInitialized,
)
from pygls.lsp.server import LanguageServer
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    JsonRPCResponseMessage,
    LanguageServerProtocol,
    lsp_method,
)

from completer import memory

log = logging.getLogger("completer.lsp")
MAX_BODY = 64 * 2**20      # bytes of one message (a 16 Mi-char document fits); larger: -32600, skipped
MAX_DEPTH = 64             # JSON nesting; LSP messages need < 20, and handlers may walk what they get


def too_deep(data: Any) -> bool:
    """Containers nested more than MAX_DEPTH deep (json.loads itself stops near 1000 levels)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        stack.extend((c, depth + 1) for c in (node.values() if isinstance(node, dict) else node)
                     if isinstance(c, (dict, list)))
    return False


def _user_handler(method: str):
    """A builtin document-sync handler that only calls the user's: the service keeps the text
    (with its tree), so pygls' own workspace copy would be a second 10 MB string per document.
    A plain call, not pygls' generator form: pygls files a generator's future under a fresh id
    that nothing removes for a notification, one Future kept per didOpen/didChange/didClose."""
    def handler(self, params):
        if (user := self.fm.features.get(method)) is not None:
            user(params)
    return lsp_method(method)(handler)


def request_id(data: dict) -> int | str | None:
    i = data.get("id")
    return i if isinstance(i, (int, str)) and not isinstance(i, bool) else None


class Protocol(LanguageServerProtocol):
    lsp_text_document__did_open = _user_handler(t.TEXT_DOCUMENT_DID_OPEN)
    lsp_text_document__did_change = _user_handler(t.TEXT_DOCUMENT_DID_CHANGE)
    lsp_text_document__did_close = _user_handler(t.TEXT_DOCUMENT_DID_CLOSE)

    def __init__(self, server, converter):
        super().__init__(server, converter)
        self.initialize_seen = False

    def reply_error(self, msg_id, exc: JsonRpcException) -> None:
        if msg_id is None:  # JSON-RPC 2.0: "id": null when it could not be read (pygls would drop the key)
            error = self._converter.unstructure(exc.to_response_error())
            self._send_data({"jsonrpc": "2.0", "id": None, "error": error})
            return
        self._send_response(msg_id, None, exc.to_response_error())

    def structure(self, data: Any):
        """The typed message for parsed JSON, or None once the error the spec names has been
        sent (requests, and shapes whose id cannot be read: id null) or the message dropped."""
        if not isinstance(data, dict):
            self.reply_error(None, JsonRpcInvalidRequest("a message must be a JSON object"))
            return None
        msg_id, has_id = request_id(data), "id" in data
        if "method" in data:
            method = data["method"]
            if data.get("jsonrpc") != "2.0" or not isinstance(method, str) or (has_id and msg_id is None):
                if has_id:
                    self.reply_error(msg_id, JsonRpcInvalidRequest(
                        'a request needs "jsonrpc": "2.0", a string method and an integer or string id'))
                return None
            kind = self.get_message_type(method) or (JsonRPCRequestMessage if has_id else JsonRPCNotification)
            message = {"jsonrpc": "2.0", "method": method, "params": data.get("params")}  # params are optional
            try:
                return self._converter.structure({**message, "id": msg_id} if has_id else message, kind)
            except Exception:  # noqa: BLE001 - params of the wrong shape for the method
                if has_id:
                    self.reply_error(msg_id, JsonRpcInvalidParams(f"invalid params for {method}"))
                return None
        if "result" in data or "error" in data:  # the client's answer to one of our requests
            key = "error" if "error" in data else "result"
            kind = ResponseErrorMessage if key == "error" else (
                self._result_types.pop(msg_id, None) or JsonRPCResponseMessage)
            try:  # a response is never answered, even a malformed one
                if data.get("jsonrpc") != "2.0" or msg_id is None:
                    raise ValueError('"jsonrpc": "2.0" and an integer or string id expected')
                return self._converter.structure({"jsonrpc": "2.0", "id": msg_id, key: data[key]}, kind)
            except Exception as e:  # noqa: BLE001 - any malformed response is logged, never answered
                log.warning("malformed response from the client (%s): %.200r", e, data)
                return None
        self.reply_error(msg_id, JsonRpcInvalidRequest("neither a request, a notification nor a response"))
        return None

    def handle_message(self, message) -> None:
        method = getattr(message, "method", None)
        is_request = method is not None and getattr(message, "id", None) is not None
        if method == t.INITIALIZE:
            if self.initialize_seen:  # only once per session, or options and documents reset
                if is_request:
                    self.reply_error(message.id, JsonRpcInvalidRequest("already initialized"))
                return
            self.initialize_seen = True
        elif not self.initialize_seen and method not in (None, t.EXIT):
            if is_request:  # the spec: error -32002 for requests, drop notifications
                self.reply_error(message.id, JsonRpcServerNotInitialized())
            return
        if method == t.CANCEL_REQUEST and not isinstance(getattr(message.params, "id", None), (int, str)):
            return  # pygls would look the id up in a dict
        if self._shutdown and is_request and method != t.EXIT:
            self.reply_error(message.id, JsonRpcInvalidRequest("the server is shutting down"))
            return
        super().handle_message(message)

    def end_session(self) -> None:
        """The client's connection closed (TCP, WebSocket): the next one starts afresh."""
        for fut in list(self._request_futures.values()):
            fut.cancel()
        self._request_futures.clear()
        self.initialize_seen, self._shutdown, self.writer = False, False, None


def dispatch(ls: LanguageServer, body: bytes) -> None:
    """One message body from any transport, checked, parsed and handled; whatever is wrong with
    it costs only this message."""
    proto = ls.protocol
    if len(body) > MAX_BODY:
        proto.reply_error(None, JsonRpcInvalidRequest(f"a message of {len(body)} bytes is over the limit of {MAX_BODY}"))
        return
    try:
        data = json.loads(body)
        deep = body.count(b"[") + body.count(b"{") > MAX_DEPTH and too_deep(data)
    except RecursionError:  # json.loads gives up near 1000 levels
        deep = True
    except ValueError as e:  # bad JSON or bad UTF-8
        proto.reply_error(None, JsonRpcParseError(f"not JSON: {str(e)[:200]}"))
        return
    if deep:
        proto.reply_error(None, JsonRpcParseError(f"JSON nested deeper than {MAX_DEPTH} levels"))
        return
    try:
        message = proto.structure(data)
        if message is not None:
            proto.handle_message(message)
    except Exception:  # a bug of ours or pygls': logged, the loop goes on
        log.exception("message handling failed")
    if len(body) >= memory.LARGE:
        memory.give_back_soon()

