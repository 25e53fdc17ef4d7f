"""The WebSocket protocol of `completer serve` (docs/websocket.md): frame schemas as data, their
validation, error codes and msgpack framing; and `Job`, the one completion request both the
WebSocket and the OpenAI endpoints hand to the app."""
from __future__ import annotations

import json
from dataclasses import dataclass

import msgpack

from ..client import Chunk, StopText
from ..edits.formats import HistoryItem
from ..wellformed import well_formed

PROTOCOL_VERSION = "1"
MAX_CHUNKS = 64            # repository-context chunks in one request (a prompt holds a few to a dozen)
MAX_CHUNK_BYTES = 256 << 10  # UTF-8 bytes of all chunks' paths and texts together (a 32k context is ~128 KB)
MAX_PATH_CHARS = 4096

ID = (int, str)
# frame type → {field: (accepted types, required)}; other fields are ignored
FRAMES: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "hello": {"token": ((str,), False), "client": ((str,), False)},
    "ping": {},
    "complete": {"id": (ID, True), "doc": ((str,), True), "prefix": ((str,), True), "suffix": ((str,), False),
                 "language": ((str,), False), "max_new_tokens": ((int,), False), "stream": ((bool,), False),
                 "node_kind": ((str,), False), "extra": ((list,), False), "temperature": ((int, float), False),
                 "top_p": ((int, float), False), "alternatives": ((int,), False)},
    "warmup": {"doc": ((str,), True), "prefix": ((str,), True), "suffix": ((str,), False),
               "language": ((str,), False), "max_new_tokens": ((int,), False), "extra": ((list,), False)},
    "cancel": {"id": (ID, True)},
    "feedback": {"id": (ID, True), "accepted": ((bool,), True), "accepted_chars": ((int,), False),
                 "doc": ((str,), False), "text": ((str,), False), "kind": ((str,), False)},
    "forget": {"doc": ((str,), True)},
    "next_edit": {"id": (ID, True), "text": ((str,), True), "line": ((int,), True), "col": ((int,), True),
                  "before": ((str,), True), "path": ((str,), False), "language": ((str,), False),
                  "format": ((str,), False), "rename": ((bool,), False),
                  "rename_first": ((bool,), False)},
    "rewrite": {"id": (ID, True), "doc": ((str,), True), "history": ((list,), True), "path": ((str,), True),
                "region": ((str,), True), "cursor": ((int,), False), "before": ((str,), False),
                "after": ((str,), False), "format": ((str,), False), "speculative": ((bool,), False),
                "max_new_tokens": ((int,), False), "extra": ((list,), False)},
}
_TYPE_NAMES = {int: "an integer", str: "a string", bool: "a boolean", float: "a number", list: "a list",
               dict: "a map"}


class BadRequest(Exception):
    """A frame or request whose fields are wrong; the message names the field (`param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class FrameError(Exception):
    """A frame that is not a protocol frame at all; `code` is bad_frame or too_large."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Refused(Exception):
    """A request the service answers with an error: `code` is a key of errors.SERVICE."""

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None):
        super().__init__(message)
        self.code, self.message, self.retry_after_ms = code, message, retry_after_ms


@dataclass(frozen=True)
class Job:
    """One completion request, whichever endpoint it came in by."""
    doc_key: str
    prefix: str
    suffix: str = ""
    language: str | None = None    # set: the syntax-aware pipeline; None: the plain engine
    max_new: int | None = None     # None: the engine's default
    node_kind: str | None = None
    stop: tuple[str, ...] = ()     # stop sequences (plain engine only): the text ends before the first
    stream: bool = True
    temperature: float | None = None  # this request's sampling (plain engine only); None: the engine's
    top_p: float | None = None
    usage: bool = False            # count the tokens of a type-through answer too (OpenAI's `usage`)
    extra: tuple[Chunk, ...] = ()  # repository context: chunks of other files, rendered before the prefix
    n: int | None = None           # completions: the main one and up to n-1 alternatives; None: the engine's option


def pack(msg: dict) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def error(id_, code: str, message: str, retry_after_ms: int | None = None) -> dict:
    e = {"type": "error", "id": id_, "code": code, "message": message}
    if retry_after_ms is not None:
        e["retry_after_ms"] = retry_after_ms
    return e


def unpack(message: bytes | str, max_bytes: int) -> dict:
    """One frame → its map with a string "type". Raises FrameError."""
    if isinstance(message, str):
        raise FrameError("bad_frame", "frames must be binary msgpack, not text")
    if len(message) > max_bytes:
        raise FrameError("too_large", f"frame of {len(message)} bytes exceeds {max_bytes}")
    try:  # a lone surrogate (WTF-8 from a JavaScript encoder) decodes here; `check` replaces it
        msg = msgpack.unpackb(message, raw=False, strict_map_key=False, unicode_errors="surrogatepass")
    except Exception as e:  # noqa: BLE001 - any decode failure (and msgpack's depth limit) is the client's frame
        raise FrameError("bad_frame", f"not msgpack: {type(e).__name__}") from None
    if not isinstance(msg, dict):
        raise FrameError("bad_frame", f"a frame must be a msgpack map, not {type(msg).__name__}")
    if not isinstance(msg.get("type"), str):
        raise FrameError("bad_frame", 'a frame needs a string "type"')
    return msg


def frame_id(msg: dict):
    """The frame's id when usable (for error replies), else None."""
    id_ = msg.get("id")
    if isinstance(id_, str):
        return well_formed(id_)  # echoed in the reply: packing a lone surrogate would fail
    return id_ if isinstance(id_, int) and not isinstance(id_, bool) else None


def fields(msg: dict) -> dict:
    """The fields of a frame of a known type, checked against FRAMES (absent optional fields are
    None). Raises BadRequest."""
    return {name: check(msg, name, types, required) for name, (types, required) in FRAMES[msg["type"]].items()}


def json_object(body: bytes) -> dict:
    """An HTTP request's body that must be one JSON object (/v1/completions, /infill). Raises
    BadRequest."""
    try:
        req = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(req).__name__}")
    return req


def check(msg: dict, name: str, types: tuple[type, ...], required: bool = False):
    """msg[name] when it has one of `types` (None when absent and optional; a string well-formed:
    wellformed.py). Raises BadRequest."""
    v = msg.get(name)
    if v is None:
        if required:
            raise BadRequest(f'missing field "{name}"', name)
        return None
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):  # bool is an int
        names = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        raise BadRequest(f'field "{name}" must be {names}, not {type(v).__name__}', name)
    return well_formed(v) if isinstance(v, str) else v


def option(f: dict, name: str):
    """Field `name` of checked fields `f` within the bounds of the engine option of that name
    (config.py), or None when absent. Raises BadRequest."""
    from ..config import OPTIONS, coerce

    if f[name] is None:
        return None
    ok, value = coerce(OPTIONS[name], f[name])
    if not ok:
        raise BadRequest(f'"{name}" = {f[name]!r} is outside the option\'s range (completer options)', name)
    return value


def chunks(value: list | None, name: str = "extra") -> tuple[Chunk, ...]:
    """The `extra` field of a request (a list of {path, text} maps) as Chunks, within MAX_CHUNKS
    and MAX_CHUNK_BYTES. Raises BadRequest naming the field and the chunk."""
    if value is None:
        return ()
    if len(value) > MAX_CHUNKS:
        raise BadRequest(f'"{name}" has {len(value)} chunks; at most {MAX_CHUNKS}', name)
    out, size = [], 0
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f'"{where}" must be a map {{path, text}}, not {type(item).__name__}', name)
        try:
            path, text = check(item, "path", (str,), True), check(item, "text", (str,), True)
        except BadRequest as e:
            raise BadRequest(f'"{where}": {e}', name) from None
        if not path or len(path) > MAX_PATH_CHARS:
            raise BadRequest(f'"{where}.path" must be 1..{MAX_PATH_CHARS} characters', name)
        size += len(path.encode()) + len(text.encode())
        if size > MAX_CHUNK_BYTES:
            raise BadRequest(f'"{name}" holds more than {MAX_CHUNK_BYTES >> 10} KiB of text (at {where})', name)
        out.append(Chunk(path, text))
    return tuple(out)


def history(value: list, name: str = "history") -> tuple[HistoryItem, ...]:
    """The `history` field of a rewrite frame (a list of {path, old, new} maps, oldest first) as
    HistoryItems, at most MAX_CHUNKS of them. Raises BadRequest naming the item."""
    if len(value) > MAX_CHUNKS:
        raise BadRequest(f'"{name}" has {len(value)} items; at most {MAX_CHUNKS}', name)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadRequest(f'"{name}[{i}]" must be a map {{path, old, new}}, not {type(item).__name__}', name)
        try:
            out.append(HistoryItem(*(check(item, k, (str,), True) for k in ("path", "old", "new"))))
        except BadRequest as e:
            raise BadRequest(f'"{name}[{i}]": {e}', name) from None
    return tuple(out)


def first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the earliest of the stop sequences begins in `text`, else None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def stop_text(stops: tuple[str, ...]) -> StopText:
    """The engine's stop rule for stop sequences: keep the text before the first one."""
    return lambda text: first_stop(text, stops)
