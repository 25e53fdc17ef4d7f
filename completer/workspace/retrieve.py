"""Cross-file context at the cursor, under one token budget, in order of value:

1. definitions of the names used around the cursor (cursor.py) resolved through the file's
   imports (resolve.py), rendered as signatures (render.py); a callee or an attribute no import
   explains (`self.client.send(`) falls back to the few files that define that name, nearest
   first (files the cursor file imports, then its directory), when at most FALLBACK_FILES do;
2. windows of the `max_files` most recently edited and viewed files most similar to the lines
   before the cursor (similar.py), none that repeats what the prompt holds or overlaps a
   definition already chosen.

Deterministic: the same index, text and cursor give the same snippets, in rank order (most
valuable first)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from ..prompt import MAX_CHARS_PER_TOKEN
from .cursor import chains_at
from .outline import Outline
from .render import FORMS, render
from .resolve import Resolver, Target
from .similar import Windows, prompt_lines, query_words, ranked, repeats

FALLBACK_FILES = 16   # a name defined in more files than this is too ambiguous to guess from
FALLBACK_TAKE = 2     # files a fallback may draw definitions from
MAX_CANDIDATES = 32   # definitions rendered per retrieval (bounds its time)
MIN_SIMILARITY = 0.2  # below this a window is noise: on httpx at 512 tokens, 0.1 → 0.2 raised precision 0.19 → 0.30, recall unchanged
RENDER_MEMO = 4096


@dataclass(frozen=True)
class Snippet:
    kind: str        # definition | similar
    path: str        # relative to the workspace root
    start_line: int  # 0-based, inclusive, in that file
    end_line: int
    text: str
    tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class View:
    """What a retrieval reads, taken under the index's lock."""
    outlines: Mapping[str, Outline]
    resolver: Resolver
    names: Mapping[str, set[str]]                  # name → files defining it
    recent: list[tuple[str, list[str], Windows]]  # (path, lines, windows) of recent other files, most recent first
    renders: OrderedDict  # (path, outline stamp, index, form) → render(): the same classes come back each keystroke

    def render(self, path: str, i: int, form: str) -> tuple[str, int, int]:
        o = self.outlines[path]
        key = (path, o.stamp, i, form)
        hit = self.renders.get(key)
        if hit is None:
            hit = self.renders[key] = render(o, i, form)
            if len(self.renders) > RENDER_MEMO:
                self.renders.popitem(last=False)
        return hit


def retrieve(view: View, doc_path: str, text: str, offset: int, budget: int,
             count_tokens: Callable[[str], int], max_files: int) -> list[Snippet]:
    o = view.outlines.get(doc_path)
    chains, callees = chains_at(text, offset, o)
    picked: list[Snippet] = []
    used, files = 0, []

    def fits(path: str, text: str) -> bool:
        """Whether `text` may fit at all: the quick test before an exact count."""
        return len(text) <= (budget - used) * MAX_CHARS_PER_TOKEN and (path in files or len(files) < max_files)

    def take(s: Snippet) -> bool:
        nonlocal used
        if used + s.tokens > budget or (s.path not in files and len(files) >= max_files):
            return False
        picked.append(s)
        used += s.tokens
        if s.path not in files:
            files.append(s.path)
        return True

    seen: set[Target] = set()
    for t in _targets(view, o, doc_path, chains, callees)[:MAX_CANDIDATES]:
        path, i = t
        d = view.outlines[path].definitions[i]
        if t in seen or (d.parent >= 0 and (path, d.parent) in seen):
            continue
        seen.add(t)
        for form in FORMS:
            body, s, e = view.render(path, i, form)
            if _overlaps(picked, path, s, e):
                break  # what it shows is chosen already (a method, then its class)
            if fits(path, body) and take(Snippet("definition", path, s, e, body, count_tokens(body + "\n"))):
                break
    _similar(view, text, offset, budget - used, picked, fits, take, count_tokens)
    return picked


def _targets(view: View, o: Outline | None, doc_path: str, chains: list[list[str]],
             callees: list[str]) -> list[Target]:
    out: list[Target] = []
    local = {d.name for d in o.definitions} if o is not None else set()
    near = None
    for chain in chains:
        found = view.resolver.resolve(o, chain) if o is not None else []
        if not found and (".".join(chain) in callees or len(chain) > 1) and chain[-1] not in local:
            if near is None:
                near = _imported_files(view, o)
            found = _fallback(view, doc_path, chain[-1], near)
        out += [t for t in found if t not in out]
        if len(out) >= MAX_CANDIDATES:
            break
    return out


def _imported_files(view: View, o: Outline | None) -> set[str]:
    if o is None:
        return set()
    out = set()
    for imp in o.imports:
        m = view.resolver.module(o, imp.source)
        if m is not None:
            out.update(m.files)
    return out


def _fallback(view: View, doc_path: str, name: str, near: set[str]) -> list[Target]:
    """Definitions of `name` in the files nearest the cursor file, when few files define it."""
    paths = view.names.get(name, ())
    if not paths or len(paths) > FALLBACK_FILES:
        return []
    here = doc_path.split("/")[:-1]
    ranked = sorted((p for p in paths if p != doc_path),
                    key=lambda p: (p not in near, p.split("/")[:-1] != here, -_shared(here, p.split("/")[:-1]), p))
    out = []
    for p in ranked[:FALLBACK_TAKE]:
        o = view.outlines[p]
        out += [(p, i) for i, d in enumerate(o.definitions)
                if d.name == name and d.kind in ("function", "method", "class", "struct", "interface", "trait", "enum")]
    return out


def _similar(view: View, text: str, offset: int, room: int, picked: list[Snippet],
             fits: Callable[[str, str], bool], take: Callable[[Snippet], bool],
             count_tokens: Callable[[str], int]) -> None:
    if room <= 0 or not view.recent:
        return
    q = query_words(text, offset)
    if not q:
        return
    held = prompt_lines(text, offset)
    scored = []
    for rank, (path, lines, wins) in enumerate(view.recent):
        scored += [(-score, rank, w.start_line, path, lines, w) for score, w in ranked(q, wins, MIN_SIMILARITY)]
    scored.sort(key=lambda t: t[:4])
    misses = 0
    for _, _, _, path, lines, w in scored:
        if _overlaps(picked, path, w.start_line, w.end_line):
            continue
        chunk_lines = lines[w.start_line:w.end_line + 1]
        if repeats(chunk_lines, held):
            continue
        chunk = "\n".join(chunk_lines)
        if fits(path, chunk) and take(Snippet("similar", path, w.start_line, w.end_line, chunk, count_tokens(chunk + "\n"))):
            misses = 0
        else:
            misses += 1
            if misses >= 3:  # the budget is spent: windows are all about the same size
                return


def _overlaps(picked: list[Snippet], path: str, start: int, end: int) -> bool:
    return any(s.path == path and s.start_line <= end and start <= s.end_line for s in picked)


def _shared(a: list[str], b: list[str]) -> int:
    """Leading directories two paths share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
