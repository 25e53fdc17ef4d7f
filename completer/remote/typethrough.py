"""`TypeThrough`: client-side type-through and the next completion before Tab for the remote
engines that do not do them themselves (llama-server, OpenAI-compatible servers; our `completer
serve` does both in its engine):

- type-through: the rule of completer/typethrough.py applied to the last completion of each
  document, whose rest is returned without a request;
- prefetch (the `prefetch` option): once a completion is shown, the completion after it — as if
  the user accepted it — is asked of the server while this client has no request of its own in
  flight, so that accepting and asking again is answered without a request (or by following the
  one already sent). Any other request cancels it (the stream is closed: the server stops), so it
  never delays one; a request for another state of the document drops it."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .. import typethrough
from ..client import Chunk, Completion, EngineClient, StopReason, StopText
from ..edits.formats import EditPrompt
from .transport import live_options

log = logging.getLogger(__name__)
MAX_DOCS = 1024  # type-through remembers the last completion of this many documents
IDLE_S = 2.0     # the prefetch worker ends after this long without a job (the next one starts it)


class _Ahead:
    """One document's prefetch: the completion at (prefix, suffix, extra), once `done`."""

    def __init__(self, prefix: str, suffix: str, extra: tuple[Chunk, ...], max_new: int | None):
        self.prefix, self.suffix, self.extra, self.max_new = prefix, suffix, extra, max_new
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.result: Completion | None = None


class TypeThrough:
    """An EngineClient around `inner` that serves typed-through completions itself."""

    def __init__(self, inner: EngineClient):
        self.inner = inner
        self.enabled = True  # the type_through option
        self.prefetch = False  # the prefetch option (the schema's default, on, comes with the options)
        self.last: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # doc → (prefix, suffix, text)
        self._lock = threading.Condition()
        self.served = 0
        self.ahead: OrderedDict[str, _Ahead] = OrderedDict()  # doc → its prefetch (queued, running or done)
        self._queue: OrderedDict[str, _Ahead] = OrderedDict()  # prefetches not started, oldest first
        self._busy = 0  # this client's own requests in flight: a prefetch starts only at 0
        self._worker: threading.Thread | None = None
        self._running: _Ahead | None = None  # the prefetch the worker is asking for now
        self.counters = {"prefetches": 0, "prefetch_served": 0, "prefetch_cancelled": 0}

    def reconfigure(self, **values: Any) -> None:
        """type_through and prefetch turn these on or off from the next request on; the rest goes
        to the client."""
        live = live_options(values, ("type_through", "prefetch"))
        with self._lock:
            if "type_through" in live:
                self.enabled = live["type_through"]
                self.last.clear()
            if "prefetch" in live:
                self.prefetch = live["prefetch"]
                if not self.prefetch:
                    for doc in list(self.ahead):
                        self._drop(doc)
        self.inner.reconfigure(**values)

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None,
                 node_kind: str | None = None,
                 extra: Sequence[Chunk] = (), n: int | None = None) -> Completion:
        t0 = time.perf_counter()
        with self._lock:
            old = self.last.get(doc_key)
        if old is not None:
            rest = _typed_rest(old, prefix, suffix)
            if rest:
                with self._lock:
                    self.last[doc_key] = (prefix, suffix, rest)
                    self.served += 1
                if on_text is not None:
                    on_text(rest)
                ms = (time.perf_counter() - t0) * 1e3
                return Completion(rest, ttft_ms=ms, total_ms=ms, stop_reason=StopReason.TYPE_THROUGH,
                                  type_through=True)
        ahead = self._take(doc_key, prefix, suffix, tuple(extra))
        if ahead is not None:
            c = self._follow(ahead, stop_text, cancel, t0)
            if c is not None:
                if on_text is not None and c.text:
                    on_text(c.text)
                self._shown(doc_key, prefix, suffix, tuple(extra), max_new, c)
                return c
        with self._lock:
            self._busy += 1
            for other in [d for d, a in self.ahead.items() if not a.done.is_set()]:
                self._drop(other)  # never delays a request: a running prefetch is stopped
        try:
            c = self.inner.complete(prefix, suffix, doc_key=doc_key, max_new=max_new, stop_text=stop_text,
                                    cancel=cancel, on_text=on_text, node_kind=node_kind,
                                    extra=extra, n=n)
        finally:
            with self._lock:
                self._busy -= 1
                self._lock.notify_all()
        self._shown(doc_key, prefix, suffix, tuple(extra), max_new, c)
        return c

    # -- the next completion before Tab (prefetch) --------------------------------------------------
    def _shown(self, doc_key: str, prefix: str, suffix: str, extra: tuple[Chunk, ...], max_new: int | None,
               c: Completion) -> None:
        """`c` answers (prefix, suffix): type-through serves from it, and its continuation is
        prefetched."""
        with self._lock:
            if self.enabled and c.text and c.stop_reason != StopReason.CANCELLED:
                self.last[doc_key] = (prefix, suffix, c.text)
                self.last.move_to_end(doc_key)
                while len(self.last) > MAX_DOCS:
                    self.last.popitem(last=False)
            else:
                self.last.pop(doc_key, None)
            if not (self.prefetch and c.text.strip()) or c.stop_reason == StopReason.CANCELLED:
                return
            self._drop(doc_key)
            self.ahead[doc_key] = self._queue[doc_key] = _Ahead(prefix + c.text, suffix, extra, max_new)
            while len(self.ahead) > MAX_DOCS:
                self._drop(next(iter(self.ahead)))
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="completer-remote-prefetch", daemon=True)
                self._worker.start()
            self._lock.notify_all()

    def _run(self) -> None:
        """The prefetch worker: one job at a time, oldest first, only while this client has no
        request of its own in flight; ends after IDLE_S without a job."""
        while True:
            with self._lock:
                if not self._queue or self._busy:
                    self._lock.wait(IDLE_S)
                if not self._queue:
                    self._worker = None
                    return
                if self._busy:
                    continue
                doc, job = self._queue.popitem(last=False)
                self._running = job
            try:
                c = self.inner.complete(job.prefix, job.suffix, doc_key=doc, max_new=job.max_new,
                                        cancel=job.cancel, extra=job.extra)
                job.result = c if c.stop_reason not in (StopReason.CANCELLED, StopReason.SUPERSEDED) else None
                with self._lock:
                    self.counters["prefetches"] += 1
            except Exception:  # a prefetch is optional: the request that needs it asks itself
                log.debug("prefetch failed", exc_info=True)
                job.result = None
            finally:
                job.done.set()
                with self._lock:
                    self._running = None
                    self._lock.notify_all()

    def settle(self, timeout: float) -> bool:
        """Until no prefetch is queued or being asked for (a cancelled one included: it ends at
        the server's next piece); False on timeout. For shutdown and tests."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._queue and self._running is None, timeout)

    def _take(self, doc_key: str, prefix: str, suffix: str, extra: tuple[Chunk, ...]) -> _Ahead | None:
        """The document's prefetch if it is for exactly this request (taken: served once), else
        None (and any other is dropped: the user left that state)."""
        with self._lock:
            ahead = self.ahead.get(doc_key)
            if ahead is None:
                return None
            if (ahead.prefix, ahead.suffix, ahead.extra) == (prefix, suffix, extra):
                self.ahead.pop(doc_key)
                if self._queue.pop(doc_key, None) is not None:  # not started: asked now, as a request
                    return None
                return ahead
            self._drop(doc_key)
            return None

    def _follow(self, ahead: _Ahead, stop_text: StopText | None, cancel: threading.Event | None,
                t0: float) -> Completion | None:
        """The prefetched completion, waited for if still running, cut by this request's stop rule;
        None when it failed, was cancelled or showed nothing (the request then asks the server)."""
        while not ahead.done.wait(0.05):
            if cancel is not None and cancel.is_set():
                return Completion("", stop_reason=StopReason.CANCELLED)
        c = ahead.result
        if c is None or not c.text:
            return None
        text, why = c.text, c.stop_reason
        cut = stop_text(text) if stop_text is not None else None
        if cut is not None:
            text, why = text[:cut], StopReason.STOP
        ms = (time.perf_counter() - t0) * 1e3
        with self._lock:
            self.counters["prefetch_served"] += 1
        return Completion(text, ttft_ms=ms, total_ms=ms, stop_reason=why, prompt_tokens=c.prompt_tokens,
                          confidence=c.confidence, unsure_text=c.unsure_text, prefetched=True)

    def _drop(self, doc_key: str) -> None:
        """Forget the document's prefetch, stopping it if it runs (under the lock)."""
        ahead = self.ahead.pop(doc_key, None)
        self._queue.pop(doc_key, None)
        if ahead is not None and not ahead.done.is_set():
            ahead.cancel.set()
            self.counters["prefetch_cancelled"] += 1

    def forget(self, doc_key: str) -> None:
        with self._lock:
            self.last.pop(doc_key, None)
            self._drop(doc_key)
        self.inner.forget(doc_key)

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        """Left to a prefetch of the document on its way there (the accepted text, or the user
        typing through it: the server's prompt cache then holds it); any other drops it."""
        with self._lock:
            ahead = self.ahead.get(doc_key)
            if ahead is not None:
                if ahead.suffix == suffix and ahead.prefix.startswith(prefix) and ahead.extra == tuple(extra):
                    return 0
                self._drop(doc_key)
        return self.inner.warmup(prefix, suffix, doc_key=doc_key, extra=extra)

    def rewrite(self, request: EditPrompt, **kw: Any) -> Completion:
        """Next edits are not typed through: the inner client's."""
        return self.inner.rewrite(request, **kw)

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        self.inner.feedback(doc_key, text, accepted, accepted_chars)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def prompt_budget(self, max_new: int | None = None) -> int:
        return self.inner.prompt_budget(max_new)

    def warm_start(self) -> float:
        return self.inner.warm_start()

    def stats(self) -> dict:
        with self._lock:
            return {**self.inner.stats(), "type_through": self.served, **self.counters}

    def close(self) -> None:
        with self._lock:
            for doc in list(self.ahead):
                self._drop(doc)
            self._lock.notify_all()
        self.inner.close()


def _typed_rest(old: tuple[str, str, str], prefix: str, suffix: str) -> str:
    """What remains of the old completion (prefix, suffix, text) after the characters typed
    since, or "" when this request is not the old one plus typing into it."""
    old_prefix, old_suffix, text = old
    typed = typethrough.typed(old_prefix, old_suffix, prefix, suffix)
    return "" if typed is None else typethrough.rest(text, typed)
