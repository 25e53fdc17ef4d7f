"""The speculative decoding loop: drafter proposes k tokens, the target verifies them in one
forward, rejection sampling keeps the target's distribution exactly (greedy: argmax match).

The target runner's cache holds everything before `cur` (the newest token, not yet consumed);
after a verify it is truncated to `cur` + the accepted drafts, so a rejection is a pointer move.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..client import StopReason
from .adaptive import AdaptiveK
from .drafters import Drafter
from .sampling import EMPTY, Proposal, Sampling, token_logprobs, verify

# A stop rule: asked with the ids generated so far after every step; the reason it finished the
# generation (the caller's rule: SYNTAX, DEGENERATE, STOP...), else None
StopRule = Callable[[list[int]], StopReason | None]

UNTIMED_ROUNDS = 2  # a generation's first rounds pay for what ran before them, whatever their kind
# (the prefill, other documents: on the embedded pair 2.5× and 1.7× a step, then ~1.05×): AdaptiveK
# compares drafting with plain on the rest


@dataclass
class GenStats:
    prompt_tokens: int = 0
    prefill_tokens: int = 0        # prompt tokens actually computed (the rest came from the cache)
    new_tokens: int = 0
    target_forwards: int = 0       # verify steps (the prefill not counted)
    proposed: int = 0
    accepted: int = 0
    accept_by_pos: list[int] = field(default_factory=lambda: [0] * 16)    # accepted at draft position i
    proposed_by_pos: list[int] = field(default_factory=lambda: [0] * 16)
    by_source: dict = field(default_factory=dict)  # source → [proposed, accepted]
    ttft_ms: float = 0.0
    prefill_ms: float = 0.0
    total_ms: float = 0.0
    stop_reason: StopReason = StopReason.NONE
    logprobs: list[float] = field(default_factory=list)  # the target's log-probability of each token out
    runner_up: list[tuple[int, float]] = field(default_factory=list)  # per token out: the likeliest other
    # token there and its log-probability (engine/alternatives.py branches at the least sure ones)
    unsure: int | None = None      # the token the confidence floor refused (stop_reason "unsure"), not in out
    unsure_logprob: float | None = None  # its log-probability

    @property
    def accepted_per_forward(self) -> float:
        """τ: tokens gained per target verify forward (accepted drafts + the target's own token)."""
        return (self.accepted + self.target_forwards) / self.target_forwards if self.target_forwards else 0.0


def generate(target, prompt: list[int], max_new: int, sampling: Sampling,
             drafter: Drafter | None = None, k: AdaptiveK | None = None,
             eos_ids: frozenset[int] = frozenset(), stop: StopRule | None = None,
             cancel: threading.Event | None = None, on_tokens: Callable[[list[int]], None] | None = None,
             gen: torch.Generator | None = None, floor: float = float("-inf")) -> tuple[list[int], GenStats]:
    """Decode up to `max_new` tokens after `prompt` (ids exclude EOS). `stop(ids)` is asked after
    every step (the reason it returns ends the generation); `cancel` is checked between steps;
    `on_tokens` gets each step's new ids. `floor`: a token the target gives a lower log-probability
    ends the generation before it (UNSURE; what follows an unsure token is not worth its decode time)."""
    st = GenStats(prompt_tokens=len(prompt))
    t0 = time.perf_counter()
    feed = target.sync(prompt)  # the KV cache keeps the common prefix: prefill only the delta
    st.prefill_tokens = len(feed)
    logits = target.forward(feed)[-1:]  # [1, V]
    st.prefill_ms = (time.perf_counter() - t0) * 1e3
    _, cur = verify(logits, EMPTY, sampling, gen)
    st.ttft_ms = (time.perf_counter() - t0) * 1e3
    out: list[int] = []
    new, (lps, ups) = [cur], token_logprobs(logits, [cur])
    t_round = k.clock() if k is not None else 0.0  # rounds timed end to end: k weighs drafting against plain
    while True:
        eos = next((i for i, t in enumerate(new) if t in eos_ids), None)
        new = new[:eos][: max_new - len(out)]
        low = next((i for i, lp in enumerate(lps[: len(new)]) if lp < floor), None)
        if low is not None:
            st.unsure, st.unsure_logprob, new = new[low], lps[low], new[:low]
        out += new
        st.logprobs += lps[: len(new)]
        st.runner_up += ups[: len(new)]
        if on_tokens is not None and new:
            on_tokens(new)
        if low is not None:
            st.stop_reason = StopReason.UNSURE
            break
        if eos is not None:
            st.stop_reason = StopReason.EOS
            break
        if len(out) >= max_new:
            st.stop_reason = StopReason.LENGTH
            break
        why = stop(out) if stop is not None else None
        if why is not None:
            st.stop_reason = why
            break
        if cancel is not None and cancel.is_set():
            st.stop_reason = StopReason.CANCELLED
            break
        room = target.max_len - len(target.ids) - 1  # draft tokens that fit after cur
        if room < 0:
            st.stop_reason = StopReason.CONTEXT
            break
        cap = target.max_draft  # a batched step's share under load (batch.Via)
        kk = min(k.k if k else 0, max_new - len(out), room, cap if cap is not None else room)
        prop = drafter.propose(prompt + out, kk) if drafter is not None and kk > 0 else EMPTY
        base = len(target.ids)
        logits = target.forward([out[-1]] + prop.ids)  # [k+1, V]: one verify forward
        n, nxt = verify(logits, prop, sampling, gen)
        target.truncate(base + 1 + n)  # keep cur + accepted drafts; rejected rows are dead
        new = prop.ids[:n] + [nxt]
        lps, ups = token_logprobs(logits, new)
        st.target_forwards += 1
        _count(st, prop, n)
        if k is not None:  # the round: the loop, the draft's catch-up and proposal, the verify
            now = k.clock()
            timed = sampling.greedy and st.target_forwards > UNTIMED_ROUNDS  # a seeded sample must not hang on timing
            spent = drafter.take_catch_up_ms() if drafter is not None else 0.0  # a draft's one-off catch-up
            ms = max(0.0, (now - t_round) * 1e3 - spent)
            k.update(len(prop.ids), n, ms if timed else None, spent)
            t_round = now
    del out[max_new:]
    st.new_tokens = len(out)
    st.total_ms = (time.perf_counter() - t0) * 1e3
    return out, st


def _count(st: GenStats, prop: Proposal, n: int) -> None:
    kp = len(prop.ids)
    st.proposed += kp
    st.accepted += n
    for i in range(min(kp, 16)):
        st.proposed_by_pos[i] += 1
        st.accept_by_pos[i] += i < n
    if kp:
        src = st.by_source.setdefault(prop.source, [0, 0])
        src[0] += kp
        src[1] += n
