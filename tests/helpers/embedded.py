"""Places in held-out code where the embedded pair (draft_models/default, second build) is known
to do what a test needs; a retrain may move them (find new ones as the comments say)."""
from __future__ import annotations

# held-out asyncio code (proactor_events.py of this Python's stdlib, which the embedded pair never
# trained on): at the top of BaseProactorEventLoop's body the pair (second build) writes
# `_check_check_check…` (found by trying class and block starts of held-out asyncio files)
DEGENERATE_HEADER = "class BaseProactorEventLoop(base_events.BaseEventLoop):\n"


def degenerate_place() -> tuple[str, int]:
    """(text, cursor offset): the file with an indented empty line after the class header."""
    from draft_models.data import read_source, stdlib_root

    src = read_source(stdlib_root() / "asyncio" / "proactor_events.py")
    at = src.index(DEGENERATE_HEADER) + len(DEGENERATE_HEADER)
    return src[:at] + "    " + src[at:], at + 4
