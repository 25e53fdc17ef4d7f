"""Context selection under a token budget: the prefix and suffix windows cut at syntax boundaries,
plus a header of what the prefix window leaves out (imports, sibling signatures, the signatures
of the enclosing definitions).

Order is chosen for the KV cache (the engine's SPM layout is `<fim_suffix> suffix <fim_middle>
prefix`, the prefix ending at the cursor): the header comes first and depends only on the window
start, the window start moves on the prompt builder's grid (completer/prompt.py: lines, and chars
inside one long line) moved to a syntax boundary, so while the user types only the last tokens of
the prompt change."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tree_sitter import Node

from ..config import SyntaxOptions
from ..documents import Snapshot, line_of, line_starts
from ..prompt import MAX_CHARS_PER_TOKEN, cut_inside
from .deadline import NEVER, Deadline
from .lang import captures, spec

IMPORT_REACH = 64 * 1024  # imports are looked for in the file's first and the window's last bytes


@dataclass(frozen=True)
class Span:
    kind: str   # import | sibling | signature | prefix | suffix
    start: int  # char offsets in the document
    end: int
    shown: str | None = None  # the text the prompt holds for it when not the document's (a header item)


@dataclass(frozen=True)
class Context:
    prefix: str
    suffix: str
    spans: tuple[Span, ...]
    tokens: int      # prefix + suffix as the engine will count them
    raw_tokens: int  # what a raw prefix/suffix window of the same budget would use
    skipped: tuple[str, ...] = ()  # checks the deadline left out: "header"

    @property
    def saved(self) -> int:
        return max(self.raw_tokens - self.tokens, 0)


@dataclass(frozen=True)
class _Item:
    kind: str
    node: Node
    text: str
    priority: int  # lower is kept first when the header budget runs out
    order: float   # position in the header


class _LineTokens:
    """Token counts per line, memoised for one selection: a window's count is estimated as the
    sum of its lines (an over-estimate for byte-level BPE, whose pre-tokenizer merges a newline
    with the next line's indentation), so each line is tokenized once."""

    def __init__(self, text: str, starts: list[int], end: int, count_tokens: Callable[[str], int]):
        self.text, self.starts, self.end, self.count = text, starts, end, count_tokens
        self.memo: dict[int, int] = {}

    def line(self, i: int) -> int:
        if i not in self.memo:
            end = self.starts[i + 1] if i + 1 < len(self.starts) else self.end
            self.memo[i] = self.count(self.text[self.starts[i]:end])
        return self.memo[i]


def select_context(snap: Snapshot, offset: int, count_tokens: Callable[[str], int], budget: int,
                   opts: SyntaxOptions = SyntaxOptions(), deadline: Deadline = NEVER) -> Context:
    """Prefix/suffix for a completion at char `offset` whose token count is at most `budget`;
    the header outside the window only while `deadline` has not passed."""
    text = snap.text
    reach = max(budget, 1) * MAX_CHARS_PER_TOKEN
    lo, hi = max(offset - reach, 0), min(offset + reach, len(text))
    # absolute line numbers keep the grid stable; only the text within reach is scanned
    first_line = line_of(text, lo)
    starts = [lo + s for s in line_starts(text[lo:hi])]
    if lo:  # the first partial line is not a line start
        starts = starts[1:]
        first_line += 1
        if not starts or starts[0] > offset:  # the cursor's line began out of reach: its part in reach stands in
            starts, first_line = [lo] + starts, first_line - 1
    cur = max(i for i, s in enumerate(starts) if s <= offset) if starts and starts[0] <= offset else -1

    lt = _LineTokens(text, starts, hi, count_tokens)
    suffix_budget = int(budget * opts.suffix_share)
    s_end = _suffix_end(snap, offset, starts, cur, hi, lt, suffix_budget, opts)
    suffix = text[offset:s_end]
    s_tok = count_tokens(suffix)
    room = budget - s_tok
    head = count_tokens(text[starts[cur]:offset]) if cur >= 0 else 0  # the cursor line so far

    win = lambda r: _window_start(snap, offset, starts, cur, first_line, lt, head, r, opts)
    w_start, header_items, skipped = win(room), [], ()
    if w_start == offset and cur >= 0 and starts[cur] < offset:  # not even the cursor's line fits
        w_start = cut_inside(text, starts[cur], offset, count_tokens, room, tail=True)
    elif w_start > 0 and snap.tree is not None and deadline.expired():
        skipped = ("header",)
    elif w_start > 0 and snap.tree is not None:
        # Reserve the header's share, see what falls outside, then give back what it left over:
        # the window can only grow, so the second header is a subset of the first's candidates.
        cap = int(budget * opts.header_share)
        w_start = win(room - cap)
        header_items, h_tok = _fit(_header_candidates(snap, offset, w_start, s_end, opts), count_tokens, cap)
        w_start = win(room - h_tok)
        header_items, _ = _fit(_header_candidates(snap, offset, w_start, s_end, opts), count_tokens, h_tok)
    prefix = _render(header_items) + text[w_start:offset]
    tokens = count_tokens(prefix) + s_tok
    while tokens > budget and (header_items or w_start < offset):  # the estimate was short
        if header_items:
            header_items = sorted(header_items, key=lambda i: i.priority)[:-1]
        else:
            nl = text.find("\n", w_start, offset)
            w_start = offset if nl < 0 else nl + 1
        prefix = _render(header_items) + text[w_start:offset]
        tokens = count_tokens(prefix) + s_tok
    spans = tuple(Span(i.kind, *_char_range(snap, i.node), i.text + "\n") for i in _ordered(header_items))
    spans += (Span("prefix", w_start, offset), Span("suffix", offset, s_end))
    # the engine's own window: the last `budget` tokens of the prefix and a share for the suffix
    # (4 chars per token is enough text to fill it for code)
    raw_pre = count_tokens(text[max(offset - 4 * budget, 0):offset])
    raw = min(raw_pre + min(count_tokens(text[offset:offset + 4 * budget]), suffix_budget), budget)
    return Context(prefix, suffix, spans, tokens, raw, skipped)


def enclosing_definition(snap: Snapshot, offset: int) -> int | None:
    """Char offset where the innermost definition (function, class, ...) holding `offset` starts;
    None at the top level or without a tree. Typing inside it does not move it."""
    b = snap.byte_at(offset)
    inner = None
    for d in captures(snap, "definitions", b, b + 1).get("definition", []):
        if d.start_byte < b <= d.end_byte and (inner is None or d.start_byte > inner.start_byte):
            inner = d
    return None if inner is None else snap.char_at(inner.start_byte)


def _char_range(snap: Snapshot, node: Node) -> tuple[int, int]:
    return snap.char_at(node.start_byte), snap.char_at(node.end_byte)


# -- windows ---------------------------------------------------------------------------------
def _boundary_lines(snap: Snapshot, starts: list[int], a: int, b: int) -> set[int]:
    """Indices i in [a, b) of lines that begin with a statement directly inside a block."""
    if snap.tree is None:
        return {i for i in range(a, b) if snap.text[starts[i]:starts[i] + 1] not in (" ", "\t")}
    if a >= b:
        return set()
    lo_b = snap.byte_at(starts[a])
    hi_b = snap.byte_at(starts[b - 1]) + 1
    blocks = {n.id for ns in captures(snap, "blocks", lo_b, hi_b).values() for n in ns}
    root = snap.tree.root_node
    out = set()
    for i in range(a, b):
        line = snap.text[starts[i]:starts[i + 1] if i + 1 < len(starts) else len(snap.text)]
        stripped = line.lstrip(" \t")
        if not stripped.strip():
            continue
        bpos = snap.byte_at(starts[i] + len(line) - len(stripped))
        n = root.descendant_for_byte_range(bpos, bpos + 1)
        while n is not None and n.parent is not None and n.parent.start_byte == bpos:
            n = n.parent
        if n is not None and n.start_byte == bpos and n.parent is not None and n.parent.id in blocks:
            out.add(i)
    return out


def _window_start(snap: Snapshot, offset: int, starts: list[int], cur: int, first_line: int,
                  lt: _LineTokens, head: int, room: int, opts: SyntaxOptions) -> int:
    """Char offset where the prefix window starts: the earliest grid line (absolute line numbers
    on a grid of `grid_lines`) within `prefix_lines` whose text up to the cursor fits `room`,
    moved forward to the next syntax boundary."""
    if cur < 0 or room <= 0:
        return offset
    g = max(opts.grid_lines, 1)
    lowest = max(cur - opts.prefix_lines, 0)
    while True:
        line = _first_fitting(lowest, cur, first_line, g, lt, head, room)
        # a window of fewer than 4 grid cells wastes too much of a small budget: refine the grid
        if line is None or cur - line >= 4 * g or g == 1:
            break
        g = max(g // 4, 1)
    if line is None:
        return offset  # not even the cursor line fits
    if line == 0 and first_line == 0:
        return 0
    # the first syntax boundary from there on: a window never opens inside a statement
    bounds = _boundary_lines(snap, starts, line, cur + 1)
    return starts[min(bounds)] if bounds else starts[line]


def _first_fitting(lowest: int, cur: int, first_line: int, g: int, lt: _LineTokens, head: int,
                   room: int) -> int | None:
    """The earliest line on the grid (absolute line numbers, multiples of g) in [lowest, cur]
    whose text up to the cursor fits `room` tokens; the cursor line if no grid line does."""
    if head > room:
        return None
    best, used = cur, head
    for i in range(cur - 1, lowest - 1, -1):
        used += lt.line(i)
        if used > room:
            break
        if (first_line + i) % g == 0:
            best = i
    return best


def _suffix_end(snap: Snapshot, offset: int, starts: list[int], cur: int, hi: int, lt: _LineTokens,
                budget: int, opts: SyntaxOptions) -> int:
    """End of the suffix window: whole lines (at most `suffix_lines` after the cursor line) that
    fit `budget`, ended before a syntax boundary when one lies in the window's second half; the
    part of the cursor's line that fits when even that line does not (it ends past `hi`, the
    reach of the window)."""
    text = snap.text
    if budget <= 0 or cur < 0:
        return offset
    rest_end = starts[cur + 1] if cur + 1 < len(starts) else hi
    used = lt.count(text[offset:rest_end])
    if used > budget or rest_end < len(text) and cur + 1 >= len(starts):
        return cut_inside(text, offset, rest_end, lt.count, budget, tail=False)
    k = cur + 1  # the suffix ends at starts[k] (or the text's end when k == len(starts))
    while k < len(starts) and k - cur <= opts.suffix_lines and used + lt.line(k) <= budget:
        used += lt.line(k)
        k += 1
    if k >= len(starts):
        return hi
    half = cur + 1 + (k - cur - 1) // 2
    bounds = _boundary_lines(snap, starts, half, k)
    return starts[max(bounds)] if bounds else starts[k]


# -- header ----------------------------------------------------------------------------------
def _text(snap: Snapshot, lo: int, hi: int) -> str:
    return snap.source[lo:hi].decode("utf-8", "replace")


def _signature(snap: Snapshot, d: Node, body: Node) -> str:
    src = snap.source
    lead = _text(snap, src.rfind(b"\n", 0, d.start_byte) + 1, d.start_byte)
    indent = lead if not lead.strip() else ""
    head = body.prev_sibling  # the last token of the header (comments before the body are extras)
    while head is not None and head.is_extra:
        head = head.prev_sibling
    sig = _text(snap, d.start_byte, head.end_byte if head is not None else body.start_byte).rstrip()
    if src[body.start_byte:body.start_byte + 1] == b"{":
        sig += " {"
    return indent + sig


def _header_candidates(snap: Snapshot, offset: int, w_start: int, s_end: int,
                       opts: SyntaxOptions) -> list[_Item]:
    b_cur, b_win, b_end = snap.byte_at(offset), snap.byte_at(w_start), snap.byte_at(s_end)
    items: list[_Item] = []
    # the file's top and the last bytes before the window: a query over all of a 1 MB file
    # walks every node of it
    ranges = [(0, min(b_win, IMPORT_REACH))]
    if b_win > IMPORT_REACH:
        ranges.append((max(b_win - IMPORT_REACH, IMPORT_REACH), b_win))
    seen: set[int] = set()
    for lo, hi in ranges:
        for n in captures(snap, "imports", lo, hi).get("import", []):
            if n.end_byte <= b_win and n.id not in seen:
                seen.add(n.id)
                items.append(_Item("import", n, _text(snap, n.start_byte, n.end_byte), 1, -1.0))
    reach = 64 * 1024  # siblings farther away than this are not worth a query over the file
    defs = captures(snap, "definitions", max(b_win - reach, 0), b_end + reach)
    bodies = {d.id: b for d, b in _pair_bodies(defs)}
    by_id = {d.id: d for d, _ in _pair_bodies(defs)}
    enclosing = [d for d in by_id.values() if d.start_byte < b_win and b_cur <= d.end_byte
                 and bodies[d.id].start_byte < b_cur]
    chain = {d.id for d in enclosing}
    for d in enclosing:
        items.append(_Item("signature", d, _signature(snap, d, bodies[d.id]), 0, d.start_byte))
    sp = spec(snap.language)
    near = []
    for d in by_id.values():
        if d.id in chain or not (d.end_byte <= b_win or d.start_byte >= b_end):
            continue
        owner = _owner(d, by_id)
        if owner is not None and owner not in chain:
            continue
        sig = _signature(snap, d, bodies[d.id])
        indent = sig[: len(sig) - len(sig.lstrip())]
        body = sp.elided_body.replace("{indent}", indent)  # not format(): the body text has braces
        # a sibling after the suffix goes right after its owner's signature, so that the innermost
        # enclosing signature still leads straight into the window
        order = d.start_byte if d.end_byte <= b_win else (
            by_id[owner].start_byte + 0.5 if owner is not None else -0.5)
        near.append((min(abs(d.end_byte - b_win), abs(d.start_byte - b_end)), d, sig + body, order))
    near.sort(key=lambda t: t[0])
    for _, d, txt, order in near[: opts.max_siblings]:
        items.append(_Item("sibling", d, txt, 2, order))
    return items


def _pair_bodies(caps: dict[str, list[Node]]) -> list[tuple[Node, Node]]:
    """(definition, body) pairs: each body is the `body` field child of its definition."""
    defs = caps.get("definition", [])
    bodies = {b.id for b in caps.get("body", [])}
    out = []
    for d in defs:
        body = next((c for c in _descendants_to_depth(d, 3) if c.id in bodies), None)
        if body is not None:
            out.append((d, body))
    return out


def _descendants_to_depth(n: Node, depth: int):
    frontier = [n]
    for _ in range(depth):
        frontier = [c for f in frontier for c in f.children]
        yield from frontier


def _owner(d: Node, by_id: dict[int, Node]) -> int | None:
    p = d.parent
    while p is not None:
        if p.id in by_id:
            return p.id
        p = p.parent
    return None


def _fit(items: list[_Item], count_tokens, cap: int) -> tuple[list[_Item], int]:
    """Greedy by priority (signatures, imports, nearest siblings) under `cap` tokens; returns the
    items kept and the tokens they use."""
    kept, used = [], 0
    for it in sorted(items, key=lambda i: i.priority):
        t = count_tokens(it.text + "\n")
        if used + t <= cap:
            kept.append(it)
            used += t
    return kept, used


def _ordered(items: list[_Item]) -> list[_Item]:
    return sorted(items, key=lambda i: (i.order, i.node.start_byte))


def _render(items: list[_Item]) -> str:
    return "".join(i.text + "\n" for i in _ordered(items))
