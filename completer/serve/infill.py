"""llama-server's `POST /infill` on `completer serve`, as llama.vim and llama.vscode send it and
read it (docs/llama-clients.md), so that those plugins run on this engine unchanged: a request
goes through the syntax layer (pipeline.complete_at), type-through and the confidence gate like
every other surface, and the answer has llama-server's shape.

What this module owns:
- the request's fields (`InfillRequest`): `input_prefix` + `prompt` (the cursor line's start, which
  llama-server puts after its FIM middle token: the end of the prefix) and `input_suffix`;
  `input_extra` [{text, filename?, time?}] as our chunks, within the bounds of `extra`;
- which document a request is in (`Documents`): the clients send no file name and always
  `id_slot: 0`, so a request goes to the remembered document that holds most of its lines;
- llama-server's rules for the answer: `stop` strings, `n_indent`, `t_max_predict_ms` (the answer
  is cut once a line is complete and the time is up, as llama-server cuts it after a newline),
  `n_predict: 0` (a warm-up: our warmup path), `n_cmpl`, `response_fields` (a slash path is a
  literal key), SSE streaming, and the error body {"error": {code, message, type}}.

The answer is compact JSON (no spaces): llama.vim matches the raw text `"content":"` before it
decodes it. `service` is the app's EngineService (duck-typed: this module does not import the app).
"""
from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from aiohttp import web

from .. import errors
from ..client import Chunk, Completion, StopReason
from ..documents import language_for
from ..wellformed import well_formed
from . import protocol
from .openai import MAX_STOPS, _sendable
from .protocol import BadRequest, Job, Refused, check, first_stop

# field → accepted types (llama-server ignores the fields it does not know, and so do we)
FIELDS = {"input_prefix": (str,), "input_suffix": (str,), "prompt": (str,), "input_extra": (list,),
          "n_predict": (int,), "n_indent": (int,), "stop": (str, list), "t_max_predict_ms": (int, float),
          "t_max_prompt_ms": (int, float), "n_cmpl": (int,), "response_fields": (list,), "stream": (bool,),
          "cache_prompt": (bool,), "id_slot": (int,), "model": (str,), "temperature": (int, float),
          "top_k": (int, float), "top_p": (int, float), "samplers": (list, str)}
INT32_MAX = 2**31 - 1
UNNAMED = "tmp"  # llama-server's name for a chunk without a filename
# HTTP status → llama-server's error type (its format_error_response); 429 is ours: llama-server
# says "unavailable" when it has no slot free
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 429: "unavailable_error",
               501: "not_supported_error", 503: "unavailable_error"}
LIMIT = "limit"  # llama-server's stop_type for n_predict, the context, n_indent and t_max_predict_ms


@dataclass(frozen=True)
class InfillRequest:
    """One /infill body, checked."""
    prefix: str                 # input_prefix + prompt
    suffix: str
    extra: tuple[Chunk, ...]
    n_predict: int | None       # None: the server's --max-new-tokens; 0: a warm-up
    n_indent: int               # 0: off
    stops: tuple[str, ...]
    deadline_ms: int            # t_max_predict_ms; 0: none
    n_cmpl: int
    fields: tuple[str, ...]     # response_fields; (): all
    stream: bool
    cache: bool                 # cache_prompt: false gets a document of its own, forgotten after
    id_slot: int

    @property
    def language(self) -> str:
        """The cursor file's language, which these clients do not send: the one the files of
        `input_extra` agree on (their ring holds chunks of the files the user worked in), else
        plain text (the syntax layer's line rules)."""
        found = {language_for(path=c.path) for c in self.extra} - {None}
        return found.pop() if len(found) == 1 else "plaintext"


def parse(body: bytes, ctx: int, n_parallel: int) -> InfillRequest:
    """The request's fields; `n_predict` is kept to `ctx // 2` (llama-server takes any and stops
    at the context's end); `n_cmpl` is at most `n_parallel`, as llama-server bounds it by its
    slots. Raises BadRequest."""
    req = protocol.json_object(body)
    f = {name: check(req, name, types, required=name in ("input_prefix", "input_suffix"))
         for name, types in FIELDS.items()}
    n_predict = _between(f, "n_predict", -1, INT32_MAX, -1)
    stops = [f["stop"]] if isinstance(f["stop"], str) else f["stop"] or []
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) for s in stops):
        raise BadRequest(f"Field 'stop': a string or a list of at most {MAX_STOPS} strings", "stop")
    fields = f["response_fields"] or []
    if not all(isinstance(p, str) for p in fields):
        raise BadRequest("Field 'response_fields': a list of strings", "response_fields")
    return InfillRequest(
        prefix=f["input_prefix"] + (f["prompt"] or ""), suffix=f["input_suffix"],
        extra=_chunks(f["input_extra"]), n_predict=None if n_predict < 0 else min(n_predict, ctx // 2),
        n_indent=_between(f, "n_indent", 0, INT32_MAX, 0), stops=tuple(well_formed(s) for s in stops if s),
        deadline_ms=_between(f, "t_max_predict_ms", -1, 2**63 - 1, 0),
        n_cmpl=_between(f, "n_cmpl", 1, n_parallel, 1), fields=tuple(fields), stream=bool(f["stream"]),
        cache=f["cache_prompt"] is not False, id_slot=_between(f, "id_slot", -1, INT32_MAX, -1))


def _between(f: dict, name: str, lo: int, hi: int, default: int) -> int:
    """Field `name` as an int in lo..hi, in llama-server's words when it is not (llama.vscode
    reads "Field 'n_cmpl': Value must be between" to name its setting)."""
    v = f[name]
    if v is None:
        return default
    if not lo <= v <= hi:  # also NaN and the infinities, which Python's json reads
        raise BadRequest(f"Field '{name}': Value must be between {lo} <= value <= {hi}, but got {v}", name)
    return int(v)


def _chunks(items: list | None) -> tuple[Chunk, ...]:
    """`input_extra` as the chunks of `extra` (protocol.chunks: its bounds and messages)."""
    if items is None:
        return ()
    if len(items) > protocol.MAX_CHUNKS:  # the bound's owner refuses it on its length, reading no item
        return protocol.chunks(items, "input_extra")
    extra = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            try:
                name = check(item, "filename", (str,))
            except BadRequest as e:
                raise BadRequest(f'"input_extra[{i}]": {e}', "input_extra") from None
            # an unnamed buffer's chunk (llama.vim sends "") gets llama-server's name for none
            item = {"path": name or UNNAMED, "text": item.get("text")}
        extra.append(item)
    return protocol.chunks(extra, "input_extra")


# -- documents -------------------------------------------------------------------------------------
SAME_DOCUMENT = 0.5   # share of a request's lines a remembered document must hold to be its document
MAX_DOCUMENTS = 16    # remembered; the least recently used is forgotten (its KV cache and record)
MAX_LINES = 1024      # lines on each side of the cursor compared


@dataclass(eq=False)
class Document:
    key: str
    lines: frozenset[int] = frozenset()  # hashes of its last request's lines
    last: Job | None = None              # its last completion: what a ring warm-up prepares again


class Documents:
    """The /infill documents, each with its own KV cache and type-through record. A request goes
    to the one that holds most of its lines (the window llama.vim and llama.vscode send slides
    with the cursor, its lines stay), so switching files keeps each file's cache; with no line to
    compare (a one-line file) to the last one used. Event-loop state."""

    def __init__(self, forget):
        self.forget = forget  # frees a document's KV cache and record in the engine
        self.docs: OrderedDict[str, Document] = OrderedDict()  # least recently used first
        self.made = 0

    def pick(self, prefix: str, suffix: str) -> Document:
        # the cursor line's own text changes with every keystroke: compare the lines around it
        before, after = prefix.split("\n")[-MAX_LINES - 1:-1], suffix.split("\n")[1:MAX_LINES + 1]
        lines = frozenset(hash(s) for s in (x.strip() for x in before + after) if s)
        if lines:
            best = max(self.docs.values(), key=lambda d: len(lines & d.lines), default=None)
            doc = best if best is not None and len(lines & best.lines) >= SAME_DOCUMENT * len(lines) else None
            newest = self.newest()
            if doc is None and newest is not None and not newest.lines:
                doc = newest  # made by a warm-up for the completion that follows it
        else:
            doc = self.newest()
        doc = doc or self._new()
        doc.lines = lines or doc.lines
        self.docs.move_to_end(doc.key)
        return doc

    def newest(self) -> Document | None:
        return next(reversed(self.docs.values()), None)

    def newest_or_new(self) -> Document:
        return self.newest() or self._new()

    def _new(self) -> Document:
        self.made += 1
        doc = self.docs[f"infill:{self.made}"] = Document(f"infill:{self.made}")
        if len(self.docs) > MAX_DOCUMENTS:
            self.forget(self.docs.popitem(last=False)[0])
        return doc


# -- the answer -------------------------------------------------------------------------------------
@dataclass
class Watch:
    """What of a completion has settled (syntax/stream.py: complete, post-processed lines), and the
    request's cuts on it: a stop string, a line indented less than `n_indent`, the deadline. Each
    stops decoding through the cancel flag once it applies."""
    req: InfillRequest
    cancel: threading.Event
    text: str = ""
    late: bool = False      # t_max_predict_ms passed
    cut_late: bool = False  # the deadline set the cancel flag

    def feed(self, delta: str) -> None:
        self.text += delta
        if self.limit(self.text) is not None:
            self.cancel.set()  # the rest would be cut: stop paying for it
        self.check_deadline()

    def due(self) -> None:
        self.late = True
        self.check_deadline()

    def check_deadline(self) -> None:
        # as llama-server: only once a newline was generated (a settled line), so the first line is whole
        if self.late and self.text and not self.cancel.is_set():
            self.cut_late = True
            self.cancel.set()

    def limit(self, text: str) -> int | None:
        """Where the stop strings or n_indent end `text`, else None."""
        cuts = (first_stop(text, self.req.stops), _indent_cut(text, self.req.n_indent))
        return min((c for c in cuts if c is not None), default=None)


def _indent_cut(text: str, n_indent: int) -> int | None:
    """llama-server's n_indent rule: the start of the first line after a newline that has text
    indented less than `n_indent` (that line and the rest are dropped)."""
    start = text.find("\n") + 1 if n_indent > 0 else 0
    while start > 0:
        end = text.find("\n", start)
        line = text[start:end if end >= 0 else len(text)]
        body = line.lstrip(" \t")
        if body and len(line) - len(body) < n_indent:
            return start
        start = end + 1
    return None


@dataclass(frozen=True)
class Answer:
    """One completion as llama-server reports it."""
    content: str
    c: Completion
    stop_type: str          # eos | limit | word | none
    stopping_word: str = ""
    truncated: bool = False  # cut by t_max_predict_ms, or the context was full

    @classmethod
    def of(cls, c: Completion, watch: Watch) -> Answer:
        if c.stop_reason == StopReason.SUPERSEDED:  # a newer request for the document took over: nothing to show
            return cls("", c, "none")
        cut_late = watch.cut_late and c.stop_reason == StopReason.CANCELLED
        text = watch.text if cut_late else c.text  # cut by the deadline: the lines that had settled
        cut = watch.limit(text)
        if cut is not None:
            word = next((s for s in watch.req.stops if text.startswith(s, cut)), "")
            return cls(text[:cut], c, "word" if word else LIMIT, word)
        if cut_late or c.stop_reason == StopReason.CONTEXT:
            return cls(text, c, LIMIT, truncated=True)
        return cls(text, c, LIMIT if c.stop_reason == StopReason.LENGTH else "eos")

    def final(self, service, req: InfillRequest, index: int, streamed: bool) -> dict:
        """llama-server's final result (its keys in its order; the rendered prompt is not echoed),
        reduced to `response_fields` when the request named them."""
        c = self.c
        out = {"index": index, "content": "" if streamed else self.content, "tokens": [],
               "id_slot": max(req.id_slot, 0), "stop": True, "model": service.model_id,
               "tokens_predicted": c.new_tokens, "tokens_evaluated": c.prompt_tokens,
               "generation_settings": _settings(service, req), "has_new_line": "\n" in self.content,
               "truncated": self.truncated, "stop_type": self.stop_type, "stopping_word": self.stopping_word,
               "tokens_cached": c.prompt_tokens - c.prefill_tokens, "timings": _timings(c)}
        return _only(out, req.fields) if req.fields else out


def _settings(service, req: InfillRequest) -> dict:
    """What decoded this request (llama.vscode shows `n_ctx`); sampling is the server's
    --temperature/--top-p: the syntax-aware path takes no per-request sampling."""
    s = service.engine.sampling
    n_predict = service.engine.cfg.max_new_tokens if req.n_predict is None else req.n_predict
    return {"n_ctx": service.engine.ctx, "n_predict": n_predict,
            "temperature": s.temperature, "top_p": s.top_p, "stop": list(req.stops), "n_indent": req.n_indent,
            "t_max_predict_ms": req.deadline_ms, "stream": req.stream, "cache_prompt": req.cache}


def _timings(c: Completion) -> dict:
    """llama-server's timings from the engine's numbers: prompt_* the prompt tokens computed
    (cache_n: reused from the document's KV cache), predicted_* the decoding after it; draft_*
    the speculative drafts proposed and accepted. A rate with nothing counted is 0."""
    prompt_ms = float(c.extra.get("prefill_ms", 0.0))
    engine_ms = c.syntax.engine_total_ms if c.syntax is not None else c.total_ms
    predicted_ms = max(engine_ms - float(c.extra.get("queue_ms", 0.0)) - prompt_ms, 0.0)
    per = lambda n, ms: (ms / n if n else 0.0, 1e3 * n / ms if n and ms else 0.0)
    (p_tok, p_sec), (g_tok, g_sec) = per(c.prefill_tokens, prompt_ms), per(c.new_tokens, predicted_ms)
    out = {"cache_n": c.prompt_tokens - c.prefill_tokens, "prompt_n": c.prefill_tokens,
           "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
           "predicted_n": c.new_tokens, "predicted_ms": predicted_ms, "predicted_per_token_ms": g_tok,
           "predicted_per_second": g_sec}
    if c.extra.get("proposed"):
        out.update(draft_n=c.extra["proposed"], draft_n_accepted=c.extra.get("accepted", 0))
    return out


def _only(out: dict, paths: tuple[str, ...]) -> dict:
    """llama-server's response_fields: each path ("timings/prompt_n") followed through the
    objects, its value under the path itself as a key; a path that leads nowhere is left out."""
    kept = {}
    for path in paths:
        v, found = out, True
        for key in path.split("/"):
            found = found and isinstance(v, dict) and key in v
            v = v[key] if found else None
        if found:
            kept[path] = v
    return kept


def _dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"code": status, "message": message, "type": kind}}


def error(status: int, message: str, retry_after_ms: int | None = None) -> web.Response:
    headers = None if retry_after_ms is None else {"Retry-After": str(max(1, round(retry_after_ms / 1e3)))}
    return web.Response(body=_dumps(_error_body(status, message)), status=status, headers=headers,
                        content_type="application/json", charset="utf-8")


def refused(e: Refused) -> web.Response:
    return error(errors.http_status(e.code), e.message, e.retry_after_ms)


class Infill:
    """The `POST /infill` endpoint of one service."""

    def __init__(self, service):
        self.service = service
        self.docs = Documents(lambda key: service.engine.forget(key))

    async def answer(self, request: web.Request) -> web.StreamResponse:
        service = self.service
        if service.cfg.token is not None and not service.token(request):
            return error(401, "Invalid API Key")
        if not service.ready:
            return error(503, "Loading model", service.retry_after_ms())
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error(413, f"the body exceeds {service.cfg.max_frame_bytes} bytes (--max-frame-bytes)")
        try:
            req = parse(body, service.engine.ctx, service.engine.cfg.max_batch)
        except BadRequest as e:
            return error(400, str(e))
        if req.n_predict == 0:
            return self._warmup(req)
        doc = self.docs.pick(req.prefix, req.suffix) if req.cache else None
        doc_key = doc.key if doc is not None else f"infill:-{uuid.uuid4().hex}"  # one-off: forgotten after
        # streamed also for an answer sent whole: its deltas (settled lines) are what the cuts watch
        job = Job(doc_key, req.prefix, req.suffix, req.language, req.n_predict, stream=True, extra=req.extra,
                  n=req.n_cmpl)
        if doc is not None:
            doc.last = job
        try:
            return await self._complete(request, req, job)
        finally:
            if doc is None:
                service.engine.forget(doc_key)

    def _warmup(self, req: InfillRequest) -> web.Response:
        """`n_predict: 0`: prefill, answered at once. The ring buffer's request (no prefix, prompt
        or suffix: only new chunks) prepares the completion that follows it: the last one of the
        document last used, with these chunks."""
        if req.prefix or req.suffix:
            doc = self.docs.pick(req.prefix, req.suffix)
            job = Job(doc.key, req.prefix, req.suffix, req.language, extra=req.extra)
        else:
            doc = self.docs.newest_or_new()
            last = doc.last or Job(doc.key, "")  # none yet: the chunks alone, as llama-server warms its slot
            job = Job(doc.key, last.prefix, last.suffix, req.language, last.max_new, extra=req.extra)
        self.service.warmup(job)
        answer = Answer("", Completion(""), LIMIT)
        return web.Response(body=_dumps(answer.final(self.service, req, 0, False)),
                            content_type="application/json", charset="utf-8")

    async def _complete(self, request: web.Request, req: InfillRequest, job: Job) -> web.StreamResponse:
        """The completion through the service (its deltas are the settled lines the request's
        cuts watch), answered whole or as llama-server's server-sent events."""
        service, cancel = self.service, threading.Event()
        watch = Watch(req, cancel)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        sent = [0]

        async def send(event: dict) -> None:
            if not resp.prepared:
                await resp.prepare(request)
            await resp.write(b"data: " + _dumps(event) + b"\n\n")

        async def on_delta(delta: str) -> None:
            watch.feed(delta)
            if req.stream:  # what a stop string may still begin, or a cut drops, is held back
                cut = watch.limit(watch.text)
                end = min(_sendable(watch.text, req.stops), len(watch.text) if cut is None else cut)
                if end > sent[0]:
                    await send(_partial(watch.text[sent[0]:end], req))
                    sent[0] = end

        loop = asyncio.get_running_loop()
        timer = loop.call_later(req.deadline_ms / 1e3, watch.due) if req.deadline_ms > 0 else None
        try:
            c, _ = await service.complete(job, cancel, on_delta, "infill")
        except ConnectionError:
            return resp  # the client went away: its generation was cancelled
        except Refused as e:
            if not resp.prepared:
                return refused(e)
            await send(_error_body(errors.http_status(e.code), e.message))
            await resp.write_eof()
            return resp
        finally:
            if timer is not None:
                timer.cancel()
        # the main completion, then its distinct alternatives (engine/alternatives.py), each under the
        # request's cuts (stop strings, n_indent; the deadline's cut is the main one's)
        answers = [Answer.of(c, watch)]
        for alt in (Answer.of(a, Watch(req, threading.Event())) for a in c.alternatives):
            if alt.content.strip() and all(alt.content != a.content for a in answers):
                answers.append(alt)
        if not req.stream:
            finals = [a.final(service, req, i, False) for i, a in enumerate(answers)]
            return web.Response(body=_dumps(finals if req.n_cmpl > 1 else finals[0]),
                                content_type="application/json", charset="utf-8")
        rest = answers[0].content[sent[0]:] if answers[0].content.startswith(watch.text[:sent[0]]) else ""
        if rest:
            await send(_partial(rest, req))
        for i, a in enumerate(answers):
            if i and a.content:  # an alternative comes whole, after the main answer
                await send(_partial(a.content, req, i))
            await send(a.final(service, req, i, True))
        await resp.write_eof()
        return resp


def _partial(text: str, req: InfillRequest, index: int = 0) -> dict:
    """A streamed piece, as llama-server's partial result (the token counts come with the final one)."""
    return {"index": index, "content": text, "tokens": [], "stop": False, "id_slot": max(req.id_slot, 0)}
