"""The draft length of speculative decoding (AdaptiveK): how many tokens to draft next, and
whether to draft at all, from acceptance history and measured round times. Used by the loop
(speculative.py), kept per document (caches.py)."""
from __future__ import annotations

import time
from collections.abc import Callable


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
