"""The speculative loop is lossless: greedy output equals the target's own greedy decoding for
every drafter, and sampling keeps the target's distribution."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import random_llama

from completer.engine.drafters import (
    AdaptiveK,
    CombinedDrafter,
    Drafter,
    FastPathDrafter,
    ModelDrafter,
    NgramDrafter,
)
from completer.engine.runner import HFRunner, LlamaWeights
from completer.engine.runner_factory import make_runner
from completer.engine.sampling import Proposal, Sampling, verify, warp
from completer.engine.speculative import UNTIMED_ROUNDS, generate

torch.set_num_threads(1)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


class AlwaysWrong(Drafter):
    """A drafter that always proposes a token the target will not pick."""

    def __init__(self, target):
        self.target = target

    def propose(self, seq, k):
        with torch.no_grad():
            nxt = int(self.target(torch.tensor([seq])).logits[0, -1].argmin())
        return Proposal([nxt] * k, None, "wrong")


PAIRS = [(64, 2, 32, 1), (48, 3, 48, 1)]  # (target hidden, layers, draft hidden, layers)


def lean(model):
    return make_runner(model)


@pytest.mark.parametrize("pair", range(len(PAIRS)))
@pytest.mark.parametrize("runner", [lean, HFRunner])
def test_greedy_equals_target_greedy(pair, runner):
    th, tl, dh, dl = PAIRS[pair]
    target = random_llama(th, tl, seed=10 + pair)
    draft = random_llama(dh, dl, seed=20 + pair)
    table = {(a, b): (a * 7 + b) % 63 + 1 for a in range(64) for b in range(0, 64, 3)}
    rng = random.Random(pair)
    for trial in range(3):
        # repetitive prompts give the n-gram drafter matches; random ones exercise misses
        base = [rng.randrange(1, 64) for _ in range(rng.randint(1, 12))]
        prompt = (base * rng.randint(1, 4))[: rng.randint(1, 40)]
        ref = hf_greedy(target, prompt, 16)
        for k in range(1, 9):
            drafters = {
                "model": ModelDrafter(runner(draft), Sampling()),
                "ngram": NgramDrafter(),
                "fastpath": FastPathDrafter(table),
                "combined": CombinedDrafter(ModelDrafter(runner(draft), Sampling()), NgramDrafter(),
                                            FastPathDrafter(table), 64),
                "wrong": AlwaysWrong(target),
                "none": None,
            }
            for name, d in drafters.items():
                out, st = generate(runner(target), prompt, 16, Sampling(), d, AdaptiveK(k, 1, k))
                assert out == ref, (name, k, trial)
                if name == "wrong":
                    assert st.accepted == 0


def restricted(model, rows):
    """A draft runner whose LM head scores only `rows` (what the engine does to the draft); a
    float32 model gets the engine's NumPy draft runner."""
    w = LlamaWeights.from_hf(model)
    w.restrict_head(rows)
    return make_runner(w)


def test_restricted_draft_head_is_lossless():
    """A draft scoring a subset of the vocabulary proposes only those ids, mapped back to
    vocabulary ids; greedy output is still exactly the target's."""
    target = random_llama(64, 2, seed=31)
    drafts = [random_llama(32, 1, seed=32), random_llama(32, 1, seed=32, dtype=torch.float32)]
    rows = list(range(63, 0, -2))  # odd ids, in an order unlike the vocabulary's
    rng = random.Random(3)
    for trial in range(4):
        prompt = [rng.randrange(1, 64) for _ in range(rng.randint(1, 20))]
        ref = hf_greedy(target, prompt, 16)
        for k in (1, 3, 8):
            d = ModelDrafter(restricted(drafts[trial % 2], rows), Sampling())
            assert set(d.propose(prompt, k).ids) <= set(rows)
            out, _ = generate(lean(target), prompt, 16, Sampling(), d, AdaptiveK(k, 1, k))
            assert out == ref, (trial, k)


def test_greedy_at_context_limit():
    target = random_llama(32, 1, seed=3, ctx=48)
    draft = random_llama(32, 1, seed=4, ctx=48)
    prompt = list(range(1, 41))
    out, st = generate(lean(target), prompt, 30, Sampling(),
                       ModelDrafter(lean(draft), Sampling()), AdaptiveK(8, 1, 8))
    assert st.stop_reason == "context"
    assert out == hf_greedy(target, prompt, len(out))
    assert len(prompt) + len(out) == 48 + 1  # the last token is produced but never consumed


def test_eos_stops_and_is_excluded():
    target = random_llama(32, 1, seed=5)
    prompt = [3, 4, 5]
    ref = hf_greedy(target, prompt, 20)
    eos = ref[5]
    out, st = generate(lean(target), prompt, 20, Sampling(), NgramDrafter(), AdaptiveK(4),
                       eos_ids=frozenset({eos}))
    assert out == ref[: ref.index(eos)] and st.stop_reason == "eos"


def test_cancel_stops_between_steps():
    import threading

    target = random_llama(32, 1, seed=6)
    ev = threading.Event()
    seen = []

    def on_tokens(ids):
        seen.extend(ids)
        ev.set()  # cancel after the first step

    out, st = generate(lean(target), [1, 2, 3], 50, Sampling(), None, None,
                       cancel=ev, on_tokens=on_tokens)
    assert st.stop_reason == "cancelled" and len(out) == 1 and seen == out


@pytest.mark.parametrize("head_rows", [None, [5, 0, 2, 3]])
def test_rejection_sampling_keeps_target_distribution(head_rows):
    """Chi-square on the first two generated tokens of a 6-token-vocabulary target, with a draft
    that disagrees on purpose (and, second case, can only propose 4 of the 6 tokens): the joint
    law must match the target's (exact enumeration)."""
    V = 6
    target = random_llama(32, 1, seed=7, vocab=V, heads=2, kv_heads=2)
    draft = random_llama(32, 1, seed=8, vocab=V, heads=2, kv_heads=2)
    draft32 = random_llama(32, 1, seed=8, vocab=V, heads=2, kv_heads=2, dtype=torch.float32)
    s = Sampling(temperature=1.0, top_p=1.0)
    prompt = [1, 2, 3]
    with torch.no_grad():
        p1 = warp(target(torch.tensor([prompt])).logits[0, -1].float(), s)
        exp = torch.zeros(V, V)
        for a in range(V):
            p2 = warp(target(torch.tensor([prompt + [a]])).logits[0, -1].float(), s)
            exp[a] = p1[a] * p2
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V, V)
    n = 4000
    for _ in range(n):
        dr = lean(draft) if head_rows is None else restricted(draft32, head_rows)  # NumPy runner
        out, _ = generate(lean(target), prompt, 2, s,
                          ModelDrafter(dr, s, gen), AdaptiveK(3, 3, 3), gen=gen)
        counts[out[0], out[1]] += 1
    e = exp.flatten() * n
    keep = e >= 5  # chi-square validity: expected counts ≥ 5
    chi2 = float((((counts.flatten() - e) ** 2) / e)[keep].sum())
    dof = int(keep.sum()) - 1
    # 99.9th percentile of chi-square (Wilson–Hilferty); fixed seed, so this is deterministic
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert chi2 < crit, (chi2, crit, dof)


def test_verify_sampling_accepts_identical_draft():
    """When the draft's distribution equals the target's, every proposal is accepted."""
    logits = torch.randn(4, 10)
    s = Sampling(temperature=1.0)
    q = warp(logits[:3], s)
    gen = torch.Generator().manual_seed(0)
    ids = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(3)]
    n, _ = verify(logits, Proposal(ids, q, "same"), s, gen)
    assert n == 3


def test_top_p_warp_keeps_smallest_head():
    p = warp(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), Sampling(1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


def test_adaptive_k_follows_acceptance_and_cost():
    """Drafts that are always accepted grow k to its maximum; drafts rejected at once shrink it
    to its minimum; a costlier draft (larger c) settles on a shorter k for the same history."""
    good, bad = AdaptiveK(4, 1, 8), AdaptiveK(4, 1, 8)
    for _ in range(30):
        good.update(good.k, good.k)
        bad.update(bad.k, 0)
    assert good.k == 8 and bad.k == 1
    cheap, dear = AdaptiveK(4, 1, 8, c=0.02, beta=0.02), AdaptiveK(4, 1, 8, c=0.5, beta=0.1)
    for i in range(60):  # runs: half the drafts are right for 6 tokens, the rest for 1
        for k in (cheap, dear):
            k.update(8, 6 if i % 2 else 1)
    assert cheap.k > dear.k
    fork = cheap.fork()
    fork.update(8, 0)
    assert fork.prop != cheap.prop  # learns on its own


class FakeClock:
    """Seconds that pass only when the runners and drafters below say so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Timed:
    """A runner whose forwards cost 1 ms plus 0.1 ms per row past the first on `clock`."""

    def __init__(self, runner, clock: FakeClock):
        self.runner, self.clock = runner, clock

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def forward(self, ids):
        self.clock.now += 1e-3 + 1e-4 * (len(ids) - 1)
        return self.runner.forward(ids)


class Oracle(Drafter):
    """Proposes the target's own greedy continuation (always accepted) at `cost` seconds a
    proposal: what a draft costs beyond its model step (catch-up, Python) made explicit."""

    def __init__(self, prompt: list[int], ref: list[int], clock: FakeClock, cost: float):
        self.n, self.ref, self.clock, self.cost, self.calls = len(prompt), ref, clock, cost, 0

    def propose(self, seq, k):
        self.calls += 1
        self.clock.now += self.cost
        return Proposal(self.ref[len(seq) - self.n:][:k], None, "oracle")


def test_adaptive_k_falls_to_plain_when_drafting_measures_slower_and_comes_back():
    """The model says drafts pay (cheap verifies), but drafting rounds measure 2 ms per emitted
    token against plain's 1: k falls to 0 after plain's first measurement, and tries of drafting
    (TRY_ROUNDS timed rounds at the model's k, after the switch's untimed one) come at doubling
    intervals; once a try measures drafting cheaper, drafting returns and holds, with a plain
    round now and then."""
    k = AdaptiveK(4, 0, 8, c=0.05, verify=[1.0] + [1.05] * 8)
    assert k.rate(1) > 1
    drafted = []
    for _ in range(300):
        drafted.append(k.k)
        k.update(k.k, 1, 4.0) if k.k else k.update(0, 0, 1.0)  # drafting: 2 tokens in 4 ms
    assert drafted[:2] == [4, 0] and k.k == 0 and k.ms_per_token(True) > k.ms_per_token(False)
    tries = [i for i in range(1, len(drafted)) if drafted[i] and not drafted[i - 1]]
    rounds = AdaptiveK.TRY_ROUNDS + 1  # a try: the switch, then the timed rounds
    assert all(all(n > 0 for n in drafted[i:i + rounds]) for i in tries), drafted
    assert sum(n > 0 for n in drafted) == 1 + rounds * len(tries)
    gaps = [b - a for a, b in zip([0] + tries, tries)]
    assert gaps[0] > AdaptiveK.PROBE_STEPS and gaps == sorted(gaps) and gaps[-1] > 3 * gaps[0], gaps
    drafted = []
    for _ in range(400):  # drafting now costs 0.25 ms per token
        drafted.append(k.k)
        k.update(k.k, k.k, 0.25 * (k.k + 1)) if k.k else k.update(0, 0, 1.0)
    start = next(i for i, n in enumerate(drafted) if n)
    assert start < 260 and 0 < drafted[start:].count(0) < 0.1 * (400 - start), drafted
    assert k.ms_per_token(True) < k.ms_per_token(False)


def test_rounds_after_a_switch_are_timed_once_settled():
    """A target on several threads: after a switch of kind, rounds are not timed until
    `settle_ms` have passed (a plain round right after drafting costs more while an idle core
    wakes), so a try of plain lasts until it has a settled round: plain rounds that cost 3, 2,
    then 1 ms (steady) against drafting's 1.5 ms a token read as plain's 1 ms, and plain is
    chosen; without the settling the try timed its 2 ms round and drafting went on."""
    def run(settle_ms: float) -> tuple[AdaptiveK, list[int]]:
        k = AdaptiveK(4, 0, 8, c=0.05, verify=[1.0] + [1.05] * 8, settle_ms=settle_ms)
        kinds, since = [], 0
        for _ in range(60):
            kinds.append(k.k)
            if k.k:
                k.update(k.k, 1, 3.0)  # drafting: 2 tokens in 3 ms
                since = 0
            else:
                since += 1
                k.update(0, 0, max(4.0 - since, 1.0))  # plain after drafting: 3, 2, then 1 ms
        return k, kinds
    settled, kinds = run(AdaptiveK.SETTLE_MS)
    assert settled.k == 0 and settled.ms_per_token(False) == 1.0 < settled.ms_per_token(True), kinds
    eager, kinds = run(0.0)
    assert eager.k > 0 and eager.ms_per_token(False) == 2.0, kinds  # the round after the switch's


@pytest.mark.parametrize("cost_ms, plain", [(10.0, True), (0.1, False)])
def test_generate_drafts_only_where_it_measures_cheaper(cost_ms, plain):
    """generate() times each round on the schedule's clock (here a fake one the runner and the
    drafter advance): an always-right draft whose proposals cost 10 ms (9 tokens at best per
    ~11 ms round, plain 1 ms a token) is given up for plain decoding after its first rounds, one
    that costs 0.1 ms keeps drafting; greedy output equals plain decoding either way."""
    target = random_llama(48, 2, seed=41)
    prompt = [5, 9, 2, 7, 1, 3]
    ref = hf_greedy(target, prompt, 40)
    clock = FakeClock()
    drafter = Oracle(prompt, ref, clock, cost_ms * 1e-3)
    k = AdaptiveK(4, 0, 8, clock=clock)
    out, st = generate(Timed(lean(target), clock), prompt, 40, Sampling(), drafter, k)
    assert out == ref
    if plain:  # drafted: the untimed first rounds and one timed; then plain, no try yet (40 tokens)
        assert k.k == 0 and drafter.calls == UNTIMED_ROUNDS + 1 and st.target_forwards >= 18, st
    else:
        assert k.k > 0 and st.target_forwards <= 8, st


@pytest.mark.parametrize("runner", [lean, HFRunner])
def test_a_draft_catch_up_is_timed_apart_and_proposes_the_same(runner):
    """A draft left behind (plain rounds, a prompt its cache never saw) catches up in one forward
    timed apart (`take_catch_up_ms`, which generate() leaves out of the round's time); a round's
    few tokens are not a catch-up. Its proposal is the one a draft kept in step makes."""
    target, draft = random_llama(64, 2, seed=31), random_llama(32, 1, seed=32)
    seq = [random.Random(3).randrange(1, 64) for _ in range(60)]
    behind, in_step = ModelDrafter(runner(draft), Sampling()), ModelDrafter(runner(draft), Sampling())
    in_step.runner.forward(seq[:-1])
    assert behind.propose(seq, 4).ids == in_step.propose(seq, 4).ids
    assert behind.take_catch_up_ms() > 0 and behind.take_catch_up_ms() == 0.0
    assert in_step.take_catch_up_ms() == 0.0
    more = seq + behind.propose(seq, 4).ids[:2] + [5]  # two accepted + the target's token
    assert behind.propose(more, 4).ids == in_step.propose(more, 4).ids and behind.take_catch_up_ms() == 0.0
    comb = CombinedDrafter(ModelDrafter(runner(draft), Sampling()), NgramDrafter(), None, 64)
    ids, _ = generate(lean(target), seq, 12, Sampling(), comb, AdaptiveK(4, 0, 8))
    assert ids == hf_greedy(target, seq, 12) and comb.take_catch_up_ms() == 0.0  # generate took it


def test_tries_of_drafting_wait_until_plain_rounds_pay_for_their_catch_up():
    """Plain chosen, a try of drafting comes after its probe interval only once the plain rounds
    since the last try have cost TRY_SHARE⁻¹ times the last catch-up: a dear catch-up (a new
    document's prompt) makes tries rarer; a schedule learnt from it knows."""
    def tries(catch_up_ms: float) -> list[int]:
        k = AdaptiveK(4, 0, 8, c=0.05, verify=[1.0] + [1.05] * 8)
        k.update(4, 1, 4.0, catch_up_ms)  # drafting: 2 tokens in 4 ms (and what catching up cost)
        drafted = []
        for _ in range(400):
            drafted.append(k.k)
            k.update(k.k, 0, 4.0) if k.k else k.update(0, 0, 1.0)
        return [i for i in range(1, len(drafted)) if drafted[i] and not drafted[i - 1]]
    cheap, dear = tries(0.0), tries(10.0)
    assert cheap and dear and dear[0] >= 10 / AdaptiveK.TRY_SHARE / 1.0 > cheap[0] and len(dear) < len(cheap)
    k = AdaptiveK(4, 0, 8)
    k.update(4, 1, 4.0, 30.0)
    assert AdaptiveK(4, 0, 8).learnt_from(k).catch_up_ms == 30.0
