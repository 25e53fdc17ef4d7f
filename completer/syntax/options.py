"""The syntax layer's knobs: one frozen dataclass shared by gating, context selection, the
in-loop stop and post-processing (the LSP and CLI expose the same names)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyntaxOptions:
    multiline: bool = True                # False: never more than the rest of the line
    complete_in_comments: bool = False
    complete_in_strings: bool = False
    complete_in_docstrings: bool = False
    max_lines: int = 16                   # a multi-line completion stops after this many lines
    prefix_lines: int = 120               # the prefix window reaches at most this far back...
    suffix_lines: int = 40                # ...and the suffix window this far ahead
    suffix_share: float = 0.25            # of the prompt budget (the engine's own cut uses 0.25)
    header_share: float = 0.2             # of the budget for imports and outline outside the window
    max_siblings: int = 8                 # sibling definitions summarised in the header
    grid_lines: int = 16                  # the prefix window starts on this grid (KV-cache reuse)
    parse_check: bool = True              # trim what adds parse errors (re-parse with the candidate)
