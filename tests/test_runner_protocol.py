"""Every runner and every wrapper implements runner.Runner, optional abilities included (a missing
ability is a declared None, never a missing attribute), and behaves as the protocol says: logits
per fed token over the vocabulary or `head_rows`, `sync` keeping the common prefix, `truncate`
as a pointer move, `greedy` (where offered) the argmax chain of `forward`, and a wrapper giving
its runner's answers."""
from __future__ import annotations

import pytest
import torch
from conftest import random_llama

from completer.engine.batch import StepBatcher, Via
from completer.engine.native_lib import native_or_none
from completer.engine.native_runner import NativeRunner
from completer.engine.np_runner import NumpyRunner
from completer.engine.runner import HFRunner, LlamaRunner, LlamaWeights, Runner

VOCAB, PROMPT = 96, [3, 17, 5, 40, 41, 9, 2, 77, 12, 30]


def _weights(rows: list[int] | None = None) -> LlamaWeights:
    w = LlamaWeights.from_hf(random_llama(32, 2, seed=4, vocab=VOCAB, ctx=64, dtype=torch.float32))
    if rows is not None:
        w.restrict_head(rows)
    return w


def _native(w: LlamaWeights):
    lib = native_or_none()
    if lib is None:
        pytest.skip("the native step is not built on this machine")
    return NativeRunner(w, lib, 64, kv_dtype=torch.float32)


KINDS = {
    "lean": lambda w: LlamaRunner(w, 64),
    "numpy": lambda w: NumpyRunner(w, 64),
    "native": _native,
    "hf": lambda w: HFRunner(random_llama(32, 2, seed=4, vocab=VOCAB, ctx=64, dtype=torch.float32), 64),
}
WRAPPERS = {
    "bare": lambda r: r,
    "via": lambda r: Via(r, StepBatcher()),
}


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [None, [5, 0, 2, 3, 40, 77]], ids=["full-head", "head-rows"])
def test_every_runner_and_wrapper_keeps_the_protocol(kind, wrap, rows):
    if kind == "hf" and rows is not None:
        pytest.skip("head_rows is a lean-weights ability (restrict_head)")
    r = WRAPPERS[wrap](KINDS[kind](_weights(rows)))
    assert isinstance(r, Runner)
    width = VOCAB if rows is None else len(rows)
    assert r.head_rows == rows and r.vocab_size == VOCAB and r.max_len == 64
    assert r.max_draft is None  # alone: no step to share

    assert r.sync(PROMPT) == PROMPT and r.ids == []
    logits = r.forward(PROMPT)
    assert logits.shape == (len(PROMPT), width) and logits.dtype == torch.float32
    assert r.ids == PROMPT and r.kv_bytes() > 0 and r.reserved_bytes() >= r.kv_bytes()

    # sync keeps the common prefix and leaves at least one token to feed
    assert r.sync(PROMPT[:6] + [50, 51]) == [50, 51] and r.ids == PROMPT[:6]
    assert r.sync(PROMPT[:6]) == [PROMPT[5]] and r.ids == PROMPT[:5]
    again = r.forward([PROMPT[5]])
    assert torch.allclose(again[0], logits[5], atol=1e-4)
    r.truncate(3)
    assert r.ids == PROMPT[:3]

    if r.greedy is None:
        return
    # greedy(new, k) is forward's argmax chain, each pick fed but the last
    r.truncate(0)
    picks = r.greedy(PROMPT, 4)
    assert len(picks) == 4 and r.ids == PROMPT + picks[:-1]
    r.truncate(0)
    chain, feed = [], PROMPT
    for _ in range(4):
        j = int(r.forward(feed)[-1].argmax())
        t = rows[j] if rows is not None else j
        chain.append(t)
        feed = [t]
    assert picks == chain


def test_a_wrapper_answers_as_its_runner_and_caps_drafts_under_load():
    w = _weights()
    bare, wrapped = LlamaRunner(w, 64), Via(LlamaRunner(w, 64), b := StepBatcher(step_tokens=12))
    assert torch.equal(bare.forward(PROMPT), wrapped.forward(PROMPT))
    assert wrapped.ids == bare.ids and wrapped.kv_bytes() == bare.kv_bytes()
    b.set_active(3)  # three generations share a 12-token step: each verifies its draft + 1
    assert wrapped.max_draft == 3
    b.set_active(1)
    assert wrapped.max_draft is None


def test_derived_forms_follow_the_weights():
    """A runner kind's form of the weights is built once and shared; restricting the head drops it
    (the next runner builds it over the new head)."""
    w = _weights()
    a, b = NumpyRunner(w, 64), NumpyRunner(w, 64)
    assert a.np is b.np
    w.restrict_head([1, 2, 3])
    c = NumpyRunner(w, 64)
    assert c.np is not a.np and c.forward(PROMPT).shape == (len(PROMPT), 3)
