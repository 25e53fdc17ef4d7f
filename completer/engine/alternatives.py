"""Alternatives to cycle (issue 38, part 2): after the main completion, up to n-1 others that
leave it where the target was least sure, decoded over the document's KV cache.

Words: the *main* completion (what the loop decoded, speculatively); a *branch point* (position i
of the main's tokens and the runner-up token the target scored there: GenStats.runner_up); a
*branch* (the main's tokens before i, the runner-up, then plain decoding under the same stop
rule and confidence floor). A branch point's score is the log-probability of its head (the
main's tokens before i, then the runner-up), so near-ties early in the completion come first.
The runner-up itself is not held to the confidence floor: its probability is below one half by
definition, so a calibrated gate (0.6 for the embedded pair) would leave no alternative; the
gate decides what shows first, and an alternative shows only when the user asks for the next.

Cost: the prompt is computed once. The cache is indexed by position, so starting a branch is a
pointer move (runner.sync keeps the common prefix) plus one token of prefill (the runner-up);
branches run from the latest point back, so no head token is fed twice. Each then decodes plainly
(no draft) until its stop. They run under a scheduler ticket of their own, taken only while no
newer request for the document exists (atomically with enqueueing it): a newer keystroke
supersedes them within one step, and they never supersede it.
"""
from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable

from .. import confidence
from ..client import Completion, EngineError, StopReason, StopText, stop_reason
from ..config import OPTIONS
from .batch import Via
from .records import Record, StopFlag
from .runner import common_prefix_len
from .sampling import Sampling
from .scheduler import INTERACTIVE
from .speculative import GenStats, generate

MAX = OPTIONS["alternatives"].meta["hi"]  # completions one request may ask for (the option's bound)


def branch_points(st: GenStats, shown: int, k: int, eos: frozenset[int]) -> list[tuple[int, int]]:
    """Up to `k` (position, token) where a branch may leave the main's first `shown` tokens, best
    first. An end of text is no branch (a prefix of the main is not another completion)."""
    scored, head = [], 0.0
    for i, (tok, lp) in enumerate(st.runner_up[:shown]):
        if math.isfinite(lp) and tok not in eos:
            scored.append((head + lp, i, tok))
        head += st.logprobs[i]
    scored.sort(reverse=True)
    return [(i, tok) for _, i, tok in scored[:k]]


def shown_text(decode: Callable[[list[int]], str], ids: list[int], cut: int | None,
               unsure: int | None) -> tuple[str, str]:
    """(text shown, text the confidence gate held back) of generated `ids`: cut where the stop rule
    said, whole words of the sure tokens before a refused `unsure` one, and never the U+FFFD of a
    byte-level token that ends mid-character."""
    text, held = decode(ids), ""
    if cut is not None:
        text = text[:cut]
    if unsure is not None:
        with_next = decode(ids + [unsure])
        text = confidence.whole_words(text, with_next[len(text):])
        held = with_next[len(text):]
    return text.rstrip("\ufffd"), held


def alternatives(engine, rec: Record, doc_key: str, prompt: list[int], ids: list[int], st: GenStats, shown: int,
                 k: int, max_new: int | None, stop_text: StopText | None, cancel: threading.Event | None,
                 sampling: Sampling) -> list[Completion]:
    """Up to `k` completions other than the main one (`ids`, its stats `st`, `shown` of its tokens
    in its text) of the request `rec` for `doc_key`, distinct from it and from each other, best
    first (Completion.confidence). `stop_text`: a copy of the request's stop rule made before the
    main completion was judged by it; each branch judges with a copy of that."""
    floor = confidence.floor(confidence.resolve(engine.cfg.min_confidence, engine.calibrated_confidence))
    points = branch_points(st, shown, min(k, MAX - 1), engine.fim.eos)
    if not points:
        return []
    sched = engine.sched
    try:
        with sched.cond:  # atomic with the enqueue: a request after this check supersedes the branches
            if rec.epoch or doc_key in sched.live or sched.waiting_for(doc_key):
                return []  # a newer request for the document: the user moved on
            t = sched.acquire(doc_key, INTERACTIVE)
    except EngineError:  # overloaded: alternatives are optional
        return []
    out: list[tuple[int, Completion]] = []  # (the branch point's rank, its completion)
    try:
        cache = t.resource
        if not t.live or common_prefix_len(cache.target.ids, prompt) < len(prompt):
            return []  # superseded, or the cache was evicted meanwhile: a branch would pay the prompt again
        target, flag = Via(cache.target, sched.batcher), StopFlag(t.superseded, cancel, None)
        budget = max_new or engine.cfg.max_new_tokens
        for rank, (i, tok) in sorted(enumerate(points), key=lambda p: -p[1][0]):  # the latest first: each
            if flag.is_set():                                                      # feeds only its runner-up
                break
            c = _branch(engine, target, prompt, ids[:i] + [tok], st.logprobs[:i] + [st.runner_up[i][1]],
                        budget, stop_text, flag, sampling, floor)
            if c is not None:
                out.append((rank, c))
    finally:
        sched.release(t)
    main = engine.decode(ids[:shown])
    seen, kept = {main.rstrip()}, []
    for _, c in sorted(out, key=lambda rc: (-(rc[1].confidence or 0.0), rc[0])):  # ties: the likelier head
        if c.text.strip() and c.text.rstrip() not in seen:
            seen.add(c.text.rstrip())
            kept.append(c)
    engine._count(alternatives=len(kept), alternative_tokens=sum(c.new_tokens for _, c in out))
    return kept


def _branch(engine, target, prompt: list[int], head: list[int], head_lps: list[float], budget: int,
            stop_text: StopText | None, flag: StopFlag, sampling: Sampling, floor: float) -> Completion | None:
    """One branch: `head` (the main's tokens before the branch point, then the runner-up), then
    plain decoding; None when it was cut by a cancel or a newer request."""
    t0 = time.perf_counter()
    rule = copy.copy(stop_text)  # a stop keeps what it judged (syntax/stop.Stop): one per branch
    cut: list[int | None] = [None]

    def stop(cont: list[int]) -> StopReason | None:
        if rule is None:
            return None
        cut[0] = rule(engine.decode(head + cont))
        return stop_reason(rule) if cut[0] is not None else None

    why = stop([])  # the runner-up may finish the completion itself (it closes the node)
    if why is not None or budget - len(head) < 1:
        cont, bst = [], GenStats(prompt_tokens=len(prompt) + len(head), stop_reason=why or StopReason.LENGTH)
    else:
        cont, bst = generate(target, prompt + head, budget - len(head), sampling, None, None, engine.fim.eos, stop,
                             flag, None, engine.gen, floor)
    if bst.stop_reason in (StopReason.CANCELLED, StopReason.SUPERSEDED):
        return None
    ids = head + cont
    text, held = shown_text(engine.decode, ids, cut[0], bst.unsure)
    lps = head_lps + bst.logprobs
    return Completion(text, new_tokens=len(cont) + 1, target_forwards=bst.target_forwards,
                      accepted_per_forward=bst.accepted_per_forward, ttft_ms=bst.ttft_ms,
                      total_ms=(time.perf_counter() - t0) * 1e3, prompt_tokens=bst.prompt_tokens,
                      prefill_tokens=bst.prefill_tokens, stop_reason=bst.stop_reason, token_ids=ids,
                      confidence=confidence.score(lps[:engine._tokens_in(ids, text)]), unsure_text=held)
