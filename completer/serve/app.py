"""`completer serve`: the engine as a service for web editors, shared language servers and
OpenAI-compatible tools, on one host:port (aiohttp: HTTP and WebSocket on one server).

  /ws                 WebSocket + msgpack (ws.py, protocol.py, docs/websocket.md)
  /v1/completions     OpenAI-compatible completions, /v1/models (openai.py)
  /metrics, /health   Prometheus text (metrics.py), readiness

The event loop only parses, validates and sends; model work runs in worker threads (workers.py:
a pool sized to the cores, requests beyond it queued; the engine's scheduler decides who runs).
Every client mistake is answered with an error and the connection stays open; no exception of a
handler reaches the server loop. SIGINT/SIGTERM end it cleanly at any moment: generations are
cancelled, each open answer ends with an error (an SSE stream with an error event), exit code 0.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, web

from .. import __version__, errors, netguard, pipeline
from ..client import Completion, EngineError, StopReason
from ..config import ServeConfig
from ..documents import PositionError
from ..edits.formats import EditPrompt
from ..edits.predict import HistoryError, NextEdit, from_versions, predict
from . import infill, openai, protocol, ws
from .metrics import Metrics
from .protocol import Job, Refused
from .workers import Workers, pool_size

SHUTDOWN_S = 5.0  # on SIGINT/SIGTERM, how long answers in progress get to end (a cancelled generation stops within one step)


class EngineService:
    """The engine behind every endpoint: its loading, the worker pool, one completion or warmup
    for either endpoint, and shutdown."""

    def __init__(self, cfg: ServeConfig, make_engine: Callable[[], object]):
        self.cfg = cfg
        self.make_engine = make_engine
        self.engine = None
        self.ready = False
        self.load_error: str | None = None
        self.model_info: dict = {}
        self.model_id = ""  # the id /v1 serves it as: the target as given
        self.workers: Workers | None = None
        self.loader: threading.Thread | None = None  # loads the models (native code: see run())
        self.stopping = False  # SIGINT/SIGTERM: what runs is cancelled, what waits is refused
        self.cancels: set[threading.Event] = set()  # of the completions in progress
        self.conns: set[ws.Conn] = set()
        self.request_ms = 100.0  # moving average of a completion's time: the retry hint
        self.metrics = Metrics(lambda: self.engine.stats() if self.ready else None, lambda: self.ready)
        self.version = __version__

    # -- models ----------------------------------------------------------------------------
    def load(self) -> None:
        """Load the models and warm them up (a worker thread; /health says 503 meanwhile)."""
        try:
            engine = self.make_engine()
            self.workers = Workers(pool_size(engine.cfg.max_batch), engine.cfg.max_queue)
            warm_ms = engine.warm_start()
            sample = "def load(path):\n    with open(path) as f:\n        return json.load(f)\n"
            self.model_info = {
                "target": engine.pair.target_name, "draft": engine.pair.draft_name,
                "device": str(engine.pair.device), "ctx": engine.ctx, "fim": engine.fim.layout,
                "max_new_tokens": engine.cfg.max_new_tokens, "max_draft_len": engine.cfg.max_draft_len,
                "prompt_budget": engine.prompt_budget(),
                "chars_per_token": round(len(sample) / max(engine.count_tokens(sample), 1), 3),
                "next_edit_model": engine.editor.pair.target_name if engine.editor is not None else None}
            self.model_id = engine.pair.target_name
            self.engine = engine
            self.ready = True
            print(f"completer serve: models ready (warm start {warm_ms:.0f} ms)", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - reported, and run() exits with it
            self.load_error = str(e) or type(e).__name__

    def retry_after_ms(self) -> int:
        return max(50, round(self.request_ms))

    def stop(self) -> None:
        """SIGINT/SIGTERM: generations in progress are cancelled and queued requests refused; their
        handlers answer with an error (an SSE stream: an error event) before the connections close."""
        self.stopping = True
        for cancel in list(self.cancels):
            cancel.set()
        if self.workers is not None:
            self.workers.shutdown()

    async def _going_away(self, app: web.Application) -> None:
        """Shutdown: the WebSocket answers in progress end first (error frames), then each
        connection closes with 1001."""
        tasks = [t for conn in self.conns for t in conn.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_S)
        for conn in list(self.conns):
            await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")

    # -- one completion, for either endpoint -----------------------------------------------
    async def complete(self, job: Job, cancel: threading.Event, on_delta: Callable[[str], Awaitable[None]],
                       kind: str) -> tuple[Completion, bool]:
        """Run `job` in a worker thread, awaiting `on_delta(text)` for each streamed delta →
        (the final completion, whether it was cancelled). Raises Refused (also when the server
        stops meanwhile); `cancel` is set when this coroutine ends early (its caller went away)."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue = asyncio.Queue()

        def work() -> Completion:
            try:
                if cancel.is_set():
                    return Completion("", stop_reason=StopReason.CANCELLED)
                on_text = (lambda d: loop.call_soon_threadsafe(deltas.put_nowait, d)) if job.stream else None
                return self._run_engine(job, cancel, on_text)
            finally:
                loop.call_soon_threadsafe(deltas.put_nowait, None)

        superseded = threading.Event()  # a newer request for the document waits for our worker

        def supersede() -> None:
            superseded.set()
            cancel.set()

        self.cancels.add(cancel)
        try:
            if self.stopping:
                raise Refused("not_ready", "the server is shutting down")
            fut = await self.workers.run(job.doc_key, work, supersede)
            if fut is None:  # a newer request for the document took its place in the queue
                c = Completion("", stop_reason=StopReason.SUPERSEDED)
            else:
                while (delta := await deltas.get()) is not None:
                    await on_delta(delta)
                c = await fut
                if superseded.is_set() and c.stop_reason == StopReason.CANCELLED:
                    c.stop_reason = StopReason.SUPERSEDED
            if self.stopping and (cancel.is_set() or c.stop_reason == StopReason.CANCELLED):
                raise Refused("not_ready", "the server is shutting down; its answer was cut")
        except Refused as e:
            self.metrics.requests.labels(kind, "error").inc()
            if e.code == "overloaded" and e.retry_after_ms is None:
                e.retry_after_ms = self.retry_after_ms()
            raise
        except EngineError as e:
            self.metrics.requests.labels(kind, "error").inc()
            raise self._refusal(e) from None
        except Exception as e:
            cancel.set()
            if not isinstance(e, ConnectionError):
                traceback.print_exc()
                self.metrics.requests.labels(kind, "error").inc()
                raise Refused("internal", f"{type(e).__name__}: {e}") from None
            raise
        except BaseException:  # cancelled: the client went away
            cancel.set()
            raise
        finally:
            self.cancels.discard(cancel)
        cancelled = cancel.is_set() or c.stop_reason in (StopReason.CANCELLED, StopReason.SUPERSEDED)
        type_through = c.type_through or c.prefetched  # served without a model call at request time
        quiet = not c.text and c.stop_reason == StopReason.UNSURE  # the confidence gate left nothing (completer/confidence.py)
        self.metrics.requests.labels(kind, "cancelled" if cancelled else "type_through" if type_through
                                     else "quiet" if quiet else "ok").inc()
        if not cancelled:
            self.metrics.observe(c.to_json())
            self.request_ms = 0.9 * self.request_ms + 0.1 * c.total_ms
        return c, cancelled

    def _run_engine(self, job: Job, cancel: threading.Event, on_text) -> Completion:
        """The syntax-aware pipeline when a language is given, else the plain engine (a worker thread)."""
        if job.language:
            return pipeline.complete_at(self.engine, job.prefix + job.suffix, len(job.prefix), language=job.language,
                                        doc_key=job.doc_key, options=pipeline.CompletionOptions(max_new_tokens=job.max_new),
                                        cancel=cancel, on_text=on_text, extra=job.extra, n=job.n)
        base = self.engine.sampling
        sampling = dataclasses.replace(base, temperature=base.temperature if job.temperature is None else job.temperature,
                                       top_p=base.top_p if job.top_p is None else job.top_p)
        c = self.engine.complete(job.prefix, job.suffix, doc_key=job.doc_key, max_new=job.max_new,
                                 stop_text=protocol.stop_text(job.stop) if job.stop else None,
                                 cancel=cancel, on_text=on_text, node_kind=job.node_kind, sampling=sampling,
                                 extra=job.extra, n=job.n)
        if job.usage:  # OpenAI's usage: the tokens of the text returned, as the tokenizer reads it
            if c.type_through or c.prefetched:  # served without a model call: what the prompt stands for
                c.prompt_tokens = len(self.engine.fim_prompt(job.prefix, job.suffix, job.max_new, job.extra))
            for a in (c, *c.alternatives):  # not the drafts a round verified past a stop's cut
                a.new_tokens = self.engine.count_tokens(a.text)
        return c

    async def rewrite(self, request: EditPrompt, fmt: str, doc_key: str, max_new: int | None, speculative: bool,
                      cancel: threading.Event) -> Completion:
        """The engine's rewrite of `request` in a worker thread (a remote language server's next
        edit: it made the prompt's parts itself). Raises Refused as for a completion."""
        def work() -> Completion:
            if cancel.is_set():
                return Completion("", stop_reason=StopReason.CANCELLED)
            return self.engine.rewrite(request, fmt=fmt, doc_key=doc_key, max_new=max_new, speculative=speculative,
                                       cancel=cancel)

        return await self._run(work, doc_key, cancel, "rewrite", lambda c: c.stop_reason != StopReason.CANCELLED)

    async def next_edit(self, text: str, line: int, col: int, before: str, path: str, language: str | None,
                        doc_key: str, cancel: threading.Event, fmt: str = "auto", rename: bool = True,
                        rename_first: bool = True) -> NextEdit:
        """The next edit after `before` became `text` (completer/edits/predict.py; `fmt`: the
        next-edit format, as the option next_edit_format; `rename`, `rename_first`: as
        next_edit_rename and next_edit_rename_first): the two versions compared beside the
        workers (Workers.aside: a large pair holds no worker another client waits for), the
        prediction in a worker thread. Raises Refused: bad_request for a position outside the
        text or a `before` that is not an earlier version of it; the engine's errors as for a
        completion."""
        try:
            history = await self.workers.aside(lambda: from_versions(before, text, path))
        except (HistoryError, Refused) as e:
            self.metrics.requests.labels("next_edit", "error").inc()
            if isinstance(e, Refused):
                raise
            raise Refused("bad_request", str(e)) from None

        def work() -> NextEdit:
            if cancel.is_set():
                return NextEdit(dropped="cancelled")
            try:
                return predict(self.engine, text, line, col, history, path=path, language=language,
                               fmt=fmt, doc_key=doc_key, cancel=cancel, rename=rename,
                               rename_first=rename_first)
            except PositionError as e:
                raise Refused("bad_request", str(e)) from None

        got = await self._run(work, doc_key, cancel, "next_edit", lambda ne: ne.dropped is None)
        return NextEdit(dropped="cancelled") if got is None else got

    async def _run(self, work: Callable[[], object], doc_key: str, cancel: threading.Event, kind: str,
                   ok: Callable[[object], bool]):
        """`work()` in a worker thread (None when a newer request for `doc_key` took its place in
        the queue), counted in the metrics as `kind`: ok or empty by `ok(result)`, or error. An
        EngineError becomes the service's Refused."""
        self.cancels.add(cancel)
        try:
            if self.stopping:
                raise Refused("not_ready", "the server is shutting down")
            fut = await self.workers.run(doc_key, work, cancel.set)  # a newer one waiting: ours is obsolete
            got = None if fut is None else await fut
        except Refused:
            self.metrics.requests.labels(kind, "error").inc()
            raise
        except EngineError as e:
            self.metrics.requests.labels(kind, "error").inc()
            raise self._refusal(e) from None
        except BaseException:
            cancel.set()  # the client went away, or our bug: the caller answers it
            raise
        finally:
            self.cancels.discard(cancel)
        self.metrics.requests.labels(kind, "ok" if got is not None and ok(got) else "empty").inc()
        return got

    def warmup(self, job: Job) -> None:
        """Prefill the prompt `job` would use as a completion (through the syntax layer when it
        names a language, as `complete` does), at low priority in a worker; best effort: counted
        in the metrics, not answered. A newer warmup replaces one still waiting."""
        def work():
            try:
                if job.language:
                    pipeline.warmup_at(self.engine, job.prefix + job.suffix, len(job.prefix), doc_key=job.doc_key,
                                       language=job.language, extra=job.extra,
                                       options=pipeline.CompletionOptions(max_new_tokens=job.max_new))
                else:
                    self.engine.warmup(job.prefix, job.suffix, doc_key=job.doc_key, extra=job.extra)
                self.metrics.requests.labels("warmup", "ok").inc()
            except Exception:  # noqa: BLE001 - a warmup is best effort: counted, not answered
                self.metrics.requests.labels("warmup", "error").inc()

        if not self.workers.warm(work):  # it replaced one still waiting
            self.metrics.requests.labels("warmup", "dropped").inc()

    def _refusal(self, e: EngineError) -> Refused:
        """An engine's error as the service's answer."""
        code = errors.service_code(e.code)
        retry = round(e.retry_after * 1e3) if e.retry_after is not None else None
        if code == "overloaded" and retry is None:
            retry = self.retry_after_ms()
        if code == "internal":
            traceback.print_exception(e)
        return Refused(code, e.message or type(e).__name__, retry)

    # -- HTTP ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_frame_bytes, middlewares=[self._guard])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/ws", functools.partial(ws.websocket, self))
        app.router.add_post("/v1/completions", functools.partial(openai.completions, self))
        app.router.add_get("/v1/models", functools.partial(openai.models, self))
        app.router.add_get("/v1/models/{id:.+}", functools.partial(openai.model, self))
        app.router.add_post("/infill", infill.Infill(self).answer)
        app.on_response_prepare.append(_cors)
        app.on_shutdown.append(self._going_away)
        return app

    def token(self, request: web.Request) -> bool | None:
        """True/False for a token given in the Authorization header or the ?token= query, None
        when none was given (netguard's rules)."""
        given = netguard.given_token(request.headers.get("Authorization"), request.query.get("token"))
        if given is None:
            return None
        return self.cfg.token is None or netguard.token_matches(given, self.cfg.token)

    @web.middleware
    async def _guard(self, request: web.Request, handler) -> web.StreamResponse:
        """Host and Origin rules (netguard) for every path; CORS preflight; helpful 404/405."""
        api = request.path.startswith("/v1/")
        if not netguard.host_allowed(request.headers.get("Host"), self.cfg.host, self.cfg.allow_hosts):
            msg = "Host header not allowed (DNS rebinding guard; see --allow-hosts)"
            return openai.error(403, msg, "host_not_allowed") if api else web.Response(status=403, text=msg + "\n")
        if not netguard.origin_allowed(request.headers.get("Origin"), self.cfg.allow_origins):
            msg = "origin not allowed (see --allow-origins)"
            return openai.error(403, msg, "origin_not_allowed") if api else web.Response(status=403, text=msg + "\n")
        request[CORS_ORIGIN] = request.headers.get("Origin")  # passed both rules: _cors may name it
        if request.method == "OPTIONS" and api:  # a browser's CORS preflight (carries no token)
            # the headers the page asks for (the origin passed above): openai-node adds x-stainless-*,
            # and which ones changes with its version
            asked = request.headers.get("Access-Control-Request-Headers") or "Authorization, Content-Type"
            return web.Response(status=204, headers={"Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                                                     "Access-Control-Allow-Headers": asked,
                                                     "Access-Control-Max-Age": "600"})
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as e:
            msg = (f"{request.method} {request.path}: try GET /ws, /health, /metrics, /v1/models "
                   "or POST /v1/completions")
            return openai.error(e.status, msg, "not_found") if api else web.Response(status=e.status, text=msg + "\n")

    async def health(self, request: web.Request) -> web.Response:
        # "ok" as llama-server says it: llama.vscode's health check knows only "ok" and "healthy"
        body = {"status": "ok" if self.ready else ("failed" if self.load_error else "loading")}
        if self.load_error:
            body["error"] = self.load_error
        return web.json_response(body, status=200 if self.ready else 503, dumps=lambda o: json.dumps(o) + "\n")

    async def metrics_page(self, request: web.Request) -> web.Response:
        if self.cfg.token is not None and not self.token(request):
            return web.Response(status=401, text="token required\n")
        body, ctype = self.metrics.text()
        return web.Response(body=body, headers={"Content-Type": ctype})


CORS_ORIGIN = web.RequestKey("cors_origin", str)  # the Origin the guard let through


async def _cors(request: web.Request, response: web.StreamResponse) -> None:
    """Let allowed browser pages read the answers: only an Origin the guard let through is named,
    never a refused one (a page must not read its 403 either)."""
    if request.headers.get("Origin") is None:
        return
    response.headers["Vary"] = "Origin"  # the answer depends on it, the refusals too
    origin = request.get(CORS_ORIGIN)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin


async def _serve(service: EngineService) -> int:
    cfg, loop = service.cfg, asyncio.get_running_loop()
    stop, loaded = loop.create_future(), loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(0))
    runner = web.AppRunner(service.app(), handle_signals=False, handler_cancellation=True, access_log=None,
                           shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, cfg.host, cfg.port).start()
        port = runner.addresses[0][1]
        print(f"completer serve: listening on ws://{cfg.host}:{port}/ws and http://{cfg.host}:{port}/v1 "
              "(models loading)", file=sys.stderr, flush=True)

        def load() -> None:
            service.load()
            with contextlib.suppress(RuntimeError):  # the loop already closed: nobody waits
                loop.call_soon_threadsafe(lambda: loaded.done() or loaded.set_result(None))

        service.loader = threading.Thread(target=load, name="completer-load", daemon=True)
        service.loader.start()
        await asyncio.wait([stop, loaded], return_when=asyncio.FIRST_COMPLETED)
        if service.load_error:
            print(f"completer: error: {service.load_error}", file=sys.stderr)
            return 2
        await stop
    finally:
        service.stop()
        await runner.cleanup()  # the handlers end their answers, then the connections close
    return 0


def run(cfg: ServeConfig, make_engine: Callable[[], object]) -> int:
    """Serve until SIGINT/SIGTERM → the exit code (2: the port cannot be bound, or the models
    failed to load). `make_engine` builds the local Engine (called in a worker thread)."""
    service = EngineService(cfg, make_engine)
    try:
        code = asyncio.run(_serve(service))
    except OSError as e:  # the port is taken, the host does not resolve
        print(f"completer: error: cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    if service.loader is not None and service.loader.is_alive():
        # Stopped while the models load, inside native code (torch, tokenizers): finalising the
        # interpreter under that thread aborts ("terminate called without an active exception",
        # exit 134). Nothing of it needs saving: leave now.
        print("completer serve: stopped while the models were loading", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)
    return code
