"""Admission of model work: who may run now, who waits, who is cancelled.

Rules (the engine's callers run in their own threads and block in `acquire`):
- at most one live ticket per document; a new interactive request for a document supersedes
  every older ticket of that document (waiting ones leave at once, a live one stops after its
  current decode step because its cancel check reads `superseded`);
- interactive work goes before warmup; warmup runs only while no interactive work is live or
  waiting, and yields between prefill chunks when some arrives (`should_yield` / `pause`);
  interactive work outside the engine counts too while it `hold`s the scheduler (the language
  server's next-edit follower: beside a warmup's prefill on two cores its p90 was 1.5-2x);
- at most `max_batch` live interactive tickets: they step together through the `StepBatcher`,
  sharing a step budget of `step_tokens` verify tokens (each one's draft length is capped);
- memory: a ticket is admitted only when `admit` can give its document a KV cache within the
  budget next to the caches of the live tickets (evicting idle ones), otherwise it waits; a queue
  longer than `max_queue` and a cache that cannot fit even alone are refused (EngineError
  "overloaded").
`admit` runs under the scheduler's lock, so the caches' bookkeeping has one lock and one order.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..client import EngineError
from .batch import StepBatcher

INTERACTIVE, WARMUP = 0, 1


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8           # live generations stepping together; 1 = serial (batching off)
    batch_wait_ms: float = 2.0   # how long a step waits for the other live generations to join it
    max_queue: int = 64          # waiting tickets beyond this are refused (overloaded)
    step_tokens: int = 32        # verify tokens a batched step aims at: draft caps under load (0 = none)


class Ticket:
    __slots__ = ("doc", "error", "live", "priority", "queue_ms", "resource", "seq", "superseded", "t_enq")

    def __init__(self, doc: str, priority: int, seq: int):
        self.doc, self.priority, self.seq = doc, priority, seq
        self.superseded = threading.Event()
        self.live = False
        self.error: Exception | None = None
        self.t_enq = time.perf_counter()
        self.queue_ms = 0.0
        self.resource = None  # what `admit` gave this ticket (the engine: the document's DocCache)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig = SchedulerConfig(),
                 admit: Callable[[str, set[str]], object] = lambda doc, live: True):
        """`admit(doc, live_docs)` reserves what a ticket needs: a truthy resource, False to make
        it wait, None when it can never be served (refused)."""
        self.cfg, self.admit = cfg, admit
        self.cond = threading.Condition()
        self.waiting: list[Ticket] = []
        self.live: dict[str, Ticket] = {}
        self.batcher = StepBatcher(cfg.max_batch, cfg.batch_wait_ms / 1e3, cfg.step_tokens)
        self._seq = 0
        self._holds = 0  # interactive work outside the engine, running now (see hold)

    # -- state (call with self.cond held) ----------------------------------------------------------
    def _n_live(self, priority: int) -> int:
        return sum(t.priority == priority for t in self.live.values())

    def _interactive_pending(self) -> bool:
        return self._holds > 0 or any(t.priority == INTERACTIVE for t in self.waiting) \
            or self._n_live(INTERACTIVE) > 0

    def _pump(self) -> None:
        """Admit waiting tickets in (priority, arrival) order while the rules allow."""
        for t in sorted(self.waiting, key=lambda t: (t.priority, t.seq)):
            if t.doc in self.live:
                continue
            if t.priority == WARMUP and (self.live or self._interactive_pending()):
                break  # warmup waits for an idle engine
            if t.priority == INTERACTIVE and self._n_live(INTERACTIVE) >= self.cfg.max_batch:
                break
            try:
                got = self.admit(t.doc, set(self.live))
            except Exception as e:  # noqa: BLE001 - delivered to the waiting caller
                got, t.error = None, e
            if got is None and t.error is None:
                if self.live:
                    break  # it may fit once the live tickets are done
                t.error = EngineError(f"document {t.doc!r}: its KV cache cannot fit the budget", "overloaded")
            elif got is False:
                break  # wait for a live ticket to release its cache
            self.waiting.remove(t)
            if t.error is None:
                t.resource = got
                t.live = True
                t.queue_ms = (time.perf_counter() - t.t_enq) * 1e3
                self.live[t.doc] = t
        self.batcher.set_active(len(self.live))
        self.cond.notify_all()

    def _supersede(self, doc: str, below_priority: int) -> None:
        for t in [*self.waiting, *self.live.values()]:
            if t.doc == doc and t.priority >= below_priority and not t.superseded.is_set():
                t.superseded.set()
        self.waiting = [t for t in self.waiting if not t.superseded.is_set()]

    # -- API ---------------------------------------------------------------------------------------
    def acquire(self, doc: str, priority: int = INTERACTIVE) -> Ticket:
        """Block until this document may run; the returned ticket is live unless superseded
        (the caller then returns a cancelled result at once). Raises EngineError "overloaded"
        (the service cannot take it now: queue full, KV budget)."""
        with self.cond:
            self._seq += 1
            t = Ticket(doc, priority, self._seq)
            if priority == WARMUP and any(o.doc == doc and o.priority == INTERACTIVE
                                          for o in [*self.waiting, *self.live.values()]):
                t.superseded.set()  # the request for this document will prefill it anyway
                return t
            self._supersede(doc, priority)
            if len(self.waiting) >= self.cfg.max_queue:
                raise EngineError(f"{len(self.waiting)} requests are already waiting; try again later", "overloaded")
            self.waiting.append(t)
            self._pump()
            while not (t.live or t.error or t.superseded.is_set()):
                self.cond.wait()
            if t.error is not None:
                raise t.error
            return t

    def release(self, t: Ticket) -> None:
        with self.cond:
            self._release_locked(t)
            self._pump()

    def _release_locked(self, t: Ticket) -> None:
        if self.live.get(t.doc) is t:
            del self.live[t.doc]
        t.live = False

    def reconfigure(self, cfg: SchedulerConfig) -> None:
        """New limits from the next admission and step on (the options changed); waiting tickets
        that a larger max_batch lets in are admitted now."""
        with self.cond:
            self.cfg = cfg
            self.batcher.configure(cfg.max_batch, cfg.batch_wait_ms / 1e3, cfg.step_tokens)
            self._pump()

    def kick(self) -> None:
        """Resources were freed outside the scheduler: admit what now fits."""
        with self.cond:
            self._pump()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Interactive work that does not go through the engine runs meanwhile: warmups wait, and
        a running one pauses at its next chunk, until every hold is released (nestable, any thread)."""
        with self.cond:
            self._holds += 1
        try:
            yield
        finally:
            with self.cond:
                self._holds -= 1
                self._pump()

    def wait_quiet(self, timeout: float) -> bool:
        """Until no interactive work (or hold) is waiting or running; False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: not self._interactive_pending(), timeout)

    def should_yield(self) -> bool:
        """For warmup between chunks: is interactive work waiting or running?"""
        with self.cond:
            return self._interactive_pending()

    def pause(self, t: Ticket) -> bool:
        """A warmup gives its turn to interactive work and waits to be admitted again; False when
        it was superseded meanwhile (stop)."""
        with self.cond:
            self._release_locked(t)
            if not t.superseded.is_set():
                self.waiting.append(t)
            self._pump()
            while not (t.live or t.superseded.is_set()):
                self.cond.wait()
            return t.live

    def waiting_for(self, doc: str) -> int:
        with self.cond:
            return sum(t.doc == doc for t in self.waiting)

    def depth(self) -> tuple[int, int]:
        """(waiting, live) tickets."""
        with self.cond:
            return len(self.waiting), len(self.live)
