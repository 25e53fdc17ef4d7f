"""completer/client.py's shared rules: what one accept counts, and that the rule is written once."""
from __future__ import annotations

from pathlib import Path

import pytest

from completer.client import accepted_count

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("text,accepted,chars,want", [
    ("abcdef", True, None, 6), ("abcdef", False, None, 0), ("abcdef", True, 2, 2), ("abcdef", False, 2, 2),
    ("abcdef", True, 99, 6), ("abcdef", True, -3, 0), ("", True, None, 0),
])
def test_accepted_count(text, accepted, chars, want):
    assert accepted_count(text, accepted, chars) == want


def test_the_accepted_chars_rule_is_written_once():
    """The engine and the language server count accepted characters through accepted_count."""
    users = [p for d in ("completer", "lsp") for p in (ROOT / d).rglob("*.py")
             if "accepted_chars or 0" in p.read_text(encoding="utf-8")]
    assert users == [ROOT / "completer" / "client.py"]
