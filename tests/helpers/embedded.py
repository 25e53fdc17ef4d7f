"""Places in held-out code where the embedded pair (draft_models/default, third build) is known
to do what a test needs; a retrain may move them (find new ones as the comments say)."""
from __future__ import annotations

# held-out json code (decoder.py of this Python's stdlib, which the embedded pair never trained on):
# at the top of _decode_uXXXX's body the pair (third build) writes a repeated run (found by trying
# the class and def starts of held-out asyncio/json/email files with the degenerate stop off)
DEGENERATE_FILE = "json/decoder.py"
DEGENERATE_HEADER = "def _decode_uXXXX(s, pos):\n"


def degenerate_place() -> tuple[str, int]:
    """(text, cursor offset): the file with an indented empty line after the class header."""
    from draft_models.data import read_source, stdlib_root

    src = read_source(stdlib_root() / DEGENERATE_FILE)
    at = src.index(DEGENERATE_HEADER) + len(DEGENERATE_HEADER)
    return src[:at] + "    " + src[at:], at + 4
