"""EditDrafter (speculative edits) is exact: greedy ids equal plain greedy decoding whatever the
original is — the expected output itself, the output with a few tokens changed, inserted or
deleted, or unrelated text — and it drafts long while the output copies and re-aligns after a
divergence."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import random_llama

from completer.engine.drafters import EditDrafter
from completer.engine.runner_factory import make_runner
from completer.engine.sampling import Sampling
from completer.engine.speculative import generate

torch.set_num_threads(1)
N = 80  # new tokens per generation


def decode(target, prompt, drafter=None):
    """(ids, stats, tokens gained per step) of a greedy generation, plain when drafter is None."""
    steps: list[int] = []
    k = drafter.adaptive_k() if drafter is not None else None
    out, st = generate(make_runner(target), prompt, N, Sampling(), drafter, k, on_tokens=lambda ids: steps.append(len(ids)))
    return out, st, steps


def edited(ref: list[int], kind: str, at: int) -> list[int]:
    o = list(ref)
    if kind == "change":
        o[at] = o[at] % 63 + 1
    elif kind == "insert":
        o[at:at] = [o[at] % 63 + 1, o[at] % 61 + 2]
    else:
        del o[at:at + 2]
    return o


@pytest.fixture(scope="module", params=range(4))
def case(request):
    seed = request.param
    target = random_llama(64, 2, seed=40 + seed)
    rng = random.Random(seed)
    prompt = [rng.randrange(1, 64) for _ in range(rng.randint(1, 20))]
    return target, prompt, decode(target, prompt)[0]


def test_exact_original_is_drafted_long(case):
    target, prompt, ref = case
    d = EditDrafter(ref)
    out, st, steps = decode(target, prompt, d)
    assert out == ref
    assert st.accepted_per_forward >= 8, steps  # k = 32: 80 tokens in 4 forwards
    assert max(steps) == d.k + 1


@pytest.mark.parametrize("kind", ["change", "insert", "delete"])
def test_edited_original_is_exact_and_realigns(case, kind):
    target, prompt, ref = case
    at = 30
    out, _, steps = decode(target, prompt, EditDrafter(edited(ref, kind, at)))
    assert out == ref
    ends = [sum(steps[:i + 1]) for i in range(len(steps))]
    assert ends[1] >= at  # the copy ran up to the edit in one draft
    after = [n for n, e in zip(steps, ends) if e - n > at]  # steps that start past the edit
    assert max(after) >= 5, steps  # acceptance resumes: ≥ 4 drafts accepted in one forward


def test_unrelated_original_is_exact(case):
    target, prompt, ref = case
    rng = random.Random(len(prompt))
    for _ in range(2):
        original = [rng.randrange(1, 64) for _ in range(rng.randint(0, 60))]
        out, _, _ = decode(target, prompt, EditDrafter(original, k=rng.choice([1, 8, 32])))
        assert out == ref


def test_randomly_edited_original_is_exact(case):
    target, prompt, ref = case
    rng = random.Random(sum(prompt))
    for _ in range(3):
        original = list(ref)
        for _ in range(rng.randint(1, 4)):
            original = edited(original, rng.choice(["change", "insert", "delete"]), rng.randrange(len(original) - 2))
        out, _, _ = decode(target, prompt, EditDrafter(original, k=rng.choice([4, 16, 32, 64])))
        assert out == ref


def test_realigns_after_each_kind_of_edit():
    """One drafter per generation: the first call's sequence is the prompt + the output's first
    token; the prompt (90, 91, 1 here) is never matched."""
    orig = list(range(1, 60))
    pr = [90, 91, 1]
    for out, ids in [([1], [2, 3, 4, 5, 6]),                  # copying from the start
                     ([2], []),                               # the first token changed: one token
                     ([2, 3], [4, 5, 6, 7]),                  # matching elsewhere is chance, two align
                     ([2, 3, 4], [5, 6, 7, 8, 9]),            # (2^n tokens on n, then in step: all k)
                     ([1, 2, 3, 99], []),                     # 99: nowhere in the original
                     ([1, 2, 3, 99, 5, 6], [7, 8, 9, 10, 11]),  # changed
                     ([1, 2, 3, 99, 4, 5], [6, 7, 8, 9]),       # inserted
                     ([1, 2, 3, 7, 8], [9, 10, 11, 12])]:       # deleted
        d = EditDrafter(orig, k=5)
        for i in range(1, len(out) + 1):
            p = d.propose(pr + out[:i], 8)
        assert p.ids == ids, out
    d = EditDrafter(orig, k=5)
    assert d.propose(pr, 8).ids == [2, 3, 4, 5, 6]
    assert d.propose(pr + [2, 3, 4, 5, 6, 7, 8], 8).ids == [9, 10, 11, 12, 13]  # after an accepted draft
    assert d.propose(pr + [2, 3, 4, 5, 6, 7, 8, 9, 10, 50], 3).ids == []  # a jump: one token is chance,
    assert d.propose(pr + [2, 3, 4, 5, 6, 7, 8, 9, 10, 50, 51], 3).ids == [52, 53, 54]  # two re-align
    assert EditDrafter([]).propose([1, 2], 4).ids == []
