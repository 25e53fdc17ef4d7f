"""`completer serve`: the engine as a service for web editors and shared daemons.

WebSocket + msgpack at `ws://HOST:PORT/ws` (protocol: docs/websocket.md), Prometheus text at
`GET /metrics`, readiness at `GET /health`. The event loop only parses, validates and sends
frames; model work runs in worker threads (the engine's scheduler decides who runs). Every
client mistake is answered with an error frame and the connection stays open.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import inspect
import ipaddress
import json
import signal
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import msgpack

PROTOCOL_VERSION = "1"
ERROR_CODES = ("bad_frame", "bad_request", "unknown_type", "too_large", "unauthorized", "overloaded",
               "not_ready", "internal")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 7421                   # 0 = any free port (printed on start)
    token: str | None = None           # required for a non-loopback host
    allow_origins: tuple[str, ...] = ()  # browser origins beyond localhost pages; "*" = any
    max_frame_bytes: int = 4 * 2**20   # larger frames get a too_large error frame
    max_inflight: int = 64             # requests in flight per connection


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def origin_allowed(origin: str | None, allow: tuple[str, ...]) -> bool:
    """No Origin (not a browser) and localhost pages pass; other origins must be listed."""
    if origin is None or "*" in allow or origin in allow:
        return True
    u = urlsplit(origin)
    return u.scheme in ("http", "https") and (u.hostname or "") in ("localhost", "127.0.0.1", "::1")


def _pack(msg: dict) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def _error(id_, code: str, message: str) -> dict:
    return {"type": "error", "id": id_, "code": code, "message": message}


class BadRequest(Exception):
    """A frame whose fields are wrong; the message names the field."""


def _field(msg: dict, name: str, types, required: bool = True, default=None):
    v = msg.get(name)
    if v is None:
        if required:
            raise BadRequest(f'missing field "{name}"')
        return default
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):  # bool is an int
        raise BadRequest(f'field "{name}" must be {_type_names(types)}, not {type(v).__name__}')
    return v


def _type_names(types) -> str:
    names = {int: "an integer", str: "a string", bool: "a boolean"}
    return " or ".join(names.get(t, t.__name__) for t in types)


class Metrics:
    """The service's own registry: request stages, TTFT, speed, acceptance, cache, queue, RSS."""

    def __init__(self, service: Service):
        from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)  # process_resident_memory_bytes and friends
        buckets = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
        self.stage = Histogram("completer_stage_seconds", "Request latency by stage",
                               ["stage"], buckets=buckets, registry=reg)
        self.ttft = Histogram("completer_ttft_seconds", "Time to first token", buckets=buckets, registry=reg)
        self.speed = Histogram("completer_tokens_per_second", "Generated tokens per second of decoding",
                               buckets=(10, 25, 50, 100, 200, 400, 800, 1600, 3200), registry=reg)
        self.accept = Histogram("completer_accepted_per_forward", "Tokens gained per target forward",
                                buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8), registry=reg)
        self.requests = Counter("completer_requests", "Requests by kind and outcome",
                                ["kind", "outcome"], registry=reg)
        self.feedback = Counter("completer_feedback", "Client feedback on shown completions",
                                ["accepted"], registry=reg)
        self.accepted_chars = Counter("completer_accepted_chars", "Characters of accepted completions",
                                      registry=reg)
        reg.register(_EngineCollector(service))

    def observe(self, stats: dict) -> None:
        ms = lambda k: max(float(stats.get(k) or 0.0), 0.0) / 1e3
        total, queue, prefill = ms("total_ms"), ms("queue_ms"), ms("prefill_ms")
        self.stage.labels("total").observe(total)
        self.stage.labels("queue").observe(queue)
        if stats.get("type_through"):
            return
        self.stage.labels("prefill").observe(prefill)
        decode = max(total - queue - prefill, 0.0)
        self.stage.labels("decode").observe(decode)
        self.ttft.observe(ms("ttft_ms"))
        if decode > 0 and stats.get("new_tokens"):
            self.speed.observe(stats["new_tokens"] / decode)
        if stats.get("target_forwards"):
            self.accept.observe(stats["accepted_per_forward"])


class _EngineCollector:
    """Engine counters and gauges read at scrape time."""

    def __init__(self, service: Service):
        self.service = service

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        e = self.service.engine
        yield GaugeMetricFamily("completer_ready", "1 when the models are loaded", value=float(self.service.ready))
        if e is None:
            return
        info = e.info()
        for name in ("requests", "cache_hits", "tokens_reused", "prefill_tokens", "evictions", "warmups",
                     "warmup_tokens", "warmup_preempted", "type_through", "superseded"):
            yield CounterMetricFamily(f"completer_engine_{name}", f"Engine counter: {name}", value=info[name])
        yield CounterMetricFamily("completer_batch_steps", "Forward steps run", value=info["batch_steps"])
        yield CounterMetricFamily("completer_batched_calls", "Forward calls that shared a step",
                                  value=info["batched_calls"])
        for name, help_ in (("kv_bytes", "KV bytes reserved by document slots"),
                            ("kv_live_bytes", "KV bytes holding cached tokens"),
                            ("kv_budget_bytes", "KV byte budget"), ("slots", "Document slots"),
                            ("queue_waiting", "Requests waiting for the scheduler"),
                            ("queue_live", "Requests running")):
            yield GaugeMetricFamily(f"completer_{name}", help_, value=info[name])


class Service:
    def __init__(self, cfg: ServerConfig, make_engine):
        self.cfg = cfg
        self.make_engine = make_engine
        self.engine = None
        self.ready = False
        self.load_error: str | None = None
        self.model_info: dict = {}
        self.metrics = Metrics(self)
        self.pool: ThreadPoolExecutor | None = None
        self.loaded = threading.Event()

    # -- models ----------------------------------------------------------------------------
    def load(self) -> None:
        """Load the models and warm them up (a worker thread; /health says 503 meanwhile)."""
        try:
            engine = self.make_engine()
            self.pool = ThreadPoolExecutor(engine.cfg.max_queue + engine.cfg.max_batch + 4,
                                           thread_name_prefix="completer-work")
            warm_ms = engine.warm_start()
            sample = "def load(path):\n    with open(path) as f:\n        return json.load(f)\n"
            self.model_info = {
                "target": engine.pair.target_name, "draft": engine.pair.draft_name,
                "device": str(engine.pair.device), "ctx": engine.ctx, "fim": engine.fim.layout,
                "max_new_tokens": engine.cfg.max_new_tokens, "max_draft_len": engine.cfg.max_draft_len,
                "prompt_budget": engine.prompt_budget(),
                "chars_per_token": round(len(sample) / max(engine.count_tokens(sample), 1), 3)}
            self.engine = engine
            self.ready = True
            print(f"completer serve: models ready (warm start {warm_ms:.0f} ms)", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - reported, and serve_main exits with it
            self.load_error = str(e) or type(e).__name__
        finally:
            self.loaded.set()

    # -- HTTP ------------------------------------------------------------------------------
    def _token_ok(self, request) -> bool | None:
        """True/False for a token given in the header or query, None when none was given."""
        given = None
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer "):].strip()
        q = parse_qs(urlsplit(request.path).query).get("token")
        if q:
            given = q[0]
        if given is None:
            return None
        return self.cfg.token is None or hmac.compare_digest(given.encode(), self.cfg.token.encode())

    def process_request(self, connection, request):
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        path = urlsplit(request.path).path
        if not origin_allowed(request.headers.get("Origin"), self.cfg.allow_origins):
            return connection.respond(HTTPStatus.FORBIDDEN, "origin not allowed (see --allow-origin)\n")
        token = self._token_ok(request)
        if path == "/health":
            ok = self.ready
            body = {"status": "ready" if ok else ("failed" if self.load_error else "loading")}
            if self.load_error:
                body["error"] = self.load_error
            r = connection.respond(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, json.dumps(body) + "\n")
            r.headers["Content-Type"] = "application/json"
            return r
        if path == "/metrics":
            if self.cfg.token is not None and not token:
                return connection.respond(HTTPStatus.UNAUTHORIZED, "token required\n")
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            body = generate_latest(self.metrics.registry)
            return Response(200, "OK", Headers([("Content-Type", CONTENT_TYPE_LATEST),
                                                ("Content-Length", str(len(body)))]), body)
        if path != "/ws":
            return connection.respond(HTTPStatus.NOT_FOUND, "not found: try /ws, /health or /metrics\n")
        if token is False:
            return connection.respond(HTTPStatus.UNAUTHORIZED, "wrong token\n")
        connection.authed = self.cfg.token is None or bool(token)
        return None

    # -- WebSocket -------------------------------------------------------------------------
    async def handler(self, conn) -> None:
        conn.inflight = {}  # request id → threading.Event (its cancel)
        try:
            async for message in conn:
                reply = self._frame(conn, message)
                if reply is not None:
                    await conn.send(_pack(reply))
        except Exception:  # noqa: BLE001, S110 - the peer went away mid-send: nothing left to answer
            pass
        finally:
            for ev in conn.inflight.values():
                ev.set()

    def _frame(self, conn, message) -> dict | None:
        """Parse and dispatch one frame; the reply frame, if any is due now."""
        if isinstance(message, str):
            return _error(None, "bad_frame", "frames must be binary msgpack, not text")
        if len(message) > self.cfg.max_frame_bytes:
            return _error(None, "too_large", f"frame of {len(message)} bytes exceeds {self.cfg.max_frame_bytes}")
        try:
            msg = msgpack.unpackb(message, raw=False, strict_map_key=False)
        except Exception as e:  # noqa: BLE001 - any decode failure is the client's frame
            return _error(None, "bad_frame", f"not msgpack: {type(e).__name__}")
        if not isinstance(msg, dict):
            return _error(None, "bad_frame", f"a frame must be a msgpack map, not {type(msg).__name__}")
        typ, id_ = msg.get("type"), msg.get("id")
        if not isinstance(id_, (int, str)) or isinstance(id_, bool):
            id_ = None
        if not isinstance(typ, str):
            return _error(id_, "bad_frame", 'a frame needs a string "type"')
        try:
            if typ == "hello":
                return self._hello(conn, msg)
            if not conn.authed:
                return _error(id_, "unauthorized", "send a hello frame with the token first")
            if typ == "ping":
                return {"type": "pong"}
            if typ == "complete":
                return self._complete(conn, msg)
            if typ == "warmup":
                return self._warmup(conn, msg)
            if typ == "cancel":
                ev = conn.inflight.get(_field(msg, "id", (int, str)))
                if ev is not None:
                    ev.set()
                return None
            if typ == "feedback":
                return self._feedback(msg)
            return _error(id_, "unknown_type", f"unknown frame type {typ!r}")
        except BadRequest as e:
            return _error(id_, "bad_request", str(e))
        except Exception as e:  # noqa: BLE001 - the connection must survive our bugs too
            traceback.print_exc()
            return _error(id_, "internal", f"{type(e).__name__}: {e}")

    def _hello(self, conn, msg: dict) -> dict:
        token = _field(msg, "token", str, required=False)
        _field(msg, "client", str, required=False)
        if self.cfg.token is not None and not conn.authed:
            if token is None or not hmac.compare_digest(token.encode(), self.cfg.token.encode()):
                return _error(None, "unauthorized", "wrong or missing token")
            conn.authed = True
        return {"type": "hello", "server": "completer", "version": _version(), "protocol": PROTOCOL_VERSION,
                "model": self.model_info, "ready": self.ready}

    def _doc_key(self, conn, doc: str) -> str:
        return f"{conn.id}:{doc}"  # documents of different connections never share a slot

    def _complete(self, conn, msg: dict) -> dict | None:
        id_ = _field(msg, "id", (int, str))
        doc = _field(msg, "doc", str)
        prefix = _field(msg, "prefix", str)
        suffix = _field(msg, "suffix", str, required=False, default="")
        language = _field(msg, "language", str, required=False)
        max_new = _field(msg, "max_new_tokens", int, required=False)
        stream = _field(msg, "stream", bool, required=False, default=True)
        kind = _field(msg, "node_kind", str, required=False)
        if not self.ready:
            return _error(id_, "not_ready", "models are still loading; retry when /health says ready")
        if max_new is not None and not 1 <= max_new <= self.engine.ctx // 2:
            raise BadRequest(f'"max_new_tokens" must be in 1..{self.engine.ctx // 2}')
        if id_ in conn.inflight:
            raise BadRequest(f"request id {id_!r} is already in flight")
        if len(conn.inflight) >= self.cfg.max_inflight:
            return _error(id_, "overloaded", f"{len(conn.inflight)} requests in flight on this connection")
        cancel = threading.Event()
        conn.inflight[id_] = cancel
        asyncio.get_running_loop().create_task(self._run_complete(
            conn, id_, self._doc_key(conn, doc), prefix, suffix, language, max_new, stream, cancel, kind))
        return None

    async def _run_complete(self, conn, id_, doc_key, prefix, suffix, language, max_new, stream, cancel,
                            kind=None):
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue = asyncio.Queue()
        done = object()

        def on_text(delta: str) -> None:  # worker thread → event loop
            loop.call_soon_threadsafe(deltas.put_nowait, delta)

        def work():
            try:
                if cancel.is_set():
                    return None
                return _run_engine(self.engine, prefix, suffix, language, doc_key, max_new, cancel,
                                   on_text if stream else None, kind)
            finally:
                loop.call_soon_threadsafe(deltas.put_nowait, done)

        fut = loop.run_in_executor(self.pool, work)
        try:
            while (delta := await deltas.get()) is not done:
                await conn.send(_pack({"type": "chunk", "id": id_, "text": delta}))
            try:
                c = await fut
            except Exception as e:  # noqa: BLE001 - mapped to an error frame
                from .engine.models import ModelError
                from .engine.scheduler import Overloaded

                code = "overloaded" if isinstance(e, Overloaded) else "bad_request" if isinstance(e, ModelError) else "internal"
                if code == "internal":
                    traceback.print_exc()
                self.metrics.requests.labels("complete", "error").inc()
                await conn.send(_pack(_error(id_, code, str(e) or type(e).__name__)))
                return
            text, stats = _result_fields(c)
            if c is None and cancel.is_set():
                stats["stop_reason"] = "cancelled"  # cancelled before it started
            cancelled = cancel.is_set() or stats.get("stop_reason") in ("cancelled", "superseded")
            outcome = "cancelled" if cancelled else "type_through" if stats.get("type_through") else "ok"
            self.metrics.requests.labels("complete", outcome).inc()
            if not cancelled:
                self.metrics.observe(stats)
            await conn.send(_pack({"type": "done", "id": id_, "text": text, "cancelled": cancelled,
                                   "stats": stats}))
        except Exception:  # noqa: BLE001 - the connection closed under us
            cancel.set()
        finally:
            conn.inflight.pop(id_, None)

    def _warmup(self, conn, msg: dict) -> dict | None:
        doc = _field(msg, "doc", str)
        prefix = _field(msg, "prefix", str)
        suffix = _field(msg, "suffix", str, required=False, default="")
        _field(msg, "language", str, required=False)
        if not self.ready:
            return _error(None, "not_ready", "models are still loading")
        key = self._doc_key(conn, doc)

        def work():
            try:
                self.engine.warmup(prefix, suffix, doc_key=key)
                self.metrics.requests.labels("warmup", "ok").inc()
            except Exception:  # noqa: BLE001 - a warmup is best effort: counted, not answered
                self.metrics.requests.labels("warmup", "error").inc()

        self.pool.submit(work)
        return None

    def _feedback(self, msg: dict) -> None:
        _field(msg, "id", (int, str))
        accepted = _field(msg, "accepted", bool)
        chars = _field(msg, "accepted_chars", int, required=False, default=0)
        self.metrics.feedback.labels(str(accepted).lower()).inc()
        if accepted and chars > 0:
            self.metrics.accepted_chars.inc(chars)


def _run_engine(engine, prefix, suffix, language, doc_key, max_new, cancel, on_text, kind=None):
    """The syntax-aware pipeline when a language is given and completer.pipeline exists, else
    the plain engine."""
    if language:
        try:
            from . import pipeline
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.pipeline":
                raise
        else:
            fn = pipeline.complete_at
            params = inspect.signature(fn).parameters
            kw = {k: v for k, v in (("cancel", cancel), ("on_text", on_text)) if k in params}
            if max_new is not None and "options" in params:
                kw["options"] = pipeline.CompletionOptions(max_new_tokens=max_new)
            return fn(engine, prefix + suffix, len(prefix), language=language, doc_key=doc_key, **kw)
    return engine.complete(prefix, suffix, doc_key=doc_key, max_new=max_new, cancel=cancel, on_text=on_text,
                           node_kind=kind)


def _result_fields(c) -> tuple[str, dict]:
    """(final text, stats) of an engine Completion or a pipeline result (None = nothing to add)."""
    if c is None:
        return "", {"new_tokens": 0, "stop_reason": "gated"}
    stats = dict(c.to_json()) if hasattr(c, "to_json") else {}
    nested = stats.pop("engine", None)  # the pipeline nests the engine's stats: flatten them
    if isinstance(nested, dict):
        stats = {**nested, **stats}
    for k in ("text", "token_ids", "raw_text", "spans"):
        stats.pop(k, None)
    if hasattr(c, "stats") and hasattr(c.stats, "prefill_ms"):
        stats.setdefault("prefill_ms", round(c.stats.prefill_ms, 3))
    return getattr(c, "text", "") or "", stats


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("completer")
    except PackageNotFoundError:
        return "0+unknown"


async def _serve(service: Service) -> int:
    from websockets.asyncio.server import serve

    cfg = service.cfg
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(0))
    # Frames above max_frame_bytes get an error frame; past 4x that the library closes the
    # connection (1009) rather than buffer an unbounded message.
    async with serve(service.handler, cfg.host, cfg.port, process_request=service.process_request,
                     max_size=4 * cfg.max_frame_bytes, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"completer serve: listening on ws://{cfg.host}:{port}/ws (models loading)",
              file=sys.stderr, flush=True)
        threading.Thread(target=service.load, name="completer-load", daemon=True).start()
        loaded = asyncio.get_running_loop().run_in_executor(None, service.loaded.wait)
        await asyncio.wait([stop, loaded], return_when=asyncio.FIRST_COMPLETED)
        if service.load_error:
            print(f"completer: error: {service.load_error}", file=sys.stderr)
            return 2
        await stop
    if service.pool is not None:
        service.pool.shutdown(wait=False, cancel_futures=True)
    return 0


def serve_main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .cli import engine_config
    from .engine.engine import Engine

    problem = None
    if not is_loopback(args.host) and not args.token:
        problem = (f"--host {args.host} is not a loopback address: give --token (or COMPLETER_TOKEN) "
                   "so that other machines cannot use the service unauthenticated")
    elif args.max_frame_bytes < 1024:
        problem = "--max-frame-bytes must be at least 1024"
    if problem:  # printed here: `python -m completer.cli` has its own copy of cli.UsageError
        print(f"completer: error: {problem}", file=sys.stderr)
        return 2
    cfg = ServerConfig(args.host, args.port, args.token or None, tuple(args.allow_origin), args.max_frame_bytes)
    ecfg = engine_config(args)
    extra = {k: getattr(args, k) for k in ("max_batch", "batch_wait_ms") if getattr(args, k, None) is not None}
    ecfg = replace(ecfg, **extra)
    ecfg.validate()
    return asyncio.run(_serve(Service(cfg, lambda: Engine(ecfg))))


def main(argv: list[str] | None = None) -> int:
    """`python -m completer.server`: `completer serve` plus scheduler flags (benchmarks use it)."""
    import os

    from . import cli
    from .engine.models import ModelError

    ap = argparse.ArgumentParser(prog="python -m completer.server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7421)
    ap.add_argument("--token", default=os.environ.get("COMPLETER_TOKEN"))
    ap.add_argument("--allow-origin", action="append", default=[])
    ap.add_argument("--max-frame-bytes", type=int, default=4 * 2**20)
    ap.add_argument("--max-batch", type=int, help="live generations stepping together; 1 = serial")
    ap.add_argument("--batch-wait-ms", type=float, help="how long a step waits for the others")
    cli._engine_args(ap)
    a = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli._quiet_libraries()
    try:
        return serve_main(a)
    except ModelError as e:
        print(f"completer: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
