"""Memory freed inside the process given back to the OS. glibc's malloc keeps a large block it
freed for reuse, and raises its mmap threshold after freeing a mapped one, so the copies a 10 MB
message leaves behind (its bytes, the parsed JSON, the document it replaces) stay resident as
free heap: a server's RSS then swings by 40 MB from one large document to the next without
growing. `give_back()` hands the free pages back (`malloc_trim`); elsewhere (macOS, musl,
Windows) it does nothing."""
from __future__ import annotations

import asyncio
import ctypes
import sys
from functools import cache

LARGE = 2**20  # bytes of a message after which what it freed is given back
# seconds after a large message: its handler and the next read have let go of its copies by the
# first; the later ones catch what the work it started frees (a 10 MB document's parse, a completion
# over it), which on a slow or busy machine outlives the first (the transport fuzz read RSS 11 % up in a test run)
AFTER_S = (0.5, 3.0, 10.0)


@cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # a libc without it (musl)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def give_back() -> bool:
    """Return free heap pages to the OS; False where the C library cannot."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


_pending: list[asyncio.TimerHandle] = []  # the last large message's trims not run yet, soonest first


def pending() -> int:
    """Trims scheduled and not run yet (the language server's stats report it: what a reading of
    its memory taken now may still hold)."""
    return len(_pending)


def _scheduled() -> None:
    _pending.pop(0)  # timers run in the order of AFTER_S (ascending): this one is the soonest
    give_back()


def give_back_soon() -> None:
    """`give_back()` once a large message's copies are gone: at each of AFTER_S from now on the
    running event loop, for the last large message only (a burst gives back after its last); at
    once where no loop runs."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        give_back()
        return
    while _pending:
        _pending.pop().cancel()
    _pending.extend(loop.call_later(s, _scheduled) for s in AFTER_S)
