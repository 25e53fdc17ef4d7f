"""Snippets of recently edited and viewed files that look like the code at the cursor: windows of
WINDOW lines (every STRIDE lines) ranked by the Jaccard similarity of their identifier sets to
the lines before the cursor, as Copilot and Continue rank open tabs. A window whose lines the
prompt already holds is dropped: a near-duplicate in the prompt makes the model repeat it."""
from __future__ import annotations

import re
from dataclasses import dataclass

WINDOW = 16
STRIDE = 8
QUERY_LINES = 20
_WORD = re.compile(r"[A-Za-z_$][\w$]*")
DUP_SHARE = 0.5   # a window half of whose lines are in the prompt repeats it
MIN_DUP_LINE = 8  # lines shorter than this ("}", "return x") say nothing about duplication


@dataclass(frozen=True)
class Window:
    start_line: int
    end_line: int   # inclusive
    words: frozenset[str]
    mask: int       # its words as bits of its file's vocabulary (see Windows)


@dataclass(frozen=True)
class Windows:
    """A file's windows, with their words as bit masks over the file's vocabulary: scoring a
    window is then an AND and a popcount, not a set intersection (5 µs → 0.2 µs a window)."""
    vocab: dict[str, int]
    items: tuple[Window, ...]

    def mask(self, words: frozenset[str]) -> int:
        m = 0
        for w in words:
            b = self.vocab.get(w)
            if b is not None:
                m |= 1 << b
        return m


def windows(lines: list[str]) -> Windows:
    vocab: dict[str, int] = {}
    out = []
    for s in range(0, max(len(lines) - WINDOW, 0) + 1, STRIDE):
        words = frozenset(_WORD.findall("\n".join(lines[s:s + WINDOW])))
        if words:
            m = 0
            for w in words:
                m |= 1 << vocab.setdefault(w, len(vocab))
            out.append(Window(s, min(s + WINDOW, len(lines)) - 1, words, m))
    return Windows(vocab, tuple(out))


def query_words(text: str, offset: int) -> frozenset[str]:
    start = offset
    for _ in range(QUERY_LINES):
        start = text.rfind("\n", 0, start)
        if start < 0:
            break
    return frozenset(_WORD.findall(text[max(start, 0):offset]))


def prompt_lines(text: str, offset: int, reach: int = 4000) -> frozenset[str]:
    """Stripped lines of the cursor file near the cursor: what its own windows put in the prompt."""
    return frozenset(s for s in (ln.strip() for ln in text[max(offset - reach, 0):offset + reach // 4].split("\n"))
                     if len(s) >= MIN_DUP_LINE)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter) if a or b else 0.0


def repeats(lines: list[str], held: frozenset[str]) -> bool:
    body = [s for s in (ln.strip() for ln in lines) if len(s) >= MIN_DUP_LINE]
    return bool(body) and sum(s in held for s in body) >= DUP_SHARE * len(body)


def ranked(q: frozenset[str], wins: Windows, least: float) -> list[tuple[float, Window]]:
    """(Jaccard similarity, window) of the windows at least `least` similar to `q`."""
    qm, nq = wins.mask(q), len(q)
    out = []
    for w in wins.items:
        inter = (qm & w.mask).bit_count()
        if inter:
            score = inter / (nq + len(w.words) - inter)
            if score >= least:
                out.append((score, w))
    return out
