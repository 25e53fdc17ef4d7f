"""What the language server does behind its handlers: the open documents, the engine (loaded in a
background thread, used from one worker thread), per-document debounce and cancellation, warmups
on syntax triggers, and acceptance statistics. No LSP types here: handlers convert."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import statistics
import threading
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from completer.documents import Documents, PositionError
from completer.pipeline import EngineClient, complete_at, make_engine, warmup_at
from completer.syntax import detect_triggers

from .options import ServerOptions

log = logging.getLogger("completer.lsp")


@dataclass(frozen=True)
class Edit:
    range: tuple[tuple[int, int], tuple[int, int]] | None  # None: the whole text
    text: str


class Service:
    def __init__(self, options: ServerOptions = ServerOptions()):
        self.options = options
        self.docs = Documents()
        self.engine: EngineClient | None = None
        self.engine_state = "not loaded"  # not loaded | loading | ready | failed: <why>
        # One thread runs all model work: the engine serves one generation at a time anyway,
        # and the event loop never blocks on it.
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="completer-engine")
        self.pending: dict[str, threading.Event] = {}  # uri → cancel event of its live request
        self.warm_next: dict[str, tuple] = {}          # uri → latest (snapshot, offset) to warm
        self.counters: Counter[str] = Counter()
        self.gates: Counter[str] = Counter()
        self.latency_ms: deque[float] = deque(maxlen=1000)

    def configure(self, options: ServerOptions, encoding: str = "utf-16") -> None:
        self.options = options
        self.docs = Documents(encoding)

    # -- engine ------------------------------------------------------------------------------
    def load_engine(self) -> str:
        """Blocking: build the engine from the options; returns the new state."""
        self.engine_state = "loading"
        try:
            self.engine = make_engine(**self.options.engine_config())
            warm = getattr(self.engine, "warm_start", None)  # in-process: first-request costs, step costs
            if warm is not None:
                warm()
            self.engine_state = "ready"
        except Exception as e:  # a bad model dir, a missing remote module, out of memory...
            log.exception("engine failed to load")
            self.engine_state = f"failed: {type(e).__name__}: {e}"
        return self.engine_state

    # -- documents ---------------------------------------------------------------------------
    def open(self, uri: str, text: str, language_id: str | None, version: int) -> None:
        self.docs.open(uri, text, language_id, version)

    def close(self, uri: str) -> None:
        self.docs.close(uri)
        ev = self.pending.pop(uri, None)
        if ev is not None:
            ev.set()
        forget = getattr(self.engine, "forget", None)  # in-process engine: free the KV slot
        if forget is not None:
            forget(uri)

    def change(self, uri: str, version: int, edits: list[Edit]) -> None:
        doc = self.docs.get(uri)
        if doc is None:
            log.warning("didChange for a document that is not open: %s", uri)
            return
        for e in edits:
            doc.apply_change(e.range, e.text)
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
            self.worker.submit(self._warm, uri)

    def _warm(self, uri: str) -> None:
        snap, offset = self.warm_next.pop(uri, (None, 0))
        if snap is None or self.engine is None or uri in self.pending:
            return  # a completion for this document is on its way: it prefills itself
        try:
            self.counters["warmup_tokens"] += warmup_at(self.engine, snap, offset, doc_key=uri,
                                                        options=self.options.completion())
            self.counters["warmups"] += 1
        except Exception:
            log.exception("warmup failed")

    def document_info(self, uri: str) -> dict | None:
        doc = self.docs.get(uri)
        if doc is None:
            return None
        return {"uri": uri, "version": doc.version, "length": len(doc.text), "lines": doc.line_count(),
                "sha256": hashlib.sha256(doc.text.encode("utf-8", "surrogatepass")).hexdigest(),
                "language": doc.language, "parsed": doc.tree is not None}

    # -- completion --------------------------------------------------------------------------
    async def complete(self, uri: str, line: int, character: int) -> tuple[str, tuple[int, int]] | None:
        """(text, position) to insert, or None (not open, not ready, gated off, superseded,
        position outside the document)."""
        self.counters["requests"] += 1
        doc = self.docs.get(uri)
        if doc is None or self.engine is None:
            self.counters["not_ready" if doc is not None else "unknown_document"] += 1
            return None
        try:
            offset = doc.offset_at(line, character, strict=True)
        except PositionError:
            self.counters["bad_position"] += 1
            return None
        snap, engine, opts = doc.snapshot(), self.engine, self.options.completion()
        pos = doc.position_at(offset)  # a character past the line end means the line end
        older = self.pending.get(uri)
        if older is not None:
            older.set()  # a newer keystroke: the older generation stops within one decode step
        cancel = self.pending[uri] = threading.Event()
        try:
            await asyncio.sleep(self.options.debounce_ms / 1000)
            if cancel.is_set():
                self.counters["superseded"] += 1
                return None
            result = await asyncio.get_running_loop().run_in_executor(
                self.worker, self._run, engine, snap, offset, uri, opts, cancel)
        except asyncio.CancelledError:  # $/cancelRequest
            cancel.set()
            self.counters["cancelled"] += 1
            raise
        finally:
            if self.pending.get(uri) is cancel:
                del self.pending[uri]
        if result is None or cancel.is_set():
            self.counters["superseded"] += 1
            return None
        self.gates[result.stats["gate_reason"]] += 1
        self.latency_ms.append(result.stats.get("total_ms", 0.0))
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
        log.info("feedback %s accepted=%s chars=%s/%s", uri, accepted, n, len(text))

    def stats(self) -> dict:
        c = self.counters
        judged = c["accepted"] + c["rejected"]
        lat = sorted(self.latency_ms)
        pct = (lambda q: round(lat[min(int(q * len(lat)), len(lat) - 1)], 3)) if lat else (lambda q: None)
        slots = getattr(self.engine, "slots", None)  # in-process engine: documents holding a KV cache
        return {"engine": self.engine_state, "documents": len(self.docs), **dict(c),
                "kv_cached_documents": len(slots) if slots is not None else None,
                "acceptance_rate": round(c["accepted"] / judged, 4) if judged else None,
                "accepted_char_rate": round(c["accepted_chars"] / c["shown_chars"], 4) if c["shown_chars"] else None,
                "gate_reasons": dict(self.gates),
                "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                               "mean": round(statistics.fmean(lat), 3) if lat else None}}

    def shutdown(self) -> None:
        for ev in self.pending.values():
            ev.set()
        self.worker.shutdown(wait=False, cancel_futures=True)
