"""Drafters (proposers): interchangeable producers of `Proposal(ids, probs | None)` for the verifier.

`probs` is the drafter's distribution for each proposed token, [k, V]; None means the proposal
is deterministic (a one-hot distribution), which is what the n-gram and fast-path drafters give.
A drafter sees the whole accepted sequence (prompt + generated, ending with the token the
target has not consumed yet) and proposes what follows it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from .sampling import EMPTY, Proposal, Sampling, warp


class Drafter(Protocol):
    def propose(self, seq: list[int], k: int) -> Proposal: ...

    def take_catch_up_ms(self) -> float:
        """Milliseconds the last proposals spent catching a model up on tokens it missed (paid once
        per switch to drafting; generate() leaves them out of the rounds' times), reset on reading.
        0 for a drafter without a model."""
        return 0.0


class ModelDrafter(Drafter):
    """A small causal LM that proposes k tokens autoregressively over its own position-indexed
    KV cache (`runner`: anything with sync/forward/truncate, see completer.engine.runner). A
    runner with `head_rows` scores only those ids; proposals map back to vocabulary ids and
    their probabilities are zero elsewhere (rejection sampling stays exact: q is what we drew from).

    A catch-up of more than CATCH_UP tokens (the prompt, or the tokens of plain rounds, when the
    draft was left behind) is timed apart: `take_catch_up_ms` hands it to generate(), which leaves
    it out of the round's time. It is paid once per switch to drafting, not per token, and counted
    per token it made a try of drafting look slower than it runs (on the embedded pair a 384-token
    catch-up costs ~8 ms, a few rounds' worth), so tries lost and plain stuck."""

    CATCH_UP = 16  # more tokens to feed than a round leaves behind (accepted drafts + 1)

    def __init__(self, runner, sampling: Sampling, generator: torch.Generator | None = None):
        self.runner, self.sampling, self.gen = runner, sampling, generator
        self.rows = runner.head_rows
        self._rows_t = torch.tensor(self.rows) if self.rows is not None else None
        self.catch_up_ms = 0.0

    def take_catch_up_ms(self) -> float:
        ms, self.catch_up_ms = self.catch_up_ms, 0.0
        return ms

    def _sync(self, seq: list[int]) -> list[int]:
        feed = self.runner.sync(seq)
        if len(feed) > self.CATCH_UP:
            t0 = time.perf_counter()
            self.runner.forward(feed[:-1])
            self.catch_up_ms += (time.perf_counter() - t0) * 1e3
            feed = feed[-1:]
        return feed

    def propose(self, seq: list[int], k: int) -> Proposal:
        if k <= 0 or len(seq) + k > self.runner.max_len:
            return EMPTY
        if self.sampling.greedy and self.runner.greedy is not None:  # the native step: k picks in one call
            return Proposal(self.runner.greedy(self._sync(seq), k), None, "model")
        logits = self.runner.forward(self._sync(seq))[-1]  # [V] or [len(rows)]
        ids, probs = [], []
        for i in range(k):
            if self.sampling.greedy:
                j = int(logits.argmax())  # host sync: the next draft forward needs the id
            else:
                q = warp(logits, self.sampling)
                j = int(torch.multinomial(q, 1, generator=self.gen))  # host sync, as above
                if self._rows_t is not None:
                    q = torch.zeros(self.runner.vocab_size, dtype=q.dtype).index_copy_(0, self._rows_t, q)
                probs.append(q)
            t = self.rows[j] if self.rows is not None else j
            ids.append(t)
            if i + 1 < k:
                logits = self.runner.forward([t])[-1]
        return Proposal(ids, torch.stack(probs) if probs else None, "model")


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens
    (n = max_n..min_n) and propose what followed it. No model, ≈0 cost."""

    def __init__(self, max_n: int = 4, min_n: int = 2):
        self.max_n, self.min_n = max_n, min_n
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram → end position of its latest occurrence

    def _update(self, seq: list[int]) -> None:
        n0 = len(self._seq)
        if n0 > len(seq) or self._seq[-64:] != seq[max(0, n0 - 64):n0]:
            self._seq, self._index, n0 = [], {}, 0  # a different sequence: reindex
        # n-grams seq[end-n:end] with a following token; the tail (ending at len(seq)) is left out
        for end in range(max(1, n0), len(seq)):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    self._index[tuple(seq[end - n:end])] = end
        self._seq = list(seq)

    def propose(self, seq: list[int], k: int) -> Proposal:
        if k <= 0:
            return EMPTY
        self._update(seq)
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) < n:
                continue
            end = self._index.get(tuple(seq[-n:]))
            if end is not None:
                ids = seq[end:end + k]
                if ids:
                    return Proposal(ids, None, "ngram")
        return EMPTY


class FastPathDrafter(Drafter):
    """Near-certain continuations mined from the corpus: (a, b) → c when P(c | a, b) ≥ 0.9
    over enough occurrences (mined by the recipe: `draft_models.fastpath`). Chains lookups, ≈0 cost."""

    def __init__(self, table: dict[tuple[int, int], int]):
        self.table = table

    @staticmethod
    def table_of(rows: list) -> dict[tuple[int, int], int]:
        return {(a, b): c for a, b, c in rows}


    def propose(self, seq: list[int], k: int) -> Proposal:
        ids: list[int] = []
        a, b = (seq[-2], seq[-1]) if len(seq) >= 2 else (-1, seq[-1] if seq else -1)
        while len(ids) < k:
            c = self.table.get((a, b))
            if c is None:
                break
            ids.append(c)
            a, b = b, c
        return Proposal(ids, None, "fastpath") if ids else EMPTY


def _one_hot(ids: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()  # [k, V]


class CombinedDrafter(Drafter):
    """Cheapest first, then the model for the rest of the k tokens: an n-gram match when the
    document repeats itself (≥ `min_ngram_tokens` of it), then fast-path tokens, then the draft
    model continuing after them."""

    def __init__(self, model: ModelDrafter | None, ngram: NgramDrafter | None,
                 fastpath: FastPathDrafter | None, vocab_size: int, min_ngram_tokens: int = 2):
        self.model, self.ngram, self.fastpath = model, ngram, fastpath
        self.vocab, self.min_ngram_tokens = vocab_size, min_ngram_tokens

    def propose(self, seq: list[int], k: int) -> Proposal:
        parts: list[Proposal] = []
        n = 0
        for d in (self.ngram, self.fastpath, self.model):
            if d is None or n >= k:
                continue
            p = d.propose(seq + [t for q in parts for t in q.ids] if parts else seq, k - n)
            if d is self.ngram and len(p.ids) < min(k, self.min_ngram_tokens):
                continue  # a one-token match is a guess
            if p.ids:
                parts.append(p)
                n += len(p.ids)
        if len(parts) <= 1:
            return parts[0] if parts else EMPTY
        probs = None
        if parts[-1].probs is not None:  # sampling: one-hot rows for the deterministic parts
            probs = torch.cat([q.probs if q.probs is not None else _one_hot(q.ids, parts[-1].probs.shape[-1])
                               for q in parts])
        return Proposal([t for q in parts for t in q.ids], probs, "+".join(q.source for q in parts))

    def take_catch_up_ms(self) -> float:
        return self.model.take_catch_up_ms() if self.model is not None else 0.0


class AdaptiveK:
    """Draft length from acceptance history, and drafting or not from measured wall time.

    The length: decayed counts, per draft position i, of how often a proposed i-th token was
    accepted (s_i ≈ P(≥ i accepted); no geometric assumption: acceptance comes in runs, e.g. an
    n-gram match is right all along or not at all), and the k in [max(k_min, 1), k_max] that
    maximises expected tokens per unit of modelled time:

        E[tokens](k) = 1 + s_1 + … + s_k,   cost(k) = c·k + verify(k)

    in target-step units: a draft step costs `c`; verify(k), a target forward over k + 1 tokens,
    is `verify[k]` when measured (calibrate.measure_step_costs: on CPUs it jumps from 1 to 2 tokens
    and then stays nearly flat, so no linear model fits) else 1 + `beta`·k. A position with
    (almost) no recent evidence gets the one before it times 0.85 (a run of accepted tokens tends
    to go on), so longer drafts get explored once shorter ones keep being accepted.

    Drafting or plain (k = 0, allowed when k_min = 0): measured, the model only the prior. The
    model misses what a draft costs beyond its step (the draft's catch-up over accepted tokens,
    the caches it displaces, the Python around it: speculative int4 ran at 0.64× plain on the
    embedded pair while the model said drafts paid), so generate() times every round end to end
    with `clock`, and `update` keeps, per kind (drafting: a round that proposed; plain), sums of
    milliseconds and emitted tokens, both decayed by `decay` per round: the kind not chosen
    fades, so a fresh try of it counts most. It drafts while drafting measures fewer ms per
    token than plain; until both are measured the model decides (E[tokens](k) > cost(k)), and
    the first timed drafting round is followed by a plain one so that both are. After
    `probe[kind]` rounds of the chosen kind the other is tried: PLAIN_TRY_ROUNDS timed plain
    rounds, or TRY_ROUNDS timed rounds at the model's k. The round right after a switch from one
    kind to the other is not timed, nor (`settle_ms`: SETTLE_MS for a target on several threads)
    those until that many ms have passed: they pay for the other's caches and idle cores (the
    draft's weights and K/V displace the target's, its single-threaded work leaves a target's
    second core idle; plain rounds leave the draft behind, whose catch-up generate() leaves out
    anyway). Timed, the first plain round after drafting read ~1.4 ms a token where plain
    decoding ran at ~1.0 (fast-int8 on the embedded pair), and drafting that lost was kept. The
    tried kind's interval doubles, up to PROBE_MAX, after a try that does not win and after a
    win that does not hold PROBE_STEPS rounds (a lucky try); a kind that held that long and
    then lost is tried again after PROBE_STEPS. The tries are what following the document
    costs: on the embedded pair, plain mode with its tries ran at 0.96-0.99× plain decoding."""

    PROBE_STEPS = 16  # rounds before the kind not chosen is tried, after a choice that held
    PROBE_MAX = 256   # the interval doubles up to this while tries do not win
    TRY_ROUNDS = 3    # timed rounds a try of drafting lasts (after the switch's untimed ones); 1
    # lost more often where drafting paid (fast-int8 on the embedded pair: 0.92-1.00× plain in 5
    # runs, 0.98-1.13× with 3)
    PLAIN_TRY_ROUNDS = 1  # timed rounds a try of plain lasts
    SETTLE_MS = 8.0  # a multi-threaded target's `settle_ms`: on two threads a plain round after
    # drafting (the draft's single-threaded work left a core idle) cost 1.9, 1.7, 1.5, 1.3, 1.2,
    # 1.05 ms before settling at 0.8-0.9 (fast-int8, the embedded pair), so the one round a try
    # timed read plain as dearer than drafting, and drafting went on at 0.75-0.96× plain decoding;
    # on one thread a target's forward after the draft's costs what it does after its own
    MARGIN = 0.05  # where drafting measures within this of plain (fast-int8 and int4 targets on the
    # embedded pair: a verify of a few rows costs 1.3-1.5 steps), plain: no draft prefill, no catch-ups
    TRY_SHARE = 0.05  # of the time decoding plain that tries of drafting may spend catching up
    PRIOR = 0.8     # acceptance of a first draft token before any evidence (then x0.85 a position)
    PRIOR_WEIGHT = 2.0  # proposals' worth of evidence the prior counts for: one rejected first
    # round no longer reads as "never accepted" (s = 0 sent the embedded pair's first document to
    # plain decoding for good: its first draft token was rejected, drafting was never timed)

    def __init__(self, k: int, k_min: int = 1, k_max: int = 8, c: float = 0.06, beta: float = 0.1,
                 decay: float = 0.95, verify: list[float] | None = None,
                 clock: Callable[[], float] = time.perf_counter, settle_ms: float = 0.0):
        self.k, self.k_min, self.k_max = k, k_min, k_max
        self.settle = settle_ms  # after a switch of kind, rounds are timed from this many ms on
        self.c, self.beta, self.decay = c, beta, decay
        self.verify = verify if verify and len(verify) > k_max else [1 + beta * i for i in range(k_max + 1)]
        self.clock = clock  # seconds; generate() times rounds with it (tests pass a fake one)
        self.prop = [0.0] * k_max  # decayed counts per position: proposed, accepted
        self.acc = [0.0] * k_max
        self.wall = [[0.0, 0.0], [0.0, 0.0]]  # [plain, drafting] → decayed ms, emitted tokens
        self.drafting, self.trying = k > 0, 0  # the kind chosen (k_min = 0); rounds left trying the other
        self.last: bool | None = None  # the kind of the last round (True: it proposed)
        self.catch_up_ms = 0.0  # the last catch-up a try of drafting paid (ModelDrafter.take_catch_up_ms)
        self.held = self.idle = 0  # rounds since the choice changed; since the other kind was tried
        self.since_switch_ms = settle_ms  # timed rounds' ms since the kind last switched (starts settled)
        self.probe = [self.PROBE_STEPS] * 2  # [plain, drafting] → rounds before it is tried

    def learnt_from(self, other: AdaptiveK) -> AdaptiveK:
        """This schedule (its bounds and step costs) with what `other` learnt: acceptance (the
        positions both bounds share), measured wall time, drafting or plain, its tries (and what
        catching up cost them), and k."""
        n = min(self.k_max, other.k_max)
        self.prop[:n], self.acc[:n] = other.prop[:n], other.acc[:n]
        self.wall = [list(w) for w in other.wall]
        self.catch_up_ms = other.catch_up_ms
        self.drafting, self.trying, self.held, self.idle = other.drafting, other.trying, other.held, other.idle
        self.probe = list(other.probe)
        self.k = min(other.k, self.k_max)
        return self

    def fork(self) -> AdaptiveK:
        """A copy that goes on learning separately (e.g. for one kind of syntax node)."""
        return self.resized(self.k_max)

    def resized(self, k_max: int) -> AdaptiveK:
        """A copy bounded by a new `k_max` (the max_draft_len option changed)."""
        return AdaptiveK(self.k, self.k_min, k_max, self.c, self.beta, self.decay, self.verify,
                         self.clock, self.settle).learnt_from(self)

    def expected(self, k: int) -> float:
        """1 + s_1 + … + s_k: s_i the decayed share of proposals at position i that were accepted,
        pulled toward a prior (PRIOR for the first, the position before's x0.85 after) by
        PRIOR_WEIGHT proposals' worth; where positions have no evidence, the prior alone."""
        total, s = 1.0, self.PRIOR / 0.85
        for a, p in zip(self.acc[:k], self.prop[:k]):
            s = (a + self.PRIOR_WEIGHT * s * 0.85) / (p + self.PRIOR_WEIGHT)
            total += s
        return total

    def rate(self, k: int) -> float:
        """Modelled tokens per target step with k drafts (plain: 1)."""
        return self.expected(k) / (self.c * k + self.verify[k])

    def ms_per_token(self, drafting: bool) -> float | None:
        """Measured, decayed; None before the first timed round of that kind."""
        ms, tokens = self.wall[drafting]
        return ms / tokens if tokens else None

    def update(self, proposed: int, accepted: int, ms: float | None = None, catch_up_ms: float = 0.0) -> None:
        """After a round that proposed `proposed` drafts, `accepted` of them, in `ms` (None: not
        timed; a draft's catch-up, `catch_up_ms`, left out) → the next round's k."""
        if catch_up_ms:
            self.catch_up_ms = catch_up_ms
        d = self.decay
        if proposed:
            for i in range(self.k_max):  # every position's evidence fades, so a k that stopped
                tried = i < proposed     # being tried is extrapolated again and gets retried
                self.prop[i] = d * self.prop[i] + tried
                self.acc[i] = d * self.acc[i] + (tried and i < accepted)
        switched, self.last = self.last is not None and self.last != (proposed > 0), proposed > 0
        if switched:
            self.since_switch_ms = 0.0
        recorded = ms is not None and not switched and self.since_switch_ms >= self.settle
        if ms is not None:
            self.since_switch_ms += ms
        if recorded:
            for kind, w in enumerate(self.wall):
                ms_k, tokens = (ms, accepted + 1) if kind == (proposed > 0) else (0.0, 0)
                w[0], w[1] = d * w[0] + ms_k, d * w[1] + tokens
        self.k = self.best() if self.k_min > 0 else self._draft_or_plain(proposed > 0, recorded)

    def best(self) -> int:
        """The modelled best number of drafts (≥ 1)."""
        return max(range(max(self.k_min, 1), self.k_max + 1), key=self.rate)

    def _draft_or_plain(self, drafted: bool, recorded: bool) -> int:
        # `best()` only where a draft follows: ~5 µs, 1 % of an int4 step on the embedded pair
        plain, drafting = self.ms_per_token(False), self.ms_per_token(True)
        if plain is None or drafting is None:
            draft = self.rate(self.best()) > 1
        else:  # drafting must measure MARGIN faster to take over from plain, and keeps on while faster
            draft = drafting < plain * (1.0 if self.drafting else 1.0 - self.MARGIN)
        if self.trying:
            # a try lasts its timed rounds (a try of drafting that found nothing goes on)
            self.trying -= drafted != self.drafting and recorded
            if self.trying:
                return 0 if self.drafting else self.best()
            if draft == self.drafting:  # a try that did not win
                self.probe[not draft] = min(2 * self.probe[not draft], self.PROBE_MAX)
                self.idle = 0
        if draft != self.drafting:  # the kind left is tried again soon only if it had held
            left = self.drafting
            self.probe[left] = min(2 * self.probe[left], self.PROBE_MAX) if self.held < self.PROBE_STEPS \
                else self.PROBE_STEPS
            self.drafting, self.held, self.idle = draft, 0, 0
        self.held, self.idle = self.held + 1, self.idle + 1
        if draft and plain is None and drafting is not None:
            return 0  # cold: plain's first measurement
        if self.idle > self.probe[not draft] and (draft or self._try_paid_for(plain)):
            self.trying = self.PLAIN_TRY_ROUNDS if draft else self.TRY_ROUNDS
            return 0 if draft else self.best()
        return self.best() if draft else 0

    def _try_paid_for(self, plain_ms: float | None) -> bool:
        """Whether the plain rounds since the last try have run long enough that the next try's
        catch-up (the last one's) costs at most TRY_SHARE of them: on the embedded pair a try
        catches the draft up over a new document's prompt, ~8 ms, where a fast-int8 target's
        plain round costs ~1 ms, so tries every 16-64 rounds cost it 10-15 % in bench/peers.py."""
        return plain_ms is None or self.idle * plain_ms * self.TRY_SHARE >= self.catch_up_ms


class EditDrafter(Drafter):
    """Speculative edits: the original region is the draft of its rewrite. One per generation:
    the first call's sequence ends with the output's first token, and only output tokens are
    matched. Finds where the output stands in `original` — the longest n (max_n..1) for which
    the output's last n tokens end at some position p of the original, the p nearest the one
    expected from the previous draft (it advances with the output; the start at first) — and
    proposes original[p:p + k], up to its own `k`. While the output copies, nearly every draft
    is accepted, so `k` is far past max_draft_len's bound: generate() takes it from the AdaptiveK
    its caller passes (`adaptive_k()`), so the bound is per call and the default path keeps its
    own. After a divergence the last two or more generated tokens re-align it; one token only
    for the answer's first, at the region's start (else an answer that copies nothing keeps
    paying for verifies: 0.8× plain on the embedded pair, which never copies). No match: nothing.

    k = 32: on the embedded pair (AMD EPYC, 2 shared cores; bench/edit_drafter.py --new 192),
    verify(k) after a 64-token context = 1.7 / 2.6 / 3.2 / 4.7 × verify(0) for k = 8 / 16 / 32 /
    64, and decoding with the output itself as the original runs 4.0 / 5.4 / 6.7 × plain for
    k = 16 / 32 / 64 (τ = k); with 3 edits in it 3.5 / 3.8 / 3.6 × (τ 13-14)."""

    def __init__(self, original: list[int], k: int = 32, max_n: int = 8):
        self.original, self.k, self.max_n = list(original), k, max_n
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram → every p with original[p-n:p] equal
        for n in range(1, max_n + 1):
            for p in range(n, len(original) + 1):
                self._ends.setdefault(tuple(original[p - n:p]), []).append(p)
        self._start: int | None = None  # where the output begins in seq
        self._last = (0, 1, 0)  # (len(seq), p, proposed) of the previous draft; p: the expected one
        self._rejected: set[int] = set()  # original positions whose draft token the target rejected

    def adaptive_k(self, **kw) -> AdaptiveK:
        """The draft length for generate(): starts at this drafter's k and may go back up to it,
        or down to 0 where drafting measures slower than plain (an answer that does not copy its
        region; drafting is tried again now and then); a lookup costs no draft step (c = 0)."""
        return AdaptiveK(self.k, 0, self.k, **{"c": 0.0, **kw})

    def propose(self, seq: list[int], k: int) -> Proposal:
        if self._start is None:
            self._start = len(seq) - 1
            self._last = (len(seq), 1, 0)
        k = min(k, self.k)
        n0, p0, kp = self._last
        got = seq[n0:]  # the previous draft's accepted tokens + the target's token
        n = next((i for i, (a, b) in enumerate(zip(got, self.original[p0:p0 + kp])) if a != b), None)
        if n is not None:
            self._rejected.add(p0 + n)
        self._last = (len(seq), p0 + len(got), 0)
        if k <= 0:
            return EMPTY
        expect = p0 + len(got)
        for n in range(min(self.max_n, len(seq) - self._start), 0, -1):
            ends = self._ends.get(tuple(seq[-n:]))
            if ends and n == 1 and (expect not in ends or len(seq) - self._start > 1):
                break  # one token is chance (an answer that copies nothing shares "(" or "self" with any
                # region, here or elsewhere): its drafts only cost verifies. Only the answer's first
                # token, where the region starts, is taken on its own
            if ends:
                # among matches of one n: one with tokens after it, then one whose draft does not run
                # into a rejected token (in a run x x x … y, re-proposing y after each extra x
                # gains one token per forward), then the nearest to the expected position
                p = min(ends, key=lambda e: (e == len(self.original),
                                             any(e <= q < e + k for q in self._rejected), abs(e - expect)))
                # re-aligned elsewhere on n tokens: 2^n at most (a chance match of a common pair,
                # "self.", would otherwise cost a verify of k rows: 33 rows = 5.5 steps natively)
                ids = self.original[p:p + (k if p == expect else min(k, 2 ** n))]
                self._last = (len(seq), p, len(ids))
                return Proposal(ids, None, "edit") if ids else EMPTY
        return EMPTY
