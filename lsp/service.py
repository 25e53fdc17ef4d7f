"""What the language server does behind its handlers: the open documents, the engine (loaded and
used on one worker thread; requests that arrive while it loads wait for it), per-document debounce
and cancellation, warmups on syntax triggers, engine faults shown once, and statistics. No LSP
types here: handlers convert, and `say(level, text)` is how the service talks to the user."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import statistics
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from completer import errors
from completer.client import EngineClient, EngineError
from completer.config import needs_reload
from completer.documents import Documents, PositionError, parser_count
from completer.pipeline import complete_at, make_engine, warmup_at
from completer.syntax import detect_triggers

from .options import ServerOptions

log = logging.getLogger("completer.lsp")
MAX_DOCUMENT_CHARS = 16 * 2**20  # a larger document is not kept: no completions there, one warning
# Open documents kept: opening one more drops the least recently used (one warning per session).
# Only the most recently used keep a syntax tree (0.5 MB for a 15 KB Python file, 35× its text);
# another one is parsed again when it is edited or completed in.
MAX_OPEN_DOCUMENTS = 2000
MAX_PARSED_DOCUMENTS = 64
Say = Callable[[str, str], None]  # (level: "error" | "warning" | "info", text) → the user
Progress = Callable[[int, str], None]  # (percent, stage); called on the engine thread


@dataclass(frozen=True)
class Edit:
    range: tuple[tuple[int, int], tuple[int, int]] | None  # None: the whole text
    text: str


class Request:
    """A completion in flight: `cancel` stops its generation (the engine thread reads it between
    decode steps); `stopped` wakes it while it waits (debounce, models loading)."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.stopped = asyncio.get_running_loop().create_future()

    def stop(self) -> None:
        self.cancel.set()
        if not self.stopped.done():
            self.stopped.set_result(None)


class Service:
    def __init__(self, options: ServerOptions = ServerOptions(), say: Say = lambda level, text: None):
        self.options, self.say = options, say
        self.docs = self._documents()
        self.engine: EngineClient | None = None
        self.engine_state = "not loaded"  # not loaded | loading | ready | failed: <why>
        self.engine_options: dict | None = None  # the option values the latest load started with
        self.built: EngineClient | None = None   # what the last load built (engine thread only)
        # One thread runs all engine work: the engine serves one generation at a time anyway,
        # and the event loop never blocks on it.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="completer-engine")
        self.loads_in_flight = 0
        self.loaded: asyncio.Future | None = None  # resolved when the loads in flight have ended
        self.pending: dict[str, Request] = {}      # uri → its live completion request
        self.warm_next: dict[str, tuple] = {}      # uri → latest (snapshot, offset) to warm
        self.faults: set[str] = set()              # EngineError codes shown since the last success
        self.engine_error: str | None = None       # the last EngineError, until a call succeeds
        self.counters: Counter[str] = Counter()
        self.gates: Counter[str] = Counter()
        self.latency_ms: deque[float] = deque(maxlen=1000)

    def configure(self, options: ServerOptions, encoding: str = "utf-16") -> None:
        """A new session (initialize): its options, no documents."""
        self.close_all()
        self.options = options
        self.docs = self._documents(encoding)

    def update(self, options: ServerOptions) -> list[str]:
        """New options within the session; returns the changed ones that need new models (none
        before the first load: it reads the options when it starts)."""
        changed = needs_reload(self.engine_options, options.values()) if self.engine_options is not None else []
        self.options = options
        return changed

    # -- engine ------------------------------------------------------------------------------
    def needs_load(self) -> bool:
        """At a session's start: no engine yet, the last load failed, or it used other options."""
        return (self.engine_options is None or self.engine_state.startswith("failed")
                or bool(needs_reload(self.engine_options, self.options.values())))

    def _load_future(self) -> asyncio.Future:
        if self.loaded is None or self.loaded.done():
            self.loaded = asyncio.get_running_loop().create_future()
        return self.loaded

    async def load(self, progress: Progress = lambda percent, stage: None) -> str:
        """Build the engine from the current options on the engine thread (after any load or
        generation queued there); requests wait meanwhile. Returns the new state."""
        done = self._load_future()
        self.counters["loads"] += 1
        self.loads_in_flight += 1
        self.engine, self.engine_state = None, "loading"
        self.engine_options = self.options.values()
        try:
            self.engine, state, fault = await asyncio.get_running_loop().run_in_executor(
                self.worker, self._load, self.options.engine_config(), progress)
        finally:
            self.loads_in_flight -= 1
        if fault is not None:
            self._fault(fault)
        self.engine_state = state if self.loads_in_flight == 0 else "loading"
        if self.loads_in_flight == 0 and not done.done():
            done.set_result(None)
        return state

    def _load(self, config: dict, progress: Progress) -> tuple[EngineClient | None, str, EngineError | None]:
        """(engine, state, fault). A remote engine that is down, busy or still loading its model
        is kept: the fault is shown once, requests answer empty meanwhile, and the client
        connects again on the next request (no restart when the server comes up)."""
        old, self.built = self.built, None
        if old is not None:
            old.close()
        engine = fault = None
        try:  # an in-process engine reports its stages (weights read and quantized, warm start)
            engine = make_engine(**config, progress=progress)
            engine.warm_start()  # first-request costs and step costs, or the remote's hello
        except Exception as e:  # a bad model dir, refused credentials, out of memory...
            known = isinstance(e, EngineError)
            if known and engine is not None and errors.transient(e.code):
                fault = e  # the server is down, busy or loading: kept, it may come up
            else:
                why = f"{e.code}: {e.message}" if known else f"{type(e).__name__}: {e}"
                log.error("engine failed to load: %s", why, exc_info=not known)
                if engine is not None:
                    engine.close()
                return None, f"failed: {why}", None
        self.built = engine
        return engine, "ready", fault

    def _fault(self, e: BaseException) -> None:
        """An engine call failed: an EngineError is shown once per code until a call succeeds;
        anything else is a bug, logged with its traceback."""
        if not isinstance(e, EngineError):
            self.counters["engine_exceptions"] += 1
            log.error("engine call failed", exc_info=e)
            return
        self.counters["engine_errors"] += 1
        self.engine_error = f"{e.code}: {e.message}"
        if e.code not in self.faults:
            self.faults.add(e.code)
            retry = f" (retry in {e.retry_after:g} s)" if e.retry_after else ""
            self.say("warning" if errors.transient(e.code) else "error", f"engine {e.code}: {e.message}{retry}")

    def _served(self) -> None:
        if self.faults:
            self.faults.clear()
            self.engine_error = None
            self.say("info", "engine back")

    def _background(self, fn: Callable, *args) -> None:
        """An engine call whose result nobody waits for, queued on the engine thread."""
        fut = asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() is None or self._fault(f.exception()))

    # -- documents ---------------------------------------------------------------------------
    def _documents(self, encoding: str = "utf-16") -> Documents:
        self.evicted_said = False
        return Documents(encoding, MAX_OPEN_DOCUMENTS, self._evicted, MAX_PARSED_DOCUMENTS)

    def _evicted(self, uri: str) -> None:
        self.counters["evicted"] += 1
        self.close(uri)
        if not self.evicted_said:
            self.evicted_said = True
            self.say("warning", f"more than {MAX_OPEN_DOCUMENTS} documents are open: the least recently used "
                                f"are no longer kept (first {uri}); no completions there until reopened")

    def open(self, uri: str, text: str, language_id: str | None, version: int) -> None:
        if len(text) > MAX_DOCUMENT_CHARS:
            self._too_large(uri, len(text))
            return
        self.docs.open(uri, text, language_id, version)

    def _too_large(self, uri: str, chars: int) -> None:
        self.counters["too_large"] += 1
        self.close(uri)
        self.say("warning", f"{uri} has {chars} characters, more than {MAX_DOCUMENT_CHARS}: "
                            "no completions in it until it is reopened smaller")

    def close(self, uri: str) -> None:
        self.docs.close(uri)
        self.warm_next.pop(uri, None)  # its snapshot (text and tree) goes with it
        req = self.pending.pop(uri, None)
        if req is not None:
            req.stop()
        if self.engine is not None:
            self._background(self.engine.forget, uri)  # free the document's KV cache

    def close_all(self) -> None:
        for uri in {*self.pending, *self.docs.uris()}:
            self.close(uri)

    def change(self, uri: str, version: int, edits: list[Edit]) -> None:
        doc = self.docs.get(uri)
        if doc is None:
            self.counters["unknown_document"] += 1
            log.warning("didChange for a document that is not open: %s", uri)
            return
        for e in edits:
            if len(e.text) > MAX_DOCUMENT_CHARS:
                self._too_large(uri, len(e.text))
                return
            doc.apply_change(e.range, e.text)
            if len(doc.text) > MAX_DOCUMENT_CHARS:
                self._too_large(uri, len(doc.text))
                return
        doc.version = version
        last = edits[-1] if edits else None
        if last is not None and last.range is not None and self.options.warmup and self.engine is not None:
            start = doc.offset_at(*last.range[0])
            snap = doc.snapshot()
            if detect_triggers(snap, start + len(last.text), last.text):
                self._schedule_warmup(uri, snap, start + len(last.text))

    def _schedule_warmup(self, uri: str, snap, offset: int) -> None:
        queued = uri in self.warm_next
        self.warm_next[uri] = (snap, offset)  # a later trigger replaces one not yet started
        if not queued:
            fut = asyncio.get_running_loop().run_in_executor(self.worker, self._warm, uri)
            fut.add_done_callback(self._warmed)

    def _warm(self, uri: str) -> int | None:
        snap, offset = self.warm_next.pop(uri, (None, 0))
        engine = self.engine
        if snap is None or engine is None or uri in self.pending:
            return None  # a completion for this document is on its way: it prefills itself
        return warmup_at(engine, snap, offset, doc_key=uri, options=self.options.completion())

    def _warmed(self, fut: asyncio.Future) -> None:
        if fut.cancelled():
            return
        if fut.exception() is not None:
            self._fault(fut.exception())
        elif fut.result() is not None:
            self.counters["warmups"] += 1
            self.counters["warmup_tokens"] += fut.result()
            self._served()

    def document_info(self, uri: str) -> dict | None:
        doc = self.docs.get(uri)
        if doc is None:
            return None
        return {"uri": uri, "version": doc.version, "length": len(doc.text), "lines": doc.line_count(),
                "sha256": hashlib.sha256(doc.text.encode("utf-8", "surrogatepass")).hexdigest(),
                "language": doc.language, "parsed": doc.tree is not None}

    # -- completion --------------------------------------------------------------------------
    async def complete(self, uri: str, line: int, character: int) -> tuple[str, tuple[int, int]] | None:
        """(text, position) to insert, or None (disabled, not open, engine not ready in time or
        failed, gated off, superseded, position outside the document, engine fault)."""
        self.counters["requests"] += 1
        if not self.options.enable:
            self.counters["disabled"] += 1
            return None
        doc = self.docs.get(uri)
        if doc is None:
            self.counters["unknown_document"] += 1
            return None
        try:
            offset = doc.offset_at(line, character, strict=True)
        except PositionError:
            self.counters["bad_position"] += 1
            return None
        snap = doc.snapshot()
        pos = doc.position_at(offset)  # a character past the line end means the line end
        older = self.pending.get(uri)
        if older is not None:
            older.stop()  # a newer keystroke: the older generation stops within one decode step
        req = self.pending[uri] = Request()
        try:
            if self.engine_state == "loading" or self.engine_state == "not loaded":
                self.counters["waited_for_engine"] += 1
                await asyncio.wait((req.stopped, self._load_future()), timeout=self.options.ready_wait_ms / 1000,
                                   return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait((req.stopped,), timeout=self.options.debounce_ms / 1000)
            engine, opts = self.engine, self.options.completion()
            if req.cancel.is_set():
                self.counters["superseded"] += 1
                return None
            if engine is None:
                self.counters["engine_failed" if self.engine_state.startswith("failed") else "not_ready"] += 1
                return None
            result = await asyncio.get_running_loop().run_in_executor(
                self.worker, self._run, engine, snap, offset, uri, opts, req.cancel)
        except asyncio.CancelledError:  # $/cancelRequest
            req.stop()
            self.counters["cancelled"] += 1
            raise
        except Exception as e:  # noqa: BLE001 - EngineError: shown once; anything else: logged; both answer empty
            self._fault(e)
            return None
        finally:
            if self.pending.get(uri) is req:
                del self.pending[uri]
        if result is None or req.cancel.is_set():
            self.counters["superseded"] += 1
            return None
        self._served()
        self.gates[result.extra.get("gate_reason")] += 1
        self.latency_ms.append(result.total_ms)
        if not result.text:
            self.counters["empty"] += 1
            return None
        self.counters["shown"] += 1
        self.counters["shown_chars"] += len(result.text)
        return result.text, pos

    @staticmethod
    def _run(engine, snap, offset, uri, opts, cancel):
        if cancel.is_set():  # superseded while queued behind another generation
            return None
        return complete_at(engine, snap, offset, doc_key=uri, options=opts, cancel=cancel)

    # -- feedback and stats -------------------------------------------------------------------
    def feedback(self, uri: str, text: str, accepted: bool, accepted_chars: int | None) -> None:
        self.counters["accepted" if accepted else "rejected"] += 1
        n = len(text) if accepted and accepted_chars is None else (accepted_chars or 0)
        self.counters["accepted_chars"] += max(0, min(n, len(text)))
        if self.engine is not None:
            self._background(self.engine.feedback, uri, text, accepted, accepted_chars)

    async def stats(self) -> dict:
        engine_stats: dict = {}
        if self.engine is not None:  # on the engine thread: after the forgets queued before
            try:
                engine_stats = await asyncio.get_running_loop().run_in_executor(self.worker, self.engine.stats)
            except Exception as e:  # noqa: BLE001 - a stats call never fails the request
                self._fault(e)
        c = self.counters
        judged = c["accepted"] + c["rejected"]
        lat = sorted(self.latency_ms)
        pct = (lambda q: round(lat[min(int(q * len(lat)), len(lat) - 1)], 3)) if lat else (lambda q: None)
        return {"engine": self.engine_state, "engine_error": self.engine_error, "documents": len(self.docs),
                "parsed_documents": self.docs.parsed(), "parsers": parser_count(),
                **dict(c), "loads": c["loads"],
                # shim: the in-process Engine.stats() names it "slots" (llama.cpp's client: kv_cached_documents)
                "kv_cached_documents": engine_stats.get("kv_cached_documents", engine_stats.get("slots")),
                "acceptance_rate": round(c["accepted"] / judged, 4) if judged else None,
                "accepted_char_rate": round(c["accepted_chars"] / c["shown_chars"], 4) if c["shown_chars"] else None,
                "gate_reasons": dict(self.gates), "engine_stats": engine_stats,
                "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                               "mean": round(statistics.fmean(lat), 3) if lat else None}}

    def shutdown(self) -> None:
        for req in self.pending.values():
            req.stop()
        self.worker.shutdown(wait=False, cancel_futures=True)
