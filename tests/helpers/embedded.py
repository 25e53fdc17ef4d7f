"""Places in held-out code where the embedded pair (draft_models/default, fourth build) is known
to do what a test needs; a retrain may move them (find new ones as the comments say)."""
from __future__ import annotations

# held-out email code (_header_value_parser.py of this Python's stdlib, which the embedded pair never
# trained on): at the top of _validate_xtext's body the pair (fourth build) writes a repeated run
# ("# Check if the first element of the end of the end of the en…"; found by trying the class and
# def starts of held-out asyncio/json/email files with the degenerate stop off, then on: the stop
# must drop it all within 16 tokens)
DEGENERATE_FILE = "email/_header_value_parser.py"
DEGENERATE_HEADER = "def _validate_xtext(xtext):\n"


def degenerate_place() -> tuple[str, int]:
    """(text, cursor offset): the file with an indented empty line after the class header."""
    from draft_models.data import read_source, stdlib_root

    src = read_source(stdlib_root() / DEGENERATE_FILE)
    at = src.index(DEGENERATE_HEADER) + len(DEGENERATE_HEADER)
    return src[:at] + "    " + src[at:], at + 4
