"""OpenAI-compatible endpoints of `completer serve`: `POST /v1/completions` (text completion with
`suffix` for fill-in-the-middle, streamed as server-sent events) and `GET /v1/models[/{id}]`, so
that tools speaking OpenAI's API (Continue, Tabby, the openai clients) get the engine's speculative
decoding and per-document KV cache (`user` names the document). `temperature` and `top_p` apply to
the request (rejection sampling keeps the target's distribution); `stream_options.include_usage`
adds the usage chunk. Errors in OpenAI's shape: {"error": {message, type, param, code}}; in a
stream, an error event in that shape ends it. A request a newer one with the same `user`
superseded is such an error (409 "superseded", not to be retried), never a cut text that looks
finished.

`service` is the app's Service (duck-typed here: this module does not import the app)."""
from __future__ import annotations

import json
import threading
import time
import uuid

from aiohttp import web

from .. import errors
from ..client import StopReason
from ..config import OPTIONS
from ..wellformed import well_formed
from .protocol import BadRequest, Job, Refused, check, chunks, first_stop, json_object

# field → accepted types; other fields are ignored, as OpenAI-compatible servers do
FIELDS = {"prompt": (str, list), "suffix": (str,), "max_tokens": (int,), "temperature": (int, float),
          "top_p": (int, float), "stop": (str, list), "stream": (bool,), "n": (int,), "user": (str,),
          "model": (str,), "echo": (bool,), "logprobs": (int,), "best_of": (int,), "stream_options": (dict,),
          "extra": (list,)}  # ours: repository context [{path, text}] (docs/remote.md)
MAX_STOPS = 16  # FIM clients send 6-9 (one per file separator and special token)
MAX_N = OPTIONS["alternatives"].meta["hi"]  # choices: the main completion and its alternatives



def _superseded() -> Refused:
    return Refused("superseded", 'a newer request with the same "user" superseded this one (its text was cut)')


def error(status: int, message: str, code: str | None = None, param: str | None = None,
          headers: dict | None = None) -> web.Response:
    return web.json_response(_error_body(status, message, code, param), status=status, headers=headers)


def _error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": errors.openai_type(status), "param": param,
                      "code": code}}


def refused(e: Refused) -> web.Response:
    """The service's refusal as an OpenAI error (429 with Retry-After when overloaded; the openai
    clients retry 409 unless told not to, and a retried superseded request would supersede the
    newer one)."""
    headers = {"Retry-After": str(max(1, round(e.retry_after_ms / 1e3)))} if e.retry_after_ms is not None else {}
    if e.code == "superseded":
        headers["x-should-retry"] = "false"
    return error(errors.http_status(e.code), e.message, e.code, headers=headers or None)


def _auth(service, request: web.Request) -> web.Response | None:
    if service.cfg.token is not None and not service.token(request):
        return error(401, "a token is required: send Authorization: Bearer TOKEN", "invalid_api_key")
    if not service.ready:
        return error(503, "the models are still loading; retry when /health says ok", "not_ready",
                     headers={"Retry-After": "1"})
    return None


def _model(service) -> dict:
    return {"id": service.model_id, "object": "model", "created": 0, "owned_by": "completer"}


async def models(service, request: web.Request) -> web.Response:
    if (refusal := _auth(service, request)) is not None:
        return refusal
    return web.json_response({"object": "list", "data": [_model(service)]})


async def model(service, request: web.Request) -> web.Response:
    """GET /v1/models/{id} (an id may hold slashes: a model directory, a hub name)."""
    if (refusal := _auth(service, request)) is not None:
        return refusal
    if request.match_info["id"] != service.model_id:
        return error(404, f"the model {request.match_info['id']!r} does not exist here; this server serves "
                          f"{service.model_id!r}", "model_not_found", "model")
    return web.json_response(_model(service))


def parse(body: bytes, ctx: int) -> dict:
    """The request's fields, checked (absent ones None). Raises BadRequest."""
    req = json_object(body)
    f = {name: check(req, name, types, required=name == "prompt") for name, types in FIELDS.items()}
    if isinstance(f["prompt"], list):  # the openai clients send a batch of one as a list
        if len(f["prompt"]) != 1 or not isinstance(f["prompt"][0], str):
            raise BadRequest('"prompt" must be a string or a list of one string (token ids and batches are not '
                             "supported)", "prompt")
        f["prompt"] = check({"prompt": f["prompt"][0]}, "prompt", (str,))
    if f["max_tokens"] is not None and not 1 <= f["max_tokens"] <= ctx // 2:
        raise BadRequest(f'"max_tokens" must be in 1..{ctx // 2}', "max_tokens")
    if f["temperature"] is not None and not 0 <= f["temperature"] <= 2:
        raise BadRequest('"temperature" must be in 0..2', "temperature")
    if f["top_p"] is not None and not 0 < f["top_p"] <= 1:
        raise BadRequest('"top_p" must be in (0, 1]', "top_p")
    if f["n"] is not None and not 1 <= f["n"] <= MAX_N:
        raise BadRequest(f'"n" must be in 1..{MAX_N}', "n")
    for name, default in (("best_of", 1), ("echo", False), ("logprobs", None)):
        if f[name] is not None and f[name] != default:
            raise BadRequest(f'"{name}" = {f[name]!r} is not supported (only {default!r})', name)
    stops = [f["stop"]] if isinstance(f["stop"], str) else f["stop"] or []
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) for s in stops):
        raise BadRequest(f'"stop" must be a string or a list of at most {MAX_STOPS} strings', "stop")
    f["stop"] = tuple(well_formed(s) for s in stops if s)
    options = f["stream_options"] or {}
    f["include_usage"] = check(options, "include_usage", (bool,)) or False
    f["extra"] = chunks(f["extra"])
    return f


async def completions(service, request: web.Request) -> web.StreamResponse:
    if (refusal := _auth(service, request)) is not None:
        return refusal
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error(413, f"the body exceeds {service.cfg.max_frame_bytes} bytes (--max-frame-bytes)",
                     "too_large")
    try:
        f = parse(body, service.engine.ctx)
    except BadRequest as e:
        return error(400, str(e), "bad_request", e.param)
    if f["model"] is not None and f["model"] != service.model_id:
        return error(404, f"the model {f['model']!r} does not exist here; this server serves "
                          f"{service.model_id!r} (GET /v1/models)", "model_not_found", "model")
    user = f["user"]
    doc_key = f"openai:{user}" if user is not None else f"openai:-{uuid.uuid4().hex}"  # one-off: forgotten after
    job = Job(doc_key, f["prompt"], f["suffix"] or "", max_new=f["max_tokens"], stop=f["stop"],
              stream=bool(f["stream"]), temperature=f["temperature"], top_p=f["top_p"], usage=True,
              extra=f["extra"], n=f["n"] or 1)
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": service.model_id}
    cancel = threading.Event()
    try:
        if f["stream"]:
            return await _stream(service, request, job, cancel, head, f["include_usage"])
        try:
            c, _ = await service.complete(job, cancel, _ignore, "openai")
            if c.stop_reason == StopReason.SUPERSEDED:
                raise _superseded()
        except Refused as e:
            return refused(e)
        return web.json_response({**head, "choices": [_choice(a.text, a, i) for i, a in enumerate(_choices(c))],
                                  "usage": _usage(c)})
    finally:
        if user is None:
            service.engine.forget(doc_key)


async def _stream(service, request: web.Request, job: Job, cancel: threading.Event, head: dict,
                  include_usage: bool):
    """Server-sent events: `data: {chunk}` per delta, the last with finish_reason (then the usage
    chunk when asked for), then `data: [DONE]`; or, once anything went out, an error event that
    ends the stream. Text that may be the start of a stop sequence is held back until it is known
    not to be."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    text, sent = [""], [0]  # streamed so far; how much of it went out

    async def emit(chunk_text: str, c=None, index: int = 0) -> None:
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write(b"data: " + json.dumps({**head, "choices": [_choice(chunk_text, c, index)]}).encode()
                         + b"\n\n")

    async def on_delta(delta: str) -> None:
        text[0] += delta
        safe = _sendable(text[0], job.stop)
        if safe > sent[0]:
            await emit(text[0][sent[0]:safe])
            sent[0] = safe

    try:
        c, _ = await service.complete(job, cancel, on_delta, "openai")
        if c.stop_reason == StopReason.SUPERSEDED:
            raise _superseded()
    except ConnectionError:
        return resp  # the client went away: generation was cancelled
    except Refused as e:
        if not resp.prepared:
            return refused(e)
        body = _error_body(errors.http_status(e.code), e.message, e.code)
        await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        await resp.write_eof()
        return resp
    done = text[0][:sent[0]]
    await emit(c.text[len(done):] if c.text.startswith(done) else "", c)
    for i, alt in enumerate(_choices(c)[1:], 1):  # each alternative whole, after the main one
        await emit(alt.text, alt, i)
    if include_usage:  # OpenAI's shape: no choices, the usage of the whole completion
        await resp.write(b"data: " + json.dumps({**head, "choices": [], "usage": _usage(c)}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _sendable(text: str, stops: tuple[str, ...]) -> int:
    """How much of the text streamed so far can go out: up to a stop sequence in it, else all but a
    tail that may begin one."""
    if (stop := first_stop(text, stops)) is not None:
        return stop
    return len(text) - max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _choice(text: str, c=None, index: int = 0) -> dict:
    """A choice; `c` (the final Completion) gives its finish_reason."""
    finish = None if c is None else "length" if c.stop_reason in (StopReason.LENGTH, StopReason.CONTEXT) else "stop"
    return {"text": text, "index": index, "logprobs": None, "finish_reason": finish}


def _choices(c) -> list:
    """The main completion, then its alternatives (the engine's: distinct, best first)."""
    return [c, *c.alternatives]


def _usage(c) -> dict:
    new = sum(a.new_tokens for a in _choices(c))  # every choice's, as OpenAI counts them
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": new, "total_tokens": c.prompt_tokens + new}


async def _ignore(delta: str) -> None:
    """Non-streamed requests get no deltas (Job.stream is False)."""
