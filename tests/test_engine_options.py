"""Engine.reconfigure: every EngineConfig option either applies to the live engine from the next
request on (stats show it, and its effect is seen where one can be) or the schema marks it
reload (it needs new models or runners: a new Engine)."""
from __future__ import annotations

import math
from dataclasses import fields

import pytest
from helpers.engines import engine, random_pair

from completer.client import EngineError
from completer.config import OPTIONS, EngineConfig
from completer.engine.engine import LIVE_OPTIONS
from completer.engine.sampling import Sampling

PREFIX, SUFFIX = "def area(r):\n    return 3.14 * r * r\n\n\ndef volume(r, h):\n    return ", "\n"


def check_max_new_tokens(e, v):
    assert e.complete(PREFIX, SUFFIX, doc_key="n").new_tokens <= v


def check_sampling(e, _):
    assert e.sampling == Sampling(e.cfg.temperature, e.cfg.top_p)


def check_seed(e, v):
    """A new seed reseeds the sampler: the same seed gives the same sample again, another seed
    another one, and none of it is the greedy answer."""
    greedy = e.complete(PREFIX, SUFFIX, doc_key="s").token_ids
    e.reconfigure(temperature=3.0)
    prompt = e.fim_prompt(PREFIX, SUFFIX, None, ())
    runs = {}
    for i, seed in enumerate((v, v + 1, v)):
        e.reconfigure(seed=seed)
        # plain decoding: with drafts, how many draws a round takes follows the draft length a new
        # document inherits from the last one used (the same seed gave another sample 1 run in 3)
        runs.setdefault(seed, []).append(e.complete_ids(prompt, doc_key=f"s{i}", drafter="none")[0])
    assert runs[v][0] == runs[v][1] and runs[v][0] != runs[v + 1][0]
    assert greedy not in (runs[v][0], runs[v + 1][0])
    e.reconfigure(temperature=0.0)


def check_draft_lengths(e, _):
    """Documents cached before the change take the new bound; a new one starts at draft_len."""
    e.complete(PREFIX, SUFFIX, doc_key="old")
    e.reconfigure(draft_len=1, max_draft_len=1)
    assert e.caches["old"].drafts.k.k_max == 1
    for doc in ("old", "new"):
        c = e.complete(PREFIX, SUFFIX, doc_key=doc)
        assert c.extra["proposed"] <= c.target_forwards  # one draft token per verify at most


def check_kv_budget(e, _):
    """A smaller budget evicts idle documents down to it at once, least recently used first."""
    for doc in ("a", "b", "c"):
        e.complete(PREFIX, SUFFIX, doc_key=doc, max_new=1)
    evicted = e.counters["evictions"]
    e.reconfigure(kv_budget_mb=1.5 * e.cache_bytes / 2**20)
    assert list(e.caches) == ["c"] and e.kv_bytes() <= e.budget
    assert e.counters["evictions"] == evicted + 2


def check_scheduler(e, _):
    s, b = e.sched.cfg, e.sched.batcher
    assert (s.max_batch, s.batch_wait_ms, s.max_queue, s.step_tokens) == \
        (e.cfg.max_batch, e.cfg.batch_wait_ms, e.cfg.max_queue, e.cfg.batch_step_tokens)
    assert (b.max_batch, b.wait_s, b.step_tokens) == (e.cfg.max_batch, e.cfg.batch_wait_ms / 1e3,
                                                      e.cfg.batch_step_tokens)


def check_warmup_chunk(e, v):
    calls = []
    real = e.sched.batcher.forward
    e.sched.batcher.forward = lambda runner, ids: calls.append(len(ids)) or real(runner, ids)
    n = e.warmup(PREFIX, SUFFIX, doc_key="w")
    e.sched.batcher.forward = real
    assert max(calls) <= v and len(calls) == 2 * math.ceil(n / v)  # target and draft


def check_type_through(e, v):
    first = e.complete(PREFIX, SUFFIX, doc_key="t")
    c = e.complete(PREFIX + first.text[:1], SUFFIX, doc_key="t")
    assert (c.stop_reason == "type_through") == v


def check_prefetch(e, v):
    """On: once a completion is shown its continuation is computed, and asking after it is served from it."""
    first = e.complete(PREFIX, SUFFIX, doc_key="p")
    assert first.text
    rec = e.prefetches.get("p")
    with rec.cond:
        assert rec.cond.wait_for(lambda: rec.done, timeout=120)
    assert e.complete(PREFIX + first.text, SUFFIX, doc_key="p").prefetched == v


def check_alternatives(e, v):
    """From the next request on, a completion comes with up to v - 1 others to cycle."""
    assert 1 <= len(e.complete(PREFIX, SUFFIX, doc_key="alt").alternatives) <= v - 1


def check_min_confidence(e, v):
    """A floor of probability 1 refuses every token: nothing is shown, and the gate says so."""
    c = e.complete(PREFIX, SUFFIX, doc_key="c")
    assert v == 1.0 and c.text == "" and c.stop_reason == "unsure" and c.unsure_text


def check_next_edit_min_confidence(e, v):
    """Likewise for next edits: the model's rewrite is refused at its first token."""
    from completer.edits.formats import EditPrompt, HistoryItem

    req = EditPrompt((HistoryItem("a.py", "x = 1\n", "y = 1\n"),), "a.py", "y = 1\nprint(x)\n")
    c = e.rewrite(req, fmt="completer", doc_key="ne", max_new=4)
    assert v == 1.0 and c.text == "" and c.stop_reason == "unsure" and c.unsure_text


# option → (a new value, what shows it applied); values differ from engine()'s
LIVE = {
    "draft_len": (1, check_draft_lengths),
    "max_draft_len": (6, check_draft_lengths),
    "max_new_tokens": (3, check_max_new_tokens),
    "temperature": (0.5, check_sampling),
    "top_p": (0.5, check_sampling),
    "kv_budget_mb": (64.0, check_kv_budget),
    "seed": (7, check_seed),
    "max_batch": (1, check_scheduler),
    "batch_wait_ms": (5.0, check_scheduler),
    "max_queue": (3, check_scheduler),
    "batch_step_tokens": (0, check_scheduler),
    "warmup_chunk": (8, check_warmup_chunk),
    "type_through": (True, check_type_through),
    "prefetch": (True, check_prefetch),
    "alternatives": (3, check_alternatives),
    "min_confidence": (1.0, check_min_confidence),
    "next_edit_min_confidence": (1.0, check_next_edit_min_confidence),
}


@pytest.mark.parametrize("name", [f.name for f in fields(EngineConfig)])
def test_every_option_applies_live_or_is_marked_reload(tok, name):
    reload = OPTIONS[name].meta["reload"]
    assert (name in LIVE_OPTIONS) == (not reload)
    e = engine(random_pair(tok))
    if reload:
        before = e.stats()["config"][name]
        e.reconfigure(**{name: before})  # the caller builds a new Engine for it: not applied here
        assert name not in LIVE, f"{name} is marked reload but has a live check"
        return
    assert name in LIVE, f"{name} applies live but nothing shows it"
    value, check = LIVE[name]
    assert e.stats()["config"][name] != value
    e.reconfigure(**{name: value})
    assert e.stats()["config"][name] == value
    check(e, value)


def test_a_bad_value_changes_nothing_and_other_scopes_are_not_the_engines(tok):
    e = engine(random_pair(tok))
    before = e.stats()["config"]
    with pytest.raises(EngineError) as err:
        e.reconfigure(temperature=0.5, top_p=0.0)  # top_p must be > 0
    assert err.value.code == "bad_request" and e.stats()["config"] == before and e.sampling == Sampling()
    e.reconfigure(debounce_ms=10, engine_timeout_ms=500, max_lines=3)  # the LSP's and client's
    assert e.stats()["config"] == before


def test_draft_quant_stores_the_draft_after_restricting_its_head():
    """draft_quant (after the head is restricted to the frequent tokens, which needs the dense
    head): fp16 proposes exactly the float32 draft's tokens (its bf16 values survive fp16); auto
    is int8 where the native step runs (a step inside a core's L2), else fp16; int8 and int4
    store the products quantized and still propose valid tokens (a draft's precision moves
    acceptance, never the output: test_speculative's exactness holds for any draft)."""
    import torch

    from completer.engine.engine import Engine
    from completer.engine.native_lib import library
    from completer.engine.quant import Fp16Weight
    from completer.engine.runner_factory import make_runner

    e = {q: Engine(EngineConfig(draft_quant=q, device="cpu")) for q in ("auto", "none", "fp16", "int8", "int4")}
    native = library()[0] is not None
    assert {q: x.stats()["draft_stored"] for q, x in e.items()} == {
        "auto": "int8" if native else "fp16", "none": "none", "fp16": "fp16", "int8": "int8", "int4": "int4"}
    df, dn = e["fp16"].pair.draft, e["none"].pair.draft
    assert isinstance(df.lm_head, Fp16Weight) and isinstance(df.layers[0][4], Fp16Weight)
    assert isinstance(dn.lm_head, torch.Tensor) and df.head_rows == dn.head_rows
    assert len(df.head_rows) == e["fp16"].cfg.draft_vocab
    ids = e["fp16"].tok.encode(PREFIX).ids
    rf, rn = make_runner(df, 256), make_runner(dn, 256)
    if hasattr(rf, "greedy"):  # the native step: a proposal is one call
        assert rf.greedy(ids, 8) == rn.greedy(ids, 8)
    else:
        assert torch.equal(rf.forward(ids).argmax(-1), rn.forward(ids).argmax(-1))
    for q in ("int8", "int4"):
        d = e[q].pair.draft
        assert not isinstance(d.lm_head, (torch.Tensor, Fp16Weight)) and d.head_rows == dn.head_rows
        r = make_runner(d, 256)
        got = r.greedy(ids, 8) if hasattr(r, "greedy") else r.forward(ids).argmax(-1).tolist()
        assert all(t in set(d.head_rows) for t in got)  # the restricted head's tokens only
        c = e[q].complete(PREFIX, SUFFIX, doc_key="q")
        assert c.text == e["none"].complete(PREFIX, SUFFIX, doc_key="q").text  # the target decides
