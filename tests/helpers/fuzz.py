"""Hostile values for the fuzz tests of every transport (stdio framing, --tcp, --ws): one
generator, so that each transport gets the same kinds of junk."""
from __future__ import annotations

import random

URI, PROBE = "file:///fz.py", "file:///probe.py"  # the fuzzed document and the probe's
KEYS = ["textDocument", "position", "uri", "text", "version", "contentChanges", "range", "id", "accepted",
        "languageId", "start", "end", "context", "capabilities", "settings", "line", "character"]


def frame(body: bytes, length: int | None = None) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


def junk(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 2**31, 2**63, -(2**40), 1.5, 1e308, float(rng.randrange(10**6))])
    if kind == 3:
        return "".join(rng.choice("ab\n\r\x00é😀{}\"\\\ud800") for _ in range(rng.randrange(12)))
    if kind == 4:
        return rng.choice([URI, PROBE + "x", "file:///nope", "", "python", "Content-Length: 5"])
    if kind == 5:
        return {"line": rng.choice([0, 1, -1, 10**9]), "character": rng.choice([0, 3, -5, 10**9])}
    if kind == 6:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): junk(rng, depth + 1) for _ in range(rng.randrange(5))}
