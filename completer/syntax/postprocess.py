"""Post-processing of a raw completion: match the document's line endings and indentation, remove
what duplicates the text after the cursor, and keep the longest candidate whose insertion adds no
parse error. What is re-parsed with each candidate inserted is the whole document, incrementally
(~2 ms a candidate in a 100 KB file, ~9 ms in 400 KB), up to WHOLE_CHARS; past that the region
around the cursor (`documents.snapshot_around`, REGION_CHARS either side), parsed on its own, so
that a 1 MB line costs what a small file does (the whole text's re-parse took 0.2-0.3 s a
candidate there). A region cut from the middle of a class starts mid-indentation and parses
with dozens of errors, among which a candidate's new ones went unseen: with the region from
16 KB on, 6 % of `bench/holes.py`'s shown completions on PyPI packages (rich, click: files of
35-115 KB) added parse errors to the file (rich/console.py: the region held 109 errors before
the insertion and 107 after, the whole file 0 and 6)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tree_sitter import Tree

from ..documents import Snapshot, encode, parser_for, snapshot_around
from .deadline import NEVER, Deadline
from .gate import Mode
from .lang import indent_width, line_bounds
from .stop import stop_rule, unopened_closer

MAX_PARSES = 12  # candidates re-parsed per completion (≈0.1–1 ms each, incremental)
WHOLE_CHARS = 256 * 1024  # documents up to this size are re-parsed whole for the parse check
REGION_CHARS = 8192  # past it, the parse check sees this much text either side of the cursor


@dataclass(frozen=True)
class IndentStyle:
    tabs: bool
    width: int  # spaces per level (tabs: the tab width assumed)


def indent_style(text: str, offset: int, around: int = 20_000) -> IndentStyle:
    """The document's indentation near the cursor: tabs or spaces, and the most common step."""
    lo, hi = max(offset - around, 0), offset + around
    tabs = spaces = 0
    steps: Counter[int] = Counter()
    prev = 0
    s, _ = line_bounds(text, offset)
    cursor_lead = text[s:offset]  # an auto-indented empty line is evidence too
    tabs += cursor_lead.startswith("\t")
    spaces += cursor_lead.startswith(" ")
    for line in text[lo:hi].splitlines():
        if not line.strip():
            continue
        lead = line[: len(line) - len(line.lstrip(" \t"))]
        tabs += lead.startswith("\t")
        spaces += lead.startswith(" ")
        w = indent_width(line)
        if lead.startswith(" ") or not lead:
            if w > prev:
                steps[w - prev] += 1
            prev = w
    width = steps.most_common(1)[0][0] if steps else 4
    return IndentStyle(tabs > spaces, width if 1 < width <= 8 else 4)


def reindent(completion: str, base: int, doc: IndentStyle) -> str:
    """Lines after the first re-indented to the document's style. Relative depths are measured
    from `base` (the cursor line's indentation) in the completion's own step."""
    lines = completion.split("\n")
    if len(lines) == 1:
        return completion
    widths = [indent_width(ln, doc.width) for ln in lines[1:] if ln.strip()]
    rel = [w - base for w in widths if w > base]
    mixed = any(ln.startswith("\t") for ln in lines[1:]) != doc.tabs
    step = min(rel) if rel else doc.width
    if not mixed and (step == doc.width or any(r % step for r in rel)):
        return completion  # the document's step already, or no single step to rescale
    out = [lines[0]]
    for ln in lines[1:]:
        if not ln.strip():
            out.append(ln.strip(" \t"))
            continue
        w = indent_width(ln, doc.width)
        extra = w - base
        levels, rest = (divmod(extra, step) if extra > 0 else (0, 0))
        width = base + levels * doc.width + rest if extra > 0 else w
        lead = "\t" * (width // doc.width) + " " * (width % doc.width) if doc.tabs else " " * width
        out.append(lead + ln.lstrip(" \t"))
    return "\n".join(out)


def _suffix_overlap(completion: str, text: str, offset: int) -> str:
    """Drop trailing completion lines that repeat the first non-blank lines after the cursor."""
    lines = completion.split("\n")
    _, e = line_bounds(text, offset)
    after = [ln.strip() for ln in text[e:e + 4000].splitlines() if ln.strip()]
    body = [ln.strip() for ln in lines]
    for k in range(min(len(lines) - 1, len(after)), 0, -1):
        if body[-k:] == after[:k] and any(body[-k:]):
            return "\n".join(lines[:-k]).rstrip()
    return completion


def _line_tail_overlap(completion: str, tail: str) -> str | None:
    """`completion` without its longest ending that the rest of the line starts with, or None."""
    tail = tail.rstrip()
    last = completion.split("\n")[-1]
    for k in range(min(len(tail), len(last)), 0, -1):
        if last.endswith(tail[:k]) and tail[:k].strip():
            return completion[: len(completion) - k]
    return None


def error_count(tree: Tree) -> int:
    """ERROR and MISSING nodes (only subtrees that contain errors are entered)."""
    n, stack = 0, [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            n += 1
        if node.has_error:
            stack.extend(c for c in node.children if c.has_error or c.is_missing)
    return n


def _region(snap: Snapshot, offset: int) -> tuple[Snapshot, int]:
    """(the snapshot the parse check works on, where it starts): the document itself up to
    WHOLE_CHARS, else the text around the cursor parsed on its own."""
    if len(snap.text) <= max(WHOLE_CHARS, 2 * REGION_CHARS):
        return snap, 0
    return snapshot_around(snap.text, snap.language, offset, REGION_CHARS)


def _parse_with(snap: Snapshot, offset: int, insert: str) -> Tree:
    src = snap.source
    b = snap.byte_at(offset)
    ins = encode(insert)
    row = snap.text.count("\n", 0, offset)
    col = b - (src.rfind(b"\n", 0, b) + 1)
    new_rows = insert.count("\n")
    new_col = len(ins) - (ins.rfind(b"\n") + 1) if new_rows else col + len(ins)
    old = snap.tree.copy()
    old.edit(start_byte=b, old_end_byte=b, new_end_byte=b + len(ins), start_point=(row, col),
             old_end_point=(row, col), new_end_point=(row + new_rows, new_col))
    return parser_for(snap.language).parse(src[:b] + ins + src[b:], old)


def _cut_points(completion: str) -> list[int]:
    """Shorter candidates, longest first: line ends, then word/closer boundaries of the last
    remaining line (a candidate never ends inside a token)."""
    cuts = [m.start() for m in re.finditer(r"\n", completion)]
    first_nl = completion.find("\n")
    first = completion if first_nl < 0 else completion[:first_nl]
    cuts += [m.end() for m in re.finditer(r"\w+(?=\W|$)|[)\]}\"']", first)]
    return sorted({c for c in cuts if 0 < c < len(completion) and completion[:c].strip()}, reverse=True)


@dataclass(frozen=True)
class Post:
    text: str
    reason: str             # what changed, "" if nothing
    errors_before: int = 0  # parse errors around the insertion without the completion
    errors_after: int = 0   # ...and with it (never more than before unless no tree)
    parses: int = 0
    skipped: tuple[str, ...] = ()  # checks the deadline left out: "parse_check"


def postprocess(snap: Snapshot, offset: int, completion: str, mode: Mode, check_parse: bool = True,
                deadline: Deadline = NEVER) -> Post:
    text = snap.text
    if mode is Mode.EMPTY or not completion.strip():
        return Post("", "empty")
    reasons = []
    s, e = line_bounds(text, offset)
    style = indent_style(text, offset)
    base = indent_width(text[s:offset]) if not text[s:offset].strip() else indent_width(text[s:e])
    fixed = reindent(completion, base, style)
    if fixed != completion:
        reasons.append("reindented")
    cand = fixed.split("\n")[0].rstrip() if mode is Mode.SINGLE else fixed.rstrip()
    deduped = _suffix_overlap(cand, text, offset)
    if deduped != cand:
        reasons.append("suffix lines removed")
        cand = deduped
    tail = text[offset:e]
    if cand.strip() and "\n" not in cand.rstrip() and tail.startswith(cand.rstrip()):
        return Post("", "duplicates the rest of the line")  # the user has it already: accepting doubles it
    variants = [cand]
    unopened = unopened_closer(cand, stop_rule(snap, offset, mode))
    trimmed = _line_tail_overlap(cand, tail) if tail.strip() else None
    if trimmed is not None:
        # prefer dropping the overlap when the completion closes what it did not open
        variants = [trimmed, cand] if unopened is not None else [cand, trimmed]
    eol = "\r\n" if "\r\n" in text[max(offset - 4000, 0):offset + 4000] else None
    late = check_parse and snap.tree is not None and deadline.expired()
    if not check_parse or snap.tree is None or late:
        out = variants[0]
        if out != cand:
            reasons.append("line overlap removed")
        return Post(out.replace("\n", eol) if eol else out, ", ".join(reasons),
                    skipped=("parse_check",) if late else ())
    region, start = _region(snap, offset)
    if region.tree is None:  # not parseable (binary, too large)
        return Post(variants[0].replace("\n", eol) if eol else variants[0], ", ".join(reasons))
    before = error_count(region.tree)
    best: tuple[int, str] | None = None
    tried, skipped = 0, ()
    # fewest errors wins, the longest (earliest) on a tie; a clean candidate ends the search
    for v in (variants + [variants[0][:c] for c in _cut_points(variants[0])])[:MAX_PARSES]:
        if tried and deadline.expired():
            skipped = ("parse_check",)  # the candidates left are not tried: the best so far stands
            break
        after = error_count(_parse_with(region, offset - start, v.replace("\n", eol) if eol else v))
        tried += 1
        if after <= before and (best is None or after < best[0]):
            best = (after, v)
            if after == 0:
                break
    if best is None:
        return Post("", "adds parse errors", before, before, tried, skipped)
    after, v = best
    if v != cand:
        reasons.append("line overlap removed" if v in variants else "trimmed to parse")
    return Post(v.replace("\n", eol) if eol else v, ", ".join(reasons), before, after, tried, skipped)
