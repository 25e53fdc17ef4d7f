"""A rewritten region as edits of the file (issue 24 item 2): the model writes the whole region
again; what the editor shows is the few places that differ. Lines are matched first (an unchanged
line is never touched), then inside each block of changed lines words, spaces and punctuation are
matched, so a rename is one small edit per use, not whole lines. Every such match goes through
`opcodes`: linear in the common head and tail, and bounded in the middle (MAX_DIFF_CELLS).

`TextEdit` positions are 0-based lines and character columns (Python string indices within the
line: the CLI's and the WebSocket's unit); `lsp_edits` converts them with the document's own
position encoding (completer/documents: UTF-16 unless negotiated). Lines end at \\r\\n, \\r or
\\n, as in completer/documents. Torch-free."""
from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from difflib import SequenceMatcher

from ..documents import Document, line_starts, offset_at

_TOKEN = re.compile(r"\w+|[ \t]+|\r\n|\r|\n|.", re.DOTALL)
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
# Items (lines, tokens) of the old side × of the new side SequenceMatcher is given: it compares up
# to that many pairs per level of its search (10 000 identical lines against themselves: 10^8
# pairs, 8.2 s in completer serve's next_edit). Past it only what lies between the common head
# and tail is matched, one replace when that is still larger.
MAX_DIFF_CELLS = 250_000

Opcode = tuple[str, int, int, int, int]  # SequenceMatcher's: (tag, i1, i2, j1, j2)


@dataclass(frozen=True)
class TextEdit:
    """Replace the text from (start_line, start_col) to (end_line, end_col) with `text`."""
    start_line: int
    start_col: int
    end_line: int
    end_col: int
    text: str

    def to_json(self) -> dict:
        return asdict(self)


def _lines(s: str) -> list[str]:
    return _LINE.findall(s)


def opcodes(a: Sequence, b: Sequence) -> list[Opcode]:
    """SequenceMatcher(None, a, b, autojunk=False).get_opcodes() in bounded work: past
    MAX_DIFF_CELLS pairs the common head and tail are matched item by item first (linear), and a
    middle still that large is one replace."""
    if len(a) * len(b) <= MAX_DIFF_CELLS:
        return SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    n = min(len(a), len(b))
    head = 0
    while head < n and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    ea, eb = len(a) - tail, len(b) - tail
    out: list[Opcode] = [("equal", 0, head, 0, head)] if head else []
    if (ea - head) * (eb - head) > MAX_DIFF_CELLS:
        out.append(("replace", head, ea, head, eb))
    else:
        out += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2
                in SequenceMatcher(None, a[head:ea], b[head:eb], autojunk=False).get_opcodes()]
    if tail:
        out.append(("equal", ea, len(a), eb, len(b)))
    return out


def span_edits(old: str, new: str) -> list[tuple[int, int, str]]:
    """(start, end, text) char spans of `old` that turn it into `new`, in order, disjoint."""
    a, b = _lines(old), _lines(new)
    out: list[tuple[int, int, str]] = []
    pos_a = [0]
    for ln in a:
        pos_a.append(pos_a[-1] + len(ln))
    for tag, i1, i2, j1, j2 in opcodes(a, b):
        if tag == "equal":
            continue
        start, block_old, block_new = pos_a[i1], "".join(a[i1:i2]), "".join(b[j1:j2])
        if tag != "replace":
            out.append((start, start + len(block_old), block_new))
            continue
        ta, tb = _TOKEN.findall(block_old), _TOKEN.findall(block_new)
        offs = [0]
        for t in ta:
            offs.append(offs[-1] + len(t))
        for t2, k1, k2, m1, m2 in opcodes(ta, tb):
            if t2 != "equal":
                out.append((start + offs[k1], start + offs[k2], "".join(tb[m1:m2])))
    return out


def region_edits(old: str, new: str, first_line: int) -> list[TextEdit]:
    """The edits that turn the region `old` (whole lines of a file, from line `first_line`) into
    `new`, in file positions."""
    starts = line_starts(old)

    def pos(o: int) -> tuple[int, int]:
        i = bisect.bisect_right(starts, o) - 1
        return first_line + i, o - starts[i]

    return [TextEdit(*pos(s), *pos(e), t) for s, e, t in span_edits(old, new)]


def apply_edits(text: str, edits: Sequence[TextEdit]) -> str:
    """`text` with the (disjoint) edits applied."""
    starts = line_starts(text)
    spans = sorted(((offset_at(text, e.start_line, e.start_col, starts=starts),
                     offset_at(text, e.end_line, e.end_col, starts=starts), e.text) for e in edits), reverse=True)
    for s, e, t in spans:
        text = text[:s] + t + text[e:]
    return text


def lsp_range(doc: Document, place) -> dict:
    """A place's (line, col, end_line, end_col: characters) LSP range in the document's encoding."""
    def position(line: int, col: int) -> dict:
        ln, ch = doc.position_at(offset_at(doc.text, line, col, starts=doc.lines))
        return {"line": ln, "character": ch}
    return {"start": position(place.line, place.col), "end": position(place.end_line, place.end_col)}


def lsp_edits(doc: Document, edits: Sequence[TextEdit]) -> list[dict]:
    """The edits as LSP TextEdits (`{range: {start, end}, newText}`) in the document's position
    encoding; `doc` holds the text the edits were computed on."""
    def position(line: int, col: int) -> dict:
        ln, ch = doc.position_at(offset_at(doc.text, line, col, starts=doc.lines))
        return {"line": ln, "character": ch}

    return [{"range": {"start": position(e.start_line, e.start_col), "end": position(e.end_line, e.end_col)},
             "newText": e.text} for e in edits]
