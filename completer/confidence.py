"""The confidence gate: a quiet miss beats a wrong suggestion. The one owner of the rule.

The target scores every token it emits (its log-probability, which verify computes anyway). A
completion is shown up to the first token the model gave less than `min_confidence` (a
probability): decoding stops there (engine/speculative.generate's floor), a partial identifier
that token would have continued is taken back too (half a name is a wrong name), and when
nothing is left the completion is dropped with the rule "confidence". A completion's
`confidence` is the probability of its least sure token shown.

Thresholds are per model: a model directory may carry its calibrated value as
`completer_min_confidence` in config.json (bench/gate.py --calibrate writes it, measured on code
of the training domain the model never saw); `min_confidence` unset uses it, else the gate is off.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .client import Completion, StopReason

OFF = float("-inf")


def floor(min_confidence: float | None) -> float:
    """The log-probability below which a token ends the completion (OFF for None or 0)."""
    return math.log(min_confidence) if min_confidence else OFF


def resolve(option: float | None, calibrated: float | None) -> float:
    """The threshold in force: the option when set, else the model's calibrated value, else 0 (off)."""
    return option if option is not None else (calibrated or 0.0)


def whole_words(sure: str, unsure: str) -> str:
    """`sure` without the trailing part of an identifier that the refused text `unsure` continues."""
    if not (sure and unsure and _word(sure[-1]) and _word(unsure[0])):
        return sure
    i = len(sure)
    while i > 0 and _word(sure[i - 1]):
        i -= 1
    return sure[:i]


def score(logprobs: Sequence[float]) -> float | None:
    """A shown text's confidence: its least sure token's probability (None: no scores)."""
    return round(math.exp(min(logprobs)), 4) if logprobs else None


class StreamGate:
    """The gate over a remote server's stream of tokens with their log-probabilities (llama-server's
    `n_probs`): `events(...)` passes the stream on until the first token below the floor, which it
    keeps back (`unsure`) with everything after it; `logprobs` are those of the tokens let through.
    A remote model has no calibration here: the gate is on only where min_confidence is set."""

    def __init__(self, min_confidence: float | None):
        self.floor = floor(min_confidence)
        self.logprobs: list[float] = []
        self.unsure: str | None = None
        self.unsure_logprob: float | None = None

    @property
    def on(self) -> bool:
        return self.floor != OFF

    def events(self, events, tokens_of, with_text):
        """`tokens_of(event)`: its [(token text, log-probability)]; `with_text(event, text)`: the
        event holding only `text` (the sure tokens before the refused one). The stream is closed
        when a token is refused: the server stops decoding."""
        try:
            for ev in events:
                toks = tokens_of(ev) if self.on else []
                low = next((i for i, (_, lp) in enumerate(toks) if lp < self.floor), None)
                if low is None:
                    self.logprobs += [lp for _, lp in toks]
                    yield ev
                    continue
                self.logprobs += [lp for _, lp in toks[:low]]
                self.unsure, self.unsure_logprob = toks[low]
                if low:
                    yield with_text(ev, "".join(t for t, _ in toks[:low]))
                return
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def finish(self, text: str, why: StopReason | None, on_text) -> tuple[str, StopReason | None, str, float | None]:
        """After the stream: the text to show (refused: the whole words of the sure tokens), the
        stop reason (`why`, else UNSURE when a token was refused), the refused token ("" if
        none) and the confidence score (None with the gate off). With the gate on, the text was
        held back while it was judged: `on_text` is given it once here."""
        unsure = ""
        if self.unsure is not None:
            text = whole_words(text, self.unsure)
            why, unsure = why or StopReason.UNSURE, self.unsure
        if self.on and on_text is not None and text:
            on_text(text)
        return text, why, unsure, score(self.logprobs) if self.on else None


def refused_edit(gate: StreamGate, **fields) -> Completion | None:
    """A next edit's answer the gate refused a token of: no answer (stop_reason UNSURE), its
    confidence the refused token's probability; None when it refused none. Half a rewrite is no
    rewrite, so the text the gate let through is not kept."""
    if gate.unsure is None:
        return None
    return Completion("", stop_reason=StopReason.UNSURE, unsure_text=gate.unsure,
                      confidence=score([gate.unsure_logprob]), **fields)


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"
