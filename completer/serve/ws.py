"""The WebSocket endpoint of `completer serve` (`GET /ws`, docs/websocket.md): one connection's
life and the nine frame handlers. Frames are parsed and checked by protocol.py; a completion
runs through the service's `complete` like an OpenAI request does (openai.py beside this).

Handlers are thin: check the frame, hand a `Job` (or a warmup) to the service, answer. Every
client mistake is an error frame and the connection stays open.

`service` is the app's EngineService (duck-typed here: this module does not import the app)."""
from __future__ import annotations

import asyncio
import threading
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

from .. import memory, netguard
from ..client import Completion, StopReason
from ..edits.formats import EditPrompt
from . import protocol
from .protocol import PROTOCOL_VERSION, BadRequest, FrameError, Job, Refused, error, pack


@dataclass(eq=False)
class Conn:
    """One WebSocket connection."""
    ws: web.WebSocketResponse
    id: str
    authed: bool
    inflight: dict = field(default_factory=dict)   # request id → threading.Event (its cancel)
    docs: set = field(default_factory=set)         # documents it used: forgotten when it closes
    tasks: set = field(default_factory=set)        # its running completions


async def websocket(service, request: web.Request) -> web.StreamResponse:
    token = service.token(request)
    if token is False:
        return web.Response(status=401, text="wrong token\n")
    # Frames above max_frame_bytes get an error frame; past 4x that the library closes the
    # connection (1009) rather than buffer an unbounded message.
    ws = web.WebSocketResponse(max_msg_size=4 * service.cfg.max_frame_bytes, compress=False)
    if not ws.can_prepare(request):
        return web.Response(status=426, text="expected a WebSocket upgrade\n", headers={"Upgrade": "websocket"})
    await ws.prepare(request)
    conn = Conn(ws, uuid.uuid4().hex[:12], authed=service.cfg.token is None or bool(token))
    service.conns.add(conn)
    try:
        async for m in ws:
            if m.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                break  # an error the library closed the connection for (1009, 1007)
            reply = frame(service, conn, m.data)
            if reply is not None:
                await ws.send_bytes(pack(reply))
            if len(m.data) >= memory.LARGE:
                memory.give_back_soon()  # what a large frame's copies freed (lsp.protocol.dispatch's rule)
    except ConnectionError:
        pass  # the peer went away mid-send: nothing left to answer
    finally:
        service.conns.discard(conn)
        for ev in conn.inflight.values():
            ev.set()
        if service.ready:
            for doc in conn.docs:
                service.engine.forget(_doc_key(conn, doc))
    return ws


def frame(service, conn: Conn, message: bytes | str) -> dict | None:
    """Parse and dispatch one frame → the reply frame, if one is due now."""
    try:
        msg = protocol.unpack(message, service.cfg.max_frame_bytes)
    except FrameError as e:
        return error(None, e.code, str(e))
    typ, id_ = msg["type"], protocol.frame_id(msg)
    try:
        if typ != "hello" and not conn.authed:
            return error(id_, "unauthorized", "send a hello frame with the token first")
        if typ not in HANDLERS:
            return error(id_, "unknown_type", f"unknown frame type {typ!r}")
        return HANDLERS[typ](service, conn, protocol.fields(msg))
    except BadRequest as e:
        return error(id_, "bad_request", str(e))
    except Exception as e:  # noqa: BLE001 - the connection must survive our bugs too
        traceback.print_exc()
        return error(id_, "internal", f"{type(e).__name__}: {e}")


def _doc_key(conn: Conn, doc: str) -> str:
    return f"{conn.id}:{doc}"  # documents of different connections never share a cache


def _hello(service, conn: Conn, f: dict) -> dict:
    if service.cfg.token is not None and not conn.authed:
        if not netguard.token_matches(f["token"], service.cfg.token):
            return error(None, "unauthorized", "wrong or missing token")
        conn.authed = True
    return {"type": "hello", "server": "completer", "version": service.version, "protocol": PROTOCOL_VERSION,
            "model": service.model_info, "ready": service.ready}


def _ping(service, conn: Conn, f: dict) -> dict:
    return {"type": "pong"}


def _max_new(service, f: dict) -> int | None:
    max_new = f["max_new_tokens"]
    if max_new is not None and not 1 <= max_new <= service.engine.ctx // 2:
        raise BadRequest(f'"max_new_tokens" must be in 1..{service.engine.ctx // 2}', "max_new_tokens")
    return max_new


def _complete(service, conn: Conn, f: dict) -> dict | None:
    id_ = f["id"]
    refused = _admit(service, conn, id_)
    if refused is not None:
        return refused
    max_new = _max_new(service, f)
    job = Job(_doc_key(conn, f["doc"]), f["prefix"], f["suffix"] or "", f["language"], max_new,
              f["node_kind"], stream=f["stream"] is not False, temperature=protocol.option(f, "temperature"),
              top_p=protocol.option(f, "top_p"), extra=protocol.chunks(f["extra"]),
              n=protocol.option(f, "alternatives"))
    conn.docs.add(f["doc"])
    conn.inflight[id_] = cancel = threading.Event()
    _start(conn, _answer(service, conn, id_, job, cancel))
    return None


async def _answer(service, conn: Conn, id_, job: Job, cancel: threading.Event) -> None:
    send = conn.ws.send_bytes
    try:
        try:
            c, cancelled = await service.complete(job, cancel, lambda d: send(pack({"type": "chunk", "id": id_,
                                                                                     "text": d})), "complete")
        except Refused as e:
            await send(pack(error(id_, e.code, e.message, e.retry_after_ms)))
            return
        stats = {k: v for k, v in c.to_json().items() if k not in ("text", "token_ids")}
        await send(pack({"type": "done", "id": id_, "text": c.text, "cancelled": cancelled, "stats": stats}))
    except ConnectionError:
        cancel.set()  # the connection closed under us
    finally:
        conn.inflight.pop(id_, None)


def _next_edit(service, conn: Conn, f: dict) -> dict | None:
    id_ = f["id"]
    refused = _admit(service, conn, id_)
    if refused is not None:
        return refused
    path = f["path"] or "untitled"
    doc = "\0next-edit:" + path  # its cache beside the document's completions', freed with the connection
    conn.docs.add(doc)
    conn.inflight[id_] = cancel = threading.Event()

    async def reply() -> dict:
        ne = await service.next_edit(f["text"], f["line"], f["col"], f["before"], path, f["language"],
                                     _doc_key(conn, doc), cancel, f["format"] or "auto",
                                     rename=f["rename"] is not False, rename_first=f["rename_first"] is not False)
        out = ne.to_json()
        frame = {"type": "next_edit", "id": id_, "edits": out.pop("edits"), "stats": out}
        for k in ("reason", "jump"):  # the answer's own fields beside edits, as completer/nextEdit has them
            if k in out:
                frame[k] = out.pop(k)
        return frame

    _start(conn, _answer_once(conn, id_, cancel, reply))
    return None


async def _answer_once(conn: Conn, id_, cancel: threading.Event, reply: Callable[[], Awaitable[dict]]) -> None:
    """Send request `id_`'s one reply frame, `await reply()` (Refused: an error frame); a closed
    connection cancels the request."""
    try:
        try:
            frame = await reply()
        except Refused as e:
            frame = error(id_, e.code, e.message, e.retry_after_ms)
        await conn.ws.send_bytes(pack(frame))
    except ConnectionError:
        cancel.set()
    finally:
        conn.inflight.pop(id_, None)


def _rewrite(service, conn: Conn, f: dict) -> dict | None:
    id_ = f["id"]
    refused = _admit(service, conn, id_)
    if refused is not None:
        return refused
    max_new = _max_new(service, f)
    request = EditPrompt(protocol.history(f["history"]), f["path"], f["region"], f["cursor"] or 0,
                         f["before"] or "", f["after"] or "", protocol.chunks(f["extra"]))
    conn.docs.add(f["doc"])
    conn.inflight[id_] = cancel = threading.Event()

    async def reply() -> dict:
        c = await service.rewrite(request, f["format"] or "auto", _doc_key(conn, f["doc"]), max_new,
                                  f["speculative"] is not False, cancel)
        c = c or Completion("", stop_reason=StopReason.SUPERSEDED)
        stats = {k: v for k, v in c.to_json().items() if k not in ("text", "token_ids")}
        return {"type": "rewrite", "id": id_, "text": c.text, "stats": stats}

    _start(conn, _answer_once(conn, id_, cancel, reply))
    return None


def _admit(service, conn: Conn, id_) -> dict | None:
    """The error frame for a request the connection cannot take now, else None. Raises BadRequest
    for an id already in flight."""
    if not service.ready:
        return error(id_, "not_ready", "models are still loading; retry when /health says ok",
                     service.retry_after_ms())
    if id_ in conn.inflight:
        raise BadRequest(f"request id {id_!r} is already in flight", "id")
    if len(conn.inflight) >= service.cfg.max_inflight:
        return error(id_, "overloaded", f"{len(conn.inflight)} requests in flight on this connection",
                     service.retry_after_ms())
    return None


def _start(conn: Conn, coro) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    conn.tasks.add(task)
    task.add_done_callback(conn.tasks.discard)


def _warmup(service, conn: Conn, f: dict) -> dict | None:
    if not service.ready:
        return error(None, "not_ready", "models are still loading", service.retry_after_ms())
    job = Job(_doc_key(conn, f["doc"]), f["prefix"], f["suffix"] or "", f["language"], _max_new(service, f),
              extra=protocol.chunks(f["extra"]))
    conn.docs.add(f["doc"])
    service.warmup(job)
    return None


def _cancel(service, conn: Conn, f: dict) -> None:
    ev = conn.inflight.get(f["id"])
    if ev is not None:
        ev.set()


# feedback and forget take the engine's locks only briefly: run here, so later frames see them
def _feedback(service, conn: Conn, f: dict) -> None:
    if f["kind"] == "next_edit":  # a next edit shown: counted by outcome (/metrics), not the engine's
        service.metrics.requests.labels("next_edit_feedback", "accepted" if f["accepted"] else "rejected").inc()
        return
    if f["kind"] not in (None, "completion"):
        raise BadRequest(f'"kind" must be completion or next_edit, not {f["kind"]!r}', "kind")
    if service.ready:
        service.engine.feedback(_doc_key(conn, f["doc"] or ""), f["text"] or "", f["accepted"],
                                f["accepted_chars"])


def _forget(service, conn: Conn, f: dict) -> None:
    conn.docs.discard(f["doc"])
    if service.ready:
        service.engine.forget(_doc_key(conn, f["doc"]))


HANDLERS = {"hello": _hello, "ping": _ping, "complete": _complete, "warmup": _warmup, "cancel": _cancel,
            "feedback": _feedback, "forget": _forget, "next_edit": _next_edit, "rewrite": _rewrite}
