"""What the language server does behind its handlers: the open documents, the engine (loaded,
reconfigured and used for completions on one worker thread; requests that arrive while it loads
wait for it), per-document debounce and cancellation, warmups on syntax triggers (on a thread of
their own, so that a completion never queues behind one: the engine's scheduler makes a warmup
give way between chunks), the workspace index (completer.workspace), engine faults shown once,
and statistics. No LSP types here: handlers convert, and `say(level, text)` is how the service
talks to the user."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import statistics
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pygls.uris import to_fs_path

from completer import config, doctor, errors, memory
from completer.client import Chunk, EngineClient, EngineError, accepted_count
from completer.config import needs_reload
from completer.documents import Document, Documents, PositionError, offset_at, parser_count
from completer.edits import EditHistory, change_from_lsp
from completer.edits.diff import lsp_edits, lsp_range
from completer.edits.follow import Answer, Follower, digest
from completer.edits.predict import from_events, predict
from completer.pipeline import complete_at, make_engine, prompt_for, warmup_at
from completer.syntax import detect_triggers
from completer.workspace import WorkspaceIndex
from completer.workspace.files import read_source

from .options import SCOPES, ServerOptions

log = logging.getLogger("completer.lsp")
MAX_DOCUMENT_CHARS = 16 * 2**20  # a larger document is not kept: no completions there, one warning
# Open documents kept: opening one more drops the least recently used (one warning per session).
# Only the most recently used keep a syntax tree (0.5 MB for a 15 KB Python file, 35× its text);
# another one is parsed again when it is edited or completed in.
MAX_OPEN_DOCUMENTS = 2000
MAX_PARSED_DOCUMENTS = 64
MAX_LOCATIONS = 500  # places a next edit's `locations` lists (a rename used 2 000 times: the first 500)
# A warmup starts this long after its trigger, once no interactive work runs (at most WARMUP_QUIET_WAIT_S
# waited): a request the editor sends right with the edit is read first, and a warmup building its
# prompt beside it (the GIL) slowed a rename's next edit: p90 104-110 ms without the settle time,
# 72-94 with it (bench/next_edit.py --latency, AMD EPYC); a completion waiting out its debounce
# lets the warmup run.
WARMUP_SETTLE_S = 0.01
WARMUP_QUIET_WAIT_S = 5.0
Say = Callable[[str, str], None]  # (level: "error" | "warning" | "info", text) → the user
Progress = Callable[[int, str], None]  # (percent, stage); called on the engine thread
IndexProgress = Callable[[str, int, str], None]  # (begin | report | end, files, message); the index's thread


@dataclass(frozen=True)
class Edit:
    range: tuple[tuple[int, int], tuple[int, int]] | None  # None: the whole text
    text: str


class Request:
    """A completion in flight: `cancel` stops its generation (the engine thread reads it between
    decode steps); `stopped` wakes it while it waits (debounce, models loading: `waiting`)."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.stopped = asyncio.get_running_loop().create_future()
        self.waiting = True

    def stop(self) -> None:
        self.cancel.set()
        if not self.stopped.done():
            self.stopped.set_result(None)


def _nothing() -> None:
    pass


def _edit_key(uri: str) -> str:
    """The engine's cache key for a document's next edits: beside its completions' (the two
    prompts differ; one key would make each evict the other's cache)."""
    return uri + "#next-edit"


def _pct(values, q: float) -> float | None:
    lat = sorted(values)
    return round(lat[min(int(q * len(lat)), len(lat) - 1)], 3) if lat else None


def _path(uri: str) -> str | None:
    """The file a `file:` URI names; None for other schemes (untitled:, a remote file system)."""
    return to_fs_path(uri) if uri.startswith("file:") else None


class Service:
    def __init__(self, options: ServerOptions = ServerOptions(), say: Say = lambda level, text: None):
        self.options, self.say = options, say
        self.docs = self._documents()
        self.edits = EditHistory()  # the workspace's edit events (next-edit suggestions, issue 24)
        self.engine: EngineClient | None = None
        self.engine_state = "not loaded"  # not loaded | loading | ready | failed: <why>
        self.engine_options: dict | None = None  # the option values the latest load started with
        self.built: EngineClient | None = None   # what the last load built (engine thread only)
        # One thread runs loads, completions and the calls that follow them in order (forget,
        # reconfigure, stats); warmups run on another, where the scheduler pauses them for a
        # completion between chunks (on the same thread a completion would wait for all of one).
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="completer-engine")
        # next edits the models will not be asked for (Engine.edits_untrained): the syntax tree's
        # rename alone, never queued behind a warmup or a completion on the worker
        self.side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="completer-edits")
        self.warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="completer-warmup")
        self.loads_in_flight = 0
        self.loaded: asyncio.Future | None = None  # resolved when the loads in flight have ended
        self.pending: dict[str, Request] = {}      # uri → its live completion request
        self.warm_next: dict[str, tuple] = {}      # uri → latest (snapshot, offset) to warm
        self.warming: set[str] = set()             # uris with a warmup queued or running
        self.faults: set[str] = set()              # EngineError codes shown since the last success
        self.engine_error: str | None = None       # the last EngineError, until a call succeeds
        self.counters: Counter[str] = Counter()
        self.gates: Counter[str] = Counter()
        self.latency_ms: deque[float] = deque(maxlen=1000)
        self.shown_confidence: deque[float] = deque(maxlen=1000)  # confidence of recent shown completions
        self.pending_edits: dict[str, Request] = {}  # uri → its live next-edit request
        self.next_edit_ids: OrderedDict[str, bool] = OrderedDict()  # suggestions shown, awaiting feedback
        self.next_edit_ms: deque[float] = deque(maxlen=1000)
        self.follower = Follower()  # a change at a definition followed through the workspace (issue 39)
        self.root: str | None = None               # the session's workspace folder
        self.index: WorkspaceIndex | None = None   # its index, from `initialized` on
        self.index_progress: IndexProgress | None = None

    def configure(self, options: ServerOptions, encoding: str = "utf-16", root: str | None = None) -> None:
        """A new session (initialize): its options and workspace root, no documents. An engine
        kept from an earlier session takes the new session's live options."""
        self.close_all()
        self.close_index()
        self.root = root
        self.docs = self._documents(encoding)
        self.edits = EditHistory()
        self.update(options)

    def update(self, options: ServerOptions) -> list[str]:
        """New options: the service reads its own (lsp, syntax) at each request; the engine's that
        it applies live go to its `reconfigure`, queued on the engine thread (from the next request
        on); changed workspace options rebuild the index. Returns the changed options that need
        new models instead (none before the first load: it reads the options when it starts)."""
        old, self.options = self.options, options
        if old.workspace() != options.workspace() and self.index is not None:
            self.counters["index_rebuilds"] += 1
            self.start_index(self.index_progress)
        if self.engine_options is None:
            return []
        new = options.values()
        reload = needs_reload(self.engine_options, new)
        live = {n: v for n, v in new.items() if self.engine_options.get(n, config.OPTIONS[n].default) != v}
        if live and not reload:
            self.engine_options = {**self.engine_options, **live}
            self.counters["reconfigures"] += 1
            self._background(self._reconfigure, live)
        return reload

    def _reconfigure(self, values: dict) -> None:
        if self.built is not None:  # the engine the loads queued before this built
            self.built.reconfigure(**values)

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
        self.engine_options, cfg = self.options.values(), self.options.engine_config()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.warmer, _nothing)  # a warmup under way ends before its engine is closed
            self.engine, state, fault = await loop.run_in_executor(self.worker, self._load, cfg, progress)
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
        self._index_text(uri, text)

    def _too_large(self, uri: str, chars: int) -> None:
        self.counters["too_large"] += 1
        self.close(uri)
        self.say("warning", f"{uri} has {chars} characters, more than {MAX_DOCUMENT_CHARS}: "
                            "no completions in it until it is reopened smaller")

    def close(self, uri: str) -> None:
        if self.docs.get(uri) is not None and self.index is not None and (path := _path(uri)):
            self.index.closed(path)  # the disk's text is the file's again
        self.docs.close(uri)
        self.warm_next.pop(uri, None)  # its snapshot (text and tree) goes with it
        for pending in (self.pending, self.pending_edits):
            req = pending.pop(uri, None)
            if req is not None:
                req.stop()
        if self.engine is not None:
            self._background(self.engine.forget, uri)  # free the document's KV caches
            self._background(self.engine.forget, _edit_key(uri))

    def close_all(self) -> None:
        for uri in {*self.pending, *self.pending_edits, *self.docs.uris()}:
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
            self.edits.record(uri, doc.text, change_from_lsp(doc, e.range, e.text))
            doc.apply_change(e.range, e.text)
            if len(doc.text) > MAX_DOCUMENT_CHARS:
                self._too_large(uri, len(doc.text))
                return
        doc.version = version
        edit = self.pending_edits.get(uri)
        if edit is not None:  # a next edit computed on the older text would be dropped: stop paying for it
            edit.stop()
        self._index_text(uri, doc.text)
        last = edits[-1] if edits else None
        if last is not None and last.range is not None and self.options.warmup and self.engine is not None:
            start = doc.offset_at(*last.range[0])
            snap = doc.snapshot()
            if detect_triggers(snap, start + len(last.text), last.text):
                self._schedule_warmup(uri, snap, start + len(last.text))

    def _schedule_warmup(self, uri: str, snap, offset: int) -> None:
        self.warm_next[uri] = (snap, offset)  # a later trigger replaces one not yet started
        if uri not in self.warming:  # this loop's record, not warm_next: the warmup thread pops that
            self.warming.add(uri)
            fut = asyncio.get_running_loop().run_in_executor(self.warmer, self._warm, uri)
            fut.add_done_callback(lambda f: self._warmed(uri, f))

    def _warm(self, uri: str) -> int | None:
        time.sleep(WARMUP_SETTLE_S)
        quiet = getattr(self.engine, "wait_quiet", None)
        if quiet is not None:  # the requests the edit brought go first (next_edit holds warmups)
            quiet(WARMUP_QUIET_WAIT_S)
        snap, offset = self.warm_next.pop(uri, (None, 0))
        engine, request = self.engine, self.pending.get(uri)
        if snap is None or engine is None or (request is not None and not request.waiting):
            return None  # a completion for this document is being computed: it prefills itself
        # (one still in its debounce: the warmup uses the wait, and the completion takes over its cache)
        # exactly the prompt the completion at this offset will read: same call, options and index
        return warmup_at(engine, snap, offset, doc_key=uri, options=self.options.completion(),
                         **self._workspace_for(uri))

    def _warmed(self, uri: str, fut: asyncio.Future) -> None:
        self.warming.discard(uri)
        if fut.cancelled():
            return
        if fut.exception() is not None:
            self._fault(fut.exception())
        elif fut.result() is not None:
            self.counters["warmups"] += 1
            self.counters["warmup_tokens"] += fut.result()
            self._served()
        if uri in self.warm_next:  # a trigger came while this one ran
            self._schedule_warmup(uri, *self.warm_next[uri])

    def document_info(self, uri: str) -> dict | None:
        doc = self.docs.get(uri)
        if doc is None:
            return None
        return {"uri": uri, "version": doc.version, "length": len(doc.text), "lines": doc.line_count(),
                "sha256": hashlib.sha256(doc.text.encode("utf-8", "surrogatepass")).hexdigest(),
                "language": doc.language, "parsed": doc.tree is not None}

    # -- workspace index -----------------------------------------------------------------------
    def start_index(self, progress: IndexProgress | None = None) -> None:
        """Index the session's workspace folder in the background (`initialized`; again when the
        workspace options change); completions use what is indexed so far. `progress(kind,
        files, message)` is called on the index's thread. No folder: no index."""
        self.close_index()
        self.index_progress = progress
        if self.root is None:
            return
        try:
            self.index = WorkspaceIndex(self.root, self.options.workspace(), on_progress=progress)
        except OSError as e:  # a root that is gone or unreadable: completions go on without it
            self.say("warning", f"workspace {self.root} cannot be indexed ({e}): no cross-file context")
            if progress is not None:  # the walk that was announced ends here
                progress("end", 0, "not indexed")
            return
        for uri in self.docs.uris():  # documents opened before: their live text
            self._index_text(uri, self.docs.get(uri).text)
        self.index.start()

    def close_index(self) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None

    def _index_text(self, uri: str, text: str) -> None:
        if self.index is not None and (path := _path(uri)):
            self.index.update(path, text, recent=True)

    def file_changed(self, uri: str, deleted: bool = False) -> None:
        """A file changed on disk (didSave, a watched file): re-read, or dropped when deleted
        (from the index, and its edits from the next-edit history: a prompt never shows them)."""
        if deleted:
            self.edits.forget(uri)
        if self.index is None or not (path := _path(uri)):
            return
        self.counters["files_changed"] += 1
        if deleted:
            self.index.remove(path)
        else:
            self.index.update(path)

    def _workspace_for(self, uri: str) -> dict:
        """The pipeline's arguments for cross-file context in this document (none without an index)."""
        if self.index is None or not (path := _path(uri)):
            return {}
        return {"workspace": self.index, "path": path}

    async def context(self, uri: str, line: int, character: int) -> list[dict] | None:
        """What a completion at this position would put in the prompt (completer/context): the
        pipeline's list of snippets; None when the document is not open or the position is
        outside it, [] when gated off or without an engine."""
        doc = self.docs.get(uri)
        if doc is None:
            return None
        try:
            offset = doc.offset_at(line, character, strict=True)
        except PositionError:
            return None
        engine = self.engine
        if engine is None:
            return []
        snap, opts, workspace = doc.snapshot(), self.options.completion(), self._workspace_for(uri)
        _, ctx = await asyncio.get_running_loop().run_in_executor(
            self.worker, lambda: prompt_for(engine, snap, offset, opts, **workspace))
        return [] if ctx is None else [c.as_dict() for c in ctx.context]

    # -- completion --------------------------------------------------------------------------
    async def complete(self, uri: str, line: int, character: int) -> tuple[list[str], tuple[int, int]] | None:
        """(texts, position) to insert: the completion, then its alternatives to cycle (the option
        `alternatives`: engine/alternatives.py); or None (disabled, not open, engine not ready in time
        or failed, gated off, superseded, position outside the document, engine fault)."""
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
            req.waiting = False
            engine, opts = self.engine, self.options.completion()
            if req.cancel.is_set():
                self.counters["superseded"] += 1
                return None
            if engine is None:
                self.counters["engine_failed" if self.engine_state.startswith("failed") else "not_ready"] += 1
                return None
            result = await asyncio.get_running_loop().run_in_executor(
                self.worker, self._run, engine, snap, offset, uri, opts, req.cancel, self._workspace_for(uri))
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
        self.gates[result.syntax.gate_reason if result.syntax is not None else None] += 1
        self.latency_ms.append(result.total_ms)
        if not result.text:
            self.counters["empty"] += 1
            dropped = result.syntax.dropped if result.syntax is not None else None
            if dropped is not None:  # generated, then dropped by a syntax rule: tokens spent for nothing
                self.counters[f"dropped_{dropped.rule}"] += 1
                self.counters["wasted_tokens"] += result.new_tokens
            return None
        self.counters["shown"] += 1
        self.counters["shown_chars"] += len(result.text)
        if result.confidence is not None:
            self.shown_confidence.append(result.confidence)
        return [result.text, *(a.text for a in result.alternatives)], pos

    @staticmethod
    def _run(engine, snap, offset, uri, opts, cancel, workspace):
        if cancel.is_set():  # superseded while queued behind another generation
            return None
        return complete_at(engine, snap, offset, doc_key=uri, options=opts, cancel=cancel, **workspace)

    # -- next edits (completer/edits) ------------------------------------------------------------
    async def next_edit(self, uri: str, line: int, character: int) -> dict:
        """completer/nextEdit: `{id, version, edits: [{range, newText}], reason?}` for the document
        as it is now (`version`), edits in its position encoding; [] with the reason when there is
        none (disabled, not open, no engine, dropped by a rule of completer/edits/predict, stale:
        the document changed while it was computed). A change at a definition is followed first
        (completer/edits/follow.py, no engine needed): then `jump: {uri, range, version?, edits}`
        names the next place past the region, and `left` how many remain. A newer request for
        the document stops an older one. PositionError for a position outside the document.
        The local engine's warmups wait meanwhile (the follower is interactive work the engine
        does not see; with a warmup's prefill beside it, its p90 was ~1.5x)."""
        hold = getattr(self.engine, "hold_warmup", None)
        with hold() if hold is not None else contextlib.nullcontext():
            return await self._next_edit(uri, line, character)

    async def _next_edit(self, uri: str, line: int, character: int) -> dict:
        t0 = time.perf_counter()
        self.counters["next_edit_requests"] += 1
        doc = self.docs.get(uri)
        if doc is None:
            return self._no_edit(None, "unknown_document")
        offset = doc.offset_at(line, character, strict=True)
        if not self.options.next_edit:
            return self._no_edit(doc.version, "disabled")
        older = self.pending_edits.get(uri)
        if older is not None:
            older.stop()
        req = self.pending_edits[uri] = Request()
        snap, version = doc.snapshot(), doc.version
        line = doc.position_at(offset)[0]
        col = offset - doc.lines[line]
        history = from_events(self.edits.recent(), self._edit_path)
        opts = self.options
        try:
            follow = opts.next_edit_rename  # a change at a definition followed past the region, no model needed:
            if follow and opts.next_edit_rename_first:  # before the model, as the region's rename is
                followed = await asyncio.get_running_loop().run_in_executor(
                    self.side, self._follow, req, uri, snap, line, col, history, self._reader())
                if followed is not None:
                    return self._followed(uri, version, snap.text, followed, t0)
            if self.engine_state in ("loading", "not loaded"):
                await asyncio.wait((req.stopped, self._load_future()), timeout=opts.ready_wait_ms / 1000,
                                   return_when=asyncio.FIRST_COMPLETED)
            engine = self.engine
            if req.cancel.is_set():
                return self._no_edit(version, "cancelled")
            if engine is None:
                return self._no_edit(version, "no_engine")

            untrained = getattr(engine, "edits_untrained", None)  # remote engines: always asked
            side = untrained is not None and untrained(opts.next_edit_format)

            def run():
                if req.cancel.is_set():
                    return None
                return predict(engine, snap.text, line, col, history, path=self._edit_path(uri),
                               language=snap.language, fmt=opts.next_edit_format, doc_key=_edit_key(uri),
                               cancel=req.cancel, above=opts.next_edit_lines_above, below=opts.next_edit_lines_below,
                               max_lines=opts.next_edit_max_lines, tree=snap.tree,
                               chunks=() if side else self._edit_chunks(engine, uri, snap, line),
                               rename=opts.next_edit_rename, rename_first=opts.next_edit_rename_first,
                               jumps=False)  # the follower (above) answered for those

            got = await asyncio.get_running_loop().run_in_executor(self.side if side else self.worker, run)
            if follow and not opts.next_edit_rename_first and got is not None and got.dropped is not None:
                followed = await asyncio.get_running_loop().run_in_executor(  # where the model gave nothing
                    self.side, self._follow, req, uri, snap, line, col, history, self._reader())
                if followed is not None:
                    return self._followed(uri, version, snap.text, followed, t0)
        except asyncio.CancelledError:  # $/cancelRequest
            req.stop()
            raise
        except Exception as e:  # noqa: BLE001 - EngineError: shown once; anything else: logged; both answer empty
            self._fault(e)
            return self._no_edit(version, "engine_error")
        finally:
            if self.pending_edits.get(uri) is req:
                del self.pending_edits[uri]
        if got is None:
            return self._no_edit(version, "cancelled")
        self._served()
        self.next_edit_ms.append((time.perf_counter() - t0) * 1e3)
        now = self.docs.get(uri)
        if now is None or now.version != version or now.text != snap.text:
            return self._no_edit(version, "stale")  # never edits computed on an older text
        if got.dropped is not None:
            return self._no_edit(version, got.dropped)
        self.counters["next_edit_shown"] += 1
        sid = uuid.uuid4().hex
        self.next_edit_ids[sid] = True
        while len(self.next_edit_ids) > 256:
            self.next_edit_ids.popitem(last=False)
        if got.source != "model":
            self.counters[f"next_edit_by_{got.source}"] += 1
        return {"id": sid, "version": version, "edits": lsp_edits(now, got.edits), "source": got.source}

    def _follow(self, req: Request, uri: str, snap, line: int, col: int, history, read) -> Answer | None:
        """completer/edits/follow.py's answer (on the side thread); `read`: _reader's, taken on the loop."""
        if req.cancel.is_set():
            return None
        opts, index = self.options, self.index
        return self.follower.answer(
            snap.text, self._edit_path(uri), line, col, history, language=snap.language, read=read,
            importers=index.importers if index is not None else None,
            providers=index.providers if index is not None else None,
            statements=index.statements if index is not None else None, above=opts.next_edit_lines_above,
            below=opts.next_edit_lines_below, max_lines=opts.next_edit_max_lines, tree=snap.tree)

    def _reader(self):
        """path (as _edit_path names it) → the text now: an open document's (read on the loop's
        thread: its texts are taken here), else the file's on disk (within the workspace)."""
        opened = {self._edit_path(u): self.docs.get(u).text for u in self.docs.uris()}
        root, limit = self.root, MAX_DOCUMENT_CHARS

        def read(path: str) -> str | None:
            if path in opened:
                return opened[path]
            return read_source(Path(root), path, limit) if root is not None else None
        return read

    def _target(self, path: str) -> tuple[str, Document | None]:
        """The URI of a workspace path and its open document, if it is open."""
        for u in self.docs.uris():
            if self._edit_path(u) == path:
                return u, self.docs.get(u)
        return (Path(self.root, path).as_uri() if self.root is not None else path), None

    def _followed(self, uri: str, version: int, text: str, got: Answer, t0: float) -> dict:
        """The answer as `{id, version, edits, source, jump?, locations?, left}`: `jump` the next
        place, `locations` every place left (an editor's edit of them all at once). Each target is
        read again and compared with the text its place was computed on: a place whose file changed
        since is left out (never an edit for an older text; `stale` when that leaves nothing)."""
        self._served()
        self.next_edit_ms.append((time.perf_counter() - t0) * 1e3)
        now = self.docs.get(uri)
        if now is None or now.version != version or now.text != text:
            return self._no_edit(version, "stale")
        read, docs = self._reader(), {}

        def location(place) -> dict | None:
            if place.path not in docs:
                target, doc = self._target(place.path)
                current = doc.text if doc is not None else read(place.path)
                docs[place.path] = None if current is None else (
                    target, doc or Document(target, current, None, encoding=now.encoding), doc is not None,
                    digest(current))
            known = docs[place.path]
            if known is None or known[3] != place.digest:
                return None
            target, doc, opened, _ = known
            out = {"uri": target, "range": lsp_range(doc, place), "edits": lsp_edits(doc, place.edits)}
            if opened:
                out["version"] = doc.version
            return out

        jump = location(got.jump) if got.jump is not None else None
        if jump is None and not got.edits:
            return self._no_edit(version, "stale")
        rest = [loc for loc in map(location, got.later[:MAX_LOCATIONS]) if loc is not None]
        self.counters["next_edit_shown"] += 1
        self.counters[f"next_edit_by_{got.source}"] += 1
        sid = uuid.uuid4().hex
        self.next_edit_ids[sid] = jump is not None
        while len(self.next_edit_ids) > 256:
            self.next_edit_ids.popitem(last=False)
        out = {"id": sid, "version": version, "edits": lsp_edits(now, got.edits), "source": got.source,
               "left": got.left}
        if jump is not None:
            out["jump"] = jump
            out["locations"] = rest
        return out

    def _edit_chunks(self, engine: EngineClient, uri: str, snap, line: int) -> list[Chunk]:
        """Other files' snippets for a next-edit format that shows them (Sweep's; `auto` may
        pick it), within the cross-file share of the prompt budget; none without an index. They
        are retrieved as for a completion at the end of the lines a region may reach (the names
        used there are the ones the rewrite may need)."""
        ws = self._workspace_for(uri)
        if not ws or self.options.next_edit_format not in ("auto", "sweep"):
            return []
        budget = int(engine.prompt_budget() * self.options.cross_file_share)
        reach = offset_at(snap.text, line + self.options.next_edit_lines_below + 1, 0)
        return [Chunk(s.path, s.text) for s in ws["workspace"].retrieve(ws["path"], snap.text, reach,
                                                                         budget)]

    def _no_edit(self, version: int | None, reason: str) -> dict:
        self.counters[f"next_edit_dropped_{reason}"] += 1
        return {"id": uuid.uuid4().hex, "version": version, "edits": [], "reason": reason}

    def _edit_path(self, uri: str) -> str:
        """A document's name in next-edit prompts: its path in the workspace (as the models saw
        paths in training), else its file name (an absolute path says where the user keeps
        their files, not what the code is), else the URI."""
        path = _path(uri)
        if path is None:
            return uri
        if self.root is not None:
            with contextlib.suppress(ValueError):
                return Path(path).relative_to(self.root).as_posix()
        return Path(path).name

    def next_edit_feedback(self, sid: str, accepted: bool) -> bool:
        """The user accepted or dismissed the suggestion `sid` (each counted once); False for an
        id this session did not show."""
        jump = self.next_edit_ids.pop(sid, None)
        if jump is None:
            return False
        if jump and not accepted:  # a jump dismissed: the change is no longer followed
            self.follower.drop()
        self.counters["next_edit_accepted" if accepted else "next_edit_rejected"] += 1
        return True

    # -- feedback and stats -------------------------------------------------------------------
    def feedback(self, uri: str, text: str, accepted: bool, accepted_chars: int | None) -> None:
        self.counters["accepted" if accepted else "rejected"] += 1
        self.counters["accepted_chars"] += accepted_count(text, accepted, accepted_chars)
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
        pct = lambda q: _pct(lat, q)
        return {"engine": self.engine_state, "engine_error": self.engine_error, "documents": len(self.docs),
                "parsed_documents": self.docs.parsed(), "parsers": parser_count(), "edit_events": len(self.edits),
                **dict(c), "loads": c["loads"],
                # shim: the in-process Engine.stats() names it "slots" (llama.cpp's client: kv_cached_documents)
                "kv_cached_documents": engine_stats.get("kv_cached_documents"),
                "acceptance_rate": round(c["accepted"] / judged, 4) if judged else None,
                "accepted_char_rate": round(c["accepted_chars"] / c["shown_chars"], 4) if c["shown_chars"] else None,
                "gate_reasons": dict(self.gates), "engine_stats": engine_stats,
                "memory_give_backs_pending": memory.pending(),  # completer/memory.py's trims still to run
                # what each request reads now (secrets left out); the engine's own in engine_stats.config
                "options": {n: v for n, v in self.options.values().items() if not config.OPTIONS[n].meta["secret"]},
                "workspace": self.index.stats() if self.index is not None else None,
                # the engine's score of what was shown (completer/confidence.py), recent completions
                "confidence": {"p10": _pct(self.shown_confidence, 0.1),
                               "p50": _pct(self.shown_confidence, 0.5)},
                "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                               "mean": round(statistics.fmean(lat), 3) if lat else None},
                "next_edit_shown": c["next_edit_shown"], "next_edit_accepted": c["next_edit_accepted"],
                "next_edit_rejected": c["next_edit_rejected"],
                "next_edit_latency_ms": {"p50": _pct(self.next_edit_ms, 0.5), "p90": _pct(self.next_edit_ms, 0.9)}}

    # -- the doctor (completer/doctor.py) ------------------------------------------------------------
    async def doctor(self, client: str | None, warnings: list[str]) -> dict:
        """completer/doctor: the doctor's checks on this session's setup as it is (its options,
        engine once a load under way ends, and index; nothing is loaded again), on the engine thread,
        and the editor's facts: `client` (its name and version), the position encoding it
        negotiated, the open documents. The JSON of `completer doctor --json`."""
        if self.engine_state == "loading":  # as a completion does: the engine it would use
            await asyncio.wait((self._load_future(),), timeout=self.options.ready_wait_ms / 1000)
        r = self.options.resolved or config.resolve([], SCOPES)
        subject = doctor.Subject(r, Path(self.root) if self.root else None, list(warnings), live=True,
                                 engine=self.engine, engine_state=self.engine_state, engine_error=self.engine_error,
                                 index=self.index, editor={"client": client, "position_encoding": self.docs.encoding,
                                                           "documents": len(self.docs)})
        report = await asyncio.get_running_loop().run_in_executor(self.worker, doctor.run, subject)
        return report.to_json()

    def shutdown(self) -> None:
        for req in self.pending.values():
            req.stop()
        self.worker.shutdown(wait=False, cancel_futures=True)
        self.side.shutdown(wait=False, cancel_futures=True)
        self.warmer.shutdown(wait=False, cancel_futures=True)
        self.close_index()
