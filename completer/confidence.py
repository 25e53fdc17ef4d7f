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


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"
