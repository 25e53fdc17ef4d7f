"""The service's threads: a pool of completion workers sized to the cores, the queue in front of
it, one warmup thread, and one thread beside them for work that needs no engine.

Each thread that runs model work keeps its own allocator arena, and memory a busy thread grew to
stays: with a pool of `max_queue + max_batch + 4` threads `completer serve` went from 430 to 1 336
MB under 32 editors and stayed there (bench/serve_memory.py). So the pool has `pool_size()`
threads and a request waits for one on the event loop (a future, no thread): first come, first
served, at most `max_queue` waiting (more are refused as overloaded), and a request that a newer
one for the same document finds still waiting gives way to it (it would be superseded the moment
it started). A running request for that document is left to the engine, which supersedes it or
lets the newer one type through its text, unless the newer one has to wait for a worker: then
the running one is told it is superseded (its caller cancels it), since its answer is obsolete
and it holds the worker (on one core, the only one) the newer request waits for.

Warmups are hints: one thread runs them one at a time, and a warmup that arrives while another
waits replaces it (the newest context is the one worth prefilling).

Work one client sends that needs no model (a next edit's diff of two versions of a file) runs on
the thread `aside`, in order, never on a worker: two next_edit frames of 28 KB once held both
workers of a 2-core machine for 35 s while another connection's completion waited.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .protocol import Refused


def pool_size(max_batch: int) -> int:
    """Completion threads: one per core, and never more than can generate at once (`max_batch`:
    a thread beyond it would only wait inside the engine's scheduler)."""
    return max(1, min(max_batch, len(os.sched_getaffinity(0))))


class Workers:
    def __init__(self, size: int, max_queue: int):
        self.size, self.max_queue = size, max_queue
        self.pool = ThreadPoolExecutor(size, thread_name_prefix="completer-work")
        self.busy = 0                                        # workers taken (event-loop state)
        self.waiting: list[tuple[str, asyncio.Future]] = []  # (document, future of the grant), in order
        self.running: dict[str, list[Callable[[], None]]] = {}  # document → its running requests' `superseded`
        self._warm = ThreadPoolExecutor(1, thread_name_prefix="completer-warmup")
        self._warm_lock = threading.Lock()
        self._warm_next: Callable[[], None] | None = None    # the warmup waiting for the thread
        self._warm_queued = False                            # a drain task is queued or running
        self._aside = ThreadPoolExecutor(1, thread_name_prefix="completer-aside")

    # -- completions (call on the event loop) ------------------------------------------------
    async def run(self, doc: str, fn: Callable[[], object],
                  superseded: Callable[[], None] | None = None) -> asyncio.Future | None:
        """Start `fn` in a worker once one is free → its future (the worker is freed when it
        ends), or None when a newer request for `doc` took this one's place while it waited.
        `superseded()` is called (on the event loop) if, while `fn` runs, a newer request for
        `doc` has to wait for a worker. Raises Refused("overloaded") when `max_queue` requests
        wait already."""
        if self.busy < self.size and not self.waiting:
            self.busy += 1
        else:
            for tell in list(self.running.get(doc, ())):
                tell()
            if not await self._wait(doc):
                return None
        mine = self.running.setdefault(doc, [])
        if superseded is not None:
            mine.append(superseded)

        def done(_) -> None:
            if superseded is not None:
                mine.remove(superseded)
            if not mine and self.running.get(doc) is mine:
                del self.running[doc]
            self._free()

        try:
            fut = asyncio.get_running_loop().run_in_executor(self.pool, fn)
        except BaseException:
            done(None)
            raise
        fut.add_done_callback(done)
        return fut

    async def _wait(self, doc: str) -> bool:
        for i, (d, older) in enumerate(self.waiting):
            if d == doc:  # it has not started: it gives way now rather than be superseded later
                del self.waiting[i]
                older.set_result(False)
                break
        if len(self.waiting) >= self.max_queue:
            raise Refused("overloaded", f"{len(self.waiting)} requests are waiting for one of {self.size} "
                                        "workers; try again later")
        granted = asyncio.get_running_loop().create_future()
        entry = (doc, granted)
        self.waiting.append(entry)
        try:
            return await granted
        except BaseException:  # the client went away while it waited
            if entry in self.waiting:
                self.waiting.remove(entry)
            elif granted.done() and not granted.cancelled() and granted.result():
                self._free()  # granted a worker it will not use
            raise

    def _free(self) -> None:
        """A worker is free: the oldest waiting request gets it."""
        while self.waiting:
            _, granted = self.waiting.pop(0)
            if not granted.done():
                granted.set_result(True)
                return
        self.busy -= 1

    # -- work without the engine (call on the event loop) -----------------------------------
    async def aside(self, fn: Callable[[], object]) -> object:
        """`fn()` on the thread beside the pool, after what was sent there before. Raises
        Refused("not_ready") once shut down."""
        try:
            fut = asyncio.get_running_loop().run_in_executor(self._aside, fn)
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            raise Refused("not_ready", "the server is shutting down") from None
        return await fut

    # -- warmups (any thread) ----------------------------------------------------------------
    def warm(self, fn: Callable[[], None]) -> bool:
        """Run `fn` on the warmup thread after the one running; False when it replaced a warmup
        that was still waiting (that one is dropped)."""
        with self._warm_lock:
            replaced = self._warm_next is not None
            self._warm_next = fn
            if not self._warm_queued:
                self._warm_queued = True
                self._warm.submit(self._drain)
        return not replaced

    def _drain(self) -> None:
        while True:
            with self._warm_lock:
                fn, self._warm_next = self._warm_next, None
                if fn is None:
                    self._warm_queued = False
                    return
            fn()

    def shutdown(self) -> None:
        """No new work; waiting requests are refused, running ones finish (their callers cancel them)."""
        for _, granted in self.waiting:
            if not granted.done():
                granted.set_exception(Refused("not_ready", "the server is shutting down"))
        self.waiting.clear()
        with self._warm_lock:
            self._warm_next = None
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._warm.shutdown(wait=False, cancel_futures=True)
        self._aside.shutdown(wait=False, cancel_futures=True)
