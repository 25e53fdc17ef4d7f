"""Type-through's records: each document's latest completion, in flight or done, which a request
that typed its beginning follows (the rule itself is completer/typethrough.py's), bounded in
count, characters and age."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict

from .. import typethrough
from ..client import StopReason

RECORDS_MAX = 1024          # documents whose latest completion type-through remembers
RECORDS_CHARS = 32 * 2**20  # characters of their prefixes and suffixes together (a /v1 request may
#                             bring megabytes, and each `user` is a document: 1024 of them were ~4 GiB)
RECORD_TTL_S = 600.0        # older records are dropped: typing through a completion takes seconds


class Record:
    """A document's latest completion, in flight or done: what type-through serves from."""

    def __init__(self, prefix: str, suffix: str):
        self.prefix, self.suffix = prefix, suffix
        self.size, self.t = len(prefix) + len(suffix), time.monotonic()
        self.text = ""       # decoded so far; the final (cut) text once done
        self.done = False
        self.ok = False      # finished on its own (not cancelled)
        self.followers = 0   # requests streaming from it: they keep it alive past its own cancel
        self.epoch = 0       # bumped by every newer request: older followers stop
        self.reason = StopReason.NONE  # why its generation ended (a prefetch: served with it)
        self.extra: tuple = ()  # a prefetch: the chunks of other files it was made with
        self.forgotten = False  # a prefetch: its document was closed (its cache goes when it ends)
        self.cond = threading.Condition()

    def typed(self, prefix: str, suffix: str) -> str | None:
        """The characters typed since this request if they match its completion (the rule of
        completer/typethrough.py; in flight: what is decoded so far covers them), else None."""
        typed = typethrough.typed(self.prefix, self.suffix, prefix, suffix)
        if typed is None:
            return None
        with self.cond:
            if self.done:
                return typed if self.ok and typethrough.rest(self.text, typed) else None
            return typed if self.text.startswith(typed) else None

    def update(self, text: str, done: bool = False, ok: bool = False) -> None:
        with self.cond:
            self.text, self.done, self.ok = text, done, ok
            self.cond.notify_all()


class Records:
    """The documents' latest Records, least recently written first, bounded by RECORDS_MAX,
    RECORDS_CHARS and RECORD_TTL_S (the oldest go first). Guarded by the scheduler's lock."""

    def __init__(self):
        self.by_doc: OrderedDict[str, Record] = OrderedDict()
        self.chars = 0

    def get(self, doc: str) -> Record | None:
        rec = self.by_doc.get(doc)
        if rec is not None and time.monotonic() - rec.t > RECORD_TTL_S:
            self.pop(doc)
            return None
        return rec

    def put(self, doc: str, rec: Record) -> None:
        self.pop(doc)
        self.by_doc[doc] = rec
        self.chars += rec.size
        now = time.monotonic()
        while self.by_doc:
            oldest = next(iter(self.by_doc.values()))
            if len(self.by_doc) <= RECORDS_MAX and self.chars <= RECORDS_CHARS and now - oldest.t <= RECORD_TTL_S:
                break
            self.pop(next(iter(self.by_doc)))

    def pop(self, doc: str) -> Record | None:
        rec = self.by_doc.pop(doc, None)
        if rec is not None:
            self.chars -= rec.size
        return rec

    def clear(self) -> None:
        self.by_doc.clear()
        self.chars = 0

    def __len__(self) -> int:
        return len(self.by_doc)


class StopFlag:
    """What generate() polls between steps: superseded, or the caller's cancel while no
    type-through request is following this generation."""

    def __init__(self, superseded: threading.Event, cancel, record: Record | None):
        self.superseded, self.cancel, self.record = superseded, cancel, record

    def is_set(self) -> bool:
        if self.superseded.is_set():
            return True
        return self.cancel is not None and self.cancel.is_set() and (self.record is None or self.record.followers == 0)
