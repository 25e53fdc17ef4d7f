"""What the syntax layer decided for one completion, as one typed record on the result
(`Completion.syntax`) instead of strings in its `extra`: the gate, the kind of node, the prompt
window it chose (and what went in it), what post-processing changed, and — when nothing is left
to show of what the engine generated — which rule dropped what (`Dropped`)."""
from __future__ import annotations

from dataclasses import dataclass

RULES = frozenset({"confidence", "degenerate", "syntax"})  # Dropped rules that are not post-processing's reasons


@dataclass(frozen=True)
class Dropped:
    """A generated completion that shows nothing, and the rule that dropped it."""
    rule: str   # confidence | degenerate | syntax (the stop kept nothing) | a post-processing reason ("adds parse errors", ...)
    text: str   # the raw completion, as the engine generated it


@dataclass(frozen=True)
class SyntaxDecision:
    language: str
    gate: str                      # a syntax.Mode value: empty | single_line | multi_line
    gate_reason: str
    node_kind: str | None = None
    # the prompt window (None when gated off: no prompt was built)
    context_tokens: int | None = None
    raw_context_tokens: int = 0
    tokens_saved: int = 0
    spans: tuple[tuple[str, int, int], ...] = ()   # (kind, start, end) char offsets in the text
    context: tuple[dict, ...] = ()                  # pipeline.Entry.as_dict(): what the prompt holds
    skipped: tuple[str, ...] = ()                   # optional checks the deadline left out
    # the completion
    raw_text: str = ""
    postprocess: str = ""
    parse_errors_before: int = 0
    parse_errors_after: int = 0
    dropped: Dropped | None = None
    syntax_ms: float = 0.0
    engine_total_ms: float = 0.0
    postprocess_ms: float = 0.0

    @property
    def gated(self) -> bool:
        return self.context_tokens is None

    def why_empty(self) -> str | None:
        """Why the completion shows nothing, for a person; None if it shows something."""
        if self.gated:
            return f"gated off ({self.gate_reason})"
        if self.dropped is not None:
            n, rule = len(self.dropped.text), self.dropped.rule
            if rule in RULES:  # the confidence gate, or the stop (degenerate output, the node closed)
                return f"the {rule} rule dropped {n} generated characters"
            return f"post-processing dropped {n} generated characters ({rule})"  # its reason, e.g. adds parse errors
        return None

    def to_json(self) -> dict:
        """The flat keys `completer complete --json` and `completer serve` have always shown."""
        out = {"gate": self.gate, "gate_reason": self.gate_reason, "node_kind": self.node_kind,
               "language": self.language, "syntax_ms": self.syntax_ms, "syntax_skipped": list(self.skipped),
               "context": list(self.context)}
        if self.gated:
            return out
        return {**out, "context_tokens": self.context_tokens, "raw_context_tokens": self.raw_context_tokens,
                "tokens_saved": self.tokens_saved, "spans": [list(s) for s in self.spans],
                "raw_text": self.raw_text, "postprocess": self.postprocess,
                "parse_errors_before": self.parse_errors_before, "parse_errors_after": self.parse_errors_after,
                "engine_total_ms": self.engine_total_ms, "postprocess_ms": self.postprocess_ms,
                "dropped": None if self.dropped is None else {"rule": self.dropped.rule, "text": self.dropped.text}}
