"""Type-through, the rule: when the user types the beginning of the completion that was shown,
the request that follows (same suffix, a prefix that extends the old one by what was typed) is
served the rest of that completion without the model. The engine applies it to its records of
completions in flight (engine/engine.py), the remote clients to the last completion of each
document (remote clients' TypeThrough). Torch-free.

A repeat of the same request is not typed-through: it generates again (a caller may want the
model's own output), and so does a request that typed all of the completion.
"""
from __future__ import annotations


def typed(old_prefix: str, old_suffix: str, prefix: str, suffix: str) -> str | None:
    """The characters typed since a request at (`old_prefix`, `old_suffix`), or None when the
    new request is not that one plus typing at the cursor."""
    if suffix != old_suffix or len(prefix) <= len(old_prefix) or not prefix.startswith(old_prefix):
        return None
    return prefix[len(old_prefix):]


def rest(text: str, typed: str) -> str:
    """What remains of the completion `text` after `typed`: "" when the user typed something
    else or all of it."""
    return text[len(typed):] if text.startswith(typed) else ""
