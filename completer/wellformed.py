"""One rule for text that crosses a boundary (an LSP document, a WebSocket frame, an OpenAI
request): a lone UTF-16 surrogate, what a client sends when it cuts a string inside a pair
(JSON "\\ud83d"), becomes U+FFFD. The tokenizer cannot encode one (a /v1 request answered 500,
and a document holding one completed empty from then on).

Each lone surrogate becomes one U+FFFD: one UTF-16 code unit, like the surrogate it replaces, so
positions a client counts in UTF-16 stay where it counted them; a high and a low surrogate side
by side become the character they encode (two units either way). Standard library only: the
language server imports it.
"""
from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (the same object when it has none)."""
    if text.isascii() or _SURROGATE.search(text) is None:  # isascii: one C pass, most code
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
