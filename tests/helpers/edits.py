"""Next edits as the CLI and the WebSocket give them (TextEdit: 0-based lines, character columns),
checked before they are applied: apply_edits clamps a position past a line's end and sorts the
edits, so an answer that is wrong in either way would still apply to *some* text."""
from __future__ import annotations

import re
from collections.abc import Sequence

from completer.edits.diff import TextEdit, apply_edits

_BREAK = re.compile(r"\r\n|\r|\n")  # line ends as completer/documents counts them


def applied(text: str, edits: Sequence[TextEdit]) -> str:
    """`text` with `edits` applied, after asserting that each edit lies within the text (a line
    and a column that exist, its start not after its end), that they come in order without
    overlapping, and that each one changes something."""
    starts = [0] + [m.end() for m in _BREAK.finditer(text)]
    ends = [m.start() for m in _BREAK.finditer(text)] + [len(text)]

    def offset(line: int, col: int, edit: TextEdit) -> int:
        assert 0 <= line < len(starts) and 0 <= col <= ends[line] - starts[line], f"outside the text: {edit}"
        return starts[line] + col

    last = 0
    for e in edits:
        a, b = offset(e.start_line, e.start_col, e), offset(e.end_line, e.end_col, e)
        assert last <= a <= b, f"reversed, out of order or overlapping: {e}"
        assert text[a:b] != e.text, f"an edit that changes nothing: {e}"
        last = b
    out = apply_edits(text, edits)
    assert (out != text) == bool(edits)
    return out
