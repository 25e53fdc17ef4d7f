"""The time a request may spend on the syntax layer's optional checks (the header of definitions
outside the window, the re-parse of candidates): one `Deadline` travels with the request, each
optional check looks at it before it starts, and the result names the checks it skipped. The
engine's own time does not count (`Deadline.later`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    at: float = math.inf  # time.perf_counter() after which optional checks are skipped

    @classmethod
    def within(cls, ms: float | None) -> Deadline:
        return cls() if ms is None else cls(time.perf_counter() + ms / 1e3)

    def expired(self) -> bool:
        return time.perf_counter() >= self.at

    def later(self, seconds: float) -> Deadline:
        """The same budget, `seconds` later (time spent waiting on something else)."""
        return Deadline(self.at + seconds)


NEVER = Deadline()
