"""The one interface between a caller (the language server, the CLI, the benchmarks) and any
engine: the in-process `Engine`, our `completer serve` over its WebSocket, llama-server's
`/infill`, or an OpenAI-compatible `/v1/completions`. The caller never asks which it has.

Also the one completion result every engine returns (`Completion`, flat), the one error type an
engine raises at its caller (`EngineError`), and the one prompt-budget rule.
No torch here: a language server on a remote engine stays light.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .edits.formats import EditPrompt
    from .syntax.decision import SyntaxDecision

ERROR_CODES = ("unavailable", "unauthorized", "overloaded", "bad_request", "not_ready", "model", "internal")


class EngineError(Exception):
    """An engine could not serve a request. `code` is one of ERROR_CODES (a subclass may fix
    it); `message` is written for the user; `retry_after` (seconds) when the engine said when
    to come back."""

    code = "internal"

    def __init__(self, message: str, code: str | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.message, self.retry_after = message, retry_after
        if code is not None:
            self.code = code


class StopReason(StrEnum):
    """Why a completion ended, said the same way by every engine and layer (Completion.stop_reason;
    the engine's counters stops_<reason>). A str: it crosses JSON and msgpack as its value."""
    NONE = ""                   # not said (a remote engine gave no reason)
    EOS = "eos"                 # the model ended it
    LENGTH = "length"           # max_new tokens
    CONTEXT = "context"         # the model's context is full
    STOP = "stop"               # a caller's stop sequence
    SYNTAX = "syntax"           # the syntax node closed (syntax/stop.py)
    DEGENERATE = "degenerate"   # repetition (syntax/degenerate.py)
    UNSURE = "unsure"           # the confidence gate refused the next token (confidence.py)
    CANCELLED = "cancelled"     # the caller cancelled
    SUPERSEDED = "superseded"   # a newer request for the document took over
    GATED = "gated"             # the syntax layer chose not to complete here
    TYPE_THROUGH = "type_through"  # served from the document's previous completion, no model call
    UNTRAINED = "untrained"     # the model was not taught next edits

    @classmethod
    def parse(cls, value: str | None) -> StopReason:
        """A reason that crossed a wire; one this version does not know is NONE."""
        try:
            return cls(value or "")
        except ValueError:
            return cls.NONE


@dataclass
class Completion:
    """One completion, flat: what every engine returns and every caller prints or sends. What a
    caller acts on is a field; engine-specific numbers that are only reported (proposals by
    source, queue time, cached tokens...) go in `extra`; the syntax layer's decisions (the
    pipeline's results) in `syntax`, a typed record. Both are merged into `to_json()` at the top
    level."""
    text: str
    new_tokens: int = 0
    target_forwards: int = 0          # verify steps (the prefill not counted)
    accepted_per_forward: float = 0.0  # τ: tokens gained per target forward (1.0 without drafts)
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    speculative: bool = False
    prompt_tokens: int = 0
    prefill_tokens: int = 0           # prompt tokens computed (the rest came from a cache)
    stop_reason: StopReason = StopReason.NONE
    token_ids: list[int] = field(default_factory=list)  # empty when the engine does not say
    confidence: float | None = None   # the least sure shown token's probability (None: the engine gave no scores)
    unsure_text: str = ""             # what the confidence gate held back (completer/confidence.py)
    type_through: bool = False        # served from the document's previous completion: no model call
    prefetched: bool = False          # served from the continuation computed before the request (the
    #                                   shown completion accepted): no model call at request time
    edit_format: str | None = None    # a next edit (rewrite): the format its answer was read in
    malformed: bool = False           # a next edit: the answer held no editable region
    # other completions to cycle through, best first (engine/alternatives.py; the pipeline keeps those
    # that still differ after post-processing); empty when one was asked for
    alternatives: list[Completion] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    syntax: SyntaxDecision | None = None

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in _FIELDS}
        out["accepted_per_forward"] = round(self.accepted_per_forward, 4)
        out["ttft_ms"], out["total_ms"] = round(self.ttft_ms, 3), round(self.total_ms, 3)
        if self.alternatives:  # absent with one completion: that answer is as before alternatives existed
            out["alternatives"] = [a.to_json() for a in self.alternatives]
        return {**out, **self.extra, **(self.syntax.to_json() if self.syntax is not None else {})}

    @classmethod
    def from_json(cls, d: dict) -> Completion:
        """The inverse of to_json (for a result that crossed a wire); unknown keys go to extra."""
        known = {k: d[k] for k in _FIELDS if k in d}
        if "stop_reason" in known:
            known["stop_reason"] = StopReason.parse(known["stop_reason"])
        alts = d.get("alternatives")
        alts = [cls.from_json(a) for a in alts if isinstance(a, dict)] if isinstance(alts, list) else []
        return cls(**known, alternatives=alts,
                   extra={k: v for k, v in d.items() if k not in _FIELDS and k != "alternatives"})


_FIELDS = ("text", "new_tokens", "target_forwards", "accepted_per_forward", "ttft_ms", "total_ms",
           "speculative", "prompt_tokens", "prefill_tokens", "stop_reason", "token_ids", "confidence",
           "unsure_text", "type_through", "prefetched", "edit_format", "malformed")


@dataclass(frozen=True)
class Chunk:
    """A piece of another file that the syntax layer chose for the prompt (repository context):
    a definition's signature or a window of a recently used file. Engines render chunks before
    the cursor file's prefix, in the order given (the caller keeps it stable across keystrokes so
    that a per-document KV cache keeps matching): the family's repository tokens where it has
    them, else a path comment; llama-server gets them as `/infill`'s `input_extra`."""
    path: str   # relative to the workspace root, '/'-separated
    text: str


@runtime_checkable
class TextStop(Protocol):
    """A stop rule that says why it fired: `stop(text)` is the length of the completion `text`
    to keep once it is finished, else None; `reason` names the rule that fired (SYNTAX,
    DEGENERATE, ...; None until one did). The syntax layer's stop (syntax/stop.py) is one."""
    reason: StopReason | None

    def __call__(self, text: str) -> int | None: ...


StopText = TextStop | Callable[[str], "int | None"]  # a plain callable: a stop sequence, reason STOP


def stop_reason(stop: StopText) -> StopReason:
    """Why `stop` finished a completion: its declared reason, else STOP."""
    why = stop.reason if isinstance(stop, TextStop) else None
    return StopReason(why) if why else StopReason.STOP  # an undeclared reason raises: declare it


def accepted_count(text: str, accepted: bool, accepted_chars: int | None) -> int:
    """Characters of a shown completion `text` the user kept (feedback): `accepted_chars` when the
    editor said (a partial accept), else all of an accepted text and none of a rejected one;
    within 0..len(text) whatever the editor sent."""
    n = len(text) if accepted and accepted_chars is None else (accepted_chars or 0)
    return max(0, min(n, len(text)))


def prompt_budget(ctx: int, max_new: int, max_draft_len: int = 0) -> int:
    """Prompt tokens that leave room in a `ctx`-token context for `max_new` new tokens and one
    verify of `max_draft_len` drafts; never less than half the context (a long generation then
    stops at the context end instead)."""
    return max(ctx - max_new - max_draft_len - 1, ctx // 2)


@runtime_checkable
class EngineClient(Protocol):
    """What the language server needs of an engine. Every method may raise EngineError."""

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None,
                 node_kind: str | None = None,
                 extra: Sequence[Chunk] = (), n: int | None = None) -> Completion:
        """Complete between `prefix` and `suffix` (the context the syntax layer chose; the engine
        only adds its model's FIM tokens and renders `extra`, the cross-file chunks, first). `stop_text` decides when the completion is finished
        (the syntax node closed, or degenerate output); the engine stops paying for tokens then.
        `cancel` set → stop within one step (stop_reason "cancelled"). `on_text` gets deltas (of
        the main completion only). `n`: up to n completions, the main one and in `alternatives`
        up to n-1 others (distinct, best first; each judged by its own copy of `stop_text`);
        None: the engine's option `alternatives` (a remote engine without it: 1)."""
        ...

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        """Prefill the document's cache for this context (the same prompt `complete` would build
        from the same arguments); tokens computed (0 if unknown)."""
        ...

    def rewrite(self, request: EditPrompt, *, fmt: str = "auto", doc_key: str = "_default",
                max_new: int | None = None, speculative: bool = True,
                cancel: threading.Event | None = None) -> Completion:
        """A next edit: the editable region of `request` as the model rewrites it (greedy), in
        the next-edit format `fmt` (completer/edits/formats.py; "auto": the one this model
        reads). `text` is the region read back from the answer ("" and `malformed` when
        it held none); `edit_format` names the format. Speculative: the region is the
        draft (in-process: EditDrafter; a remote server: its own speculation), else plain
        decoding; the text is the same either way. `max_new` bounds the tokens (default: the
        region's x 1.25 + 32)."""
        ...

    def forget(self, doc_key: str) -> None:
        """The editor closed the document: free what the engine keeps for it."""
        ...

    def reconfigure(self, **values: Any) -> None:
        """Options changed (names and values of completer.config's schema, any scope): apply
        those this engine uses from the next request on; the ones it does not use, and those the
        schema marks `reload` (they need a new engine: its caller builds one), are ignored. A
        value outside the schema raises EngineError ("bad_request") and changes nothing."""
        ...

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        """The user accepted (part of) or rejected a shown completion."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def prompt_budget(self, max_new: int | None = None) -> int:
        """Tokens the whole prompt may use, FIM tokens included (the pipeline keeps 3 for them)."""
        ...

    def warm_start(self) -> float:
        """Get ready to serve (load, measure, connect); milliseconds spent."""
        ...

    def stats(self) -> dict:
        """Counters and gauges for `completer/stats` and /metrics (JSON-able)."""
        ...

    def close(self) -> None: ...
