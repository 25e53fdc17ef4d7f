"""completer/engine/caches.py, the per-document KV cache: reuse and truncation give exactly the
from-scratch result, the byte budget is never exceeded, eviction is LRU, warmup prefills what the
request then reuses."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import random_llama
from helpers.engines import engine, random_pair

from completer.client import Chunk, EngineError, TextStop
from completer.engine.runner import common_prefix_len, forward_many
from completer.engine.runner_factory import make_runner

torch.set_num_threads(1)


def edit(seq: list, rng: random.Random, alphabet) -> list:
    """One random insert or delete anywhere (appends most often, as typing does)."""
    seq = list(seq)
    i = len(seq) if rng.random() < 0.4 else rng.randrange(len(seq) + 1)
    if rng.random() < 0.7 or len(seq) < 8:
        seq[i:i] = [rng.choice(alphabet) for _ in range(rng.randint(1, 4))]
    else:
        del seq[i:i + rng.randint(1, 4)]
    return seq


def test_batched_forward_matches_serial():
    model = random_llama(64, 2, 3)
    runners = [make_runner(model, 128) for _ in range(3)]
    refs = [make_runner(model, 128) for _ in range(3)]
    rng = random.Random(0)
    for r, ref in zip(runners, refs):  # different cache lengths per sequence
        ids = [rng.randrange(64) for _ in range(rng.randint(1, 20))]
        r.forward(ids)
        ref.forward(ids)
    for _ in range(3):
        feeds = [[rng.randrange(64) for _ in range(rng.randint(1, 5))] for _ in runners]
        outs = forward_many(runners, feeds)
        for r, ref, f, o in zip(runners, refs, feeds, outs):
            torch.testing.assert_close(o, ref.forward(f))
            assert r.ids == ref.ids


def test_reused_cache_equals_scratch_across_random_edits(tok):
    pair = random_pair(tok)
    e, fresh = engine(pair), engine(pair)
    rng = random.Random(1)
    alphabet = list(range(3, tok.get_vocab_size()))
    prompt = [rng.choice(alphabet) for _ in range(60)]
    reused = 0
    for step in range(12):
        prompt = edit(prompt, rng, alphabet)[:200]
        cached = list(e.caches["doc"].target.ids) if "doc" in e.caches else []
        ids, st = e.complete_ids(prompt, doc_key="doc")
        ref, rst = fresh.complete_ids(prompt, doc_key=f"scratch{step}")
        assert ids == ref
        assert rst.prefill_tokens == len(prompt)
        reused += st.prompt_tokens - st.prefill_tokens
        # an edit keeps the cache up to the first changed token, not zero
        assert st.prefill_tokens == len(prompt) - min(common_prefix_len(cached, prompt), len(prompt) - 1)
    assert reused > 0 and e.counters["cache_hits"] > 0


def test_text_edits_truncate_at_first_change(tok):
    pair = random_pair(tok, seed=5)
    e, fresh = engine(pair), engine(pair)
    rng = random.Random(2)
    text = "import os\n\n\ndef parse(path):\n    with open(path) as f:\n        return f.read()\n" * 3
    cursor = len(text) // 2
    for step in range(10):
        if rng.random() < 0.3:  # an edit early in the file
            i = rng.randrange(cursor)
            text = text[:i] + rng.choice("xyz_ ") + text[i:]
            cursor += 1
        else:  # typing at the cursor
            text = text[:cursor] + rng.choice("abc(=") + text[cursor:]
            cursor += 1
        prefix, suffix = text[:cursor], text[cursor:]
        prompt = e.fim_prompt(prefix, suffix)
        cached = list(e.caches["f"].target.ids) if "f" in e.caches else []
        c = e.complete(prefix, suffix, doc_key="f")
        ref = fresh.complete(prefix, suffix, doc_key=f"s{step}")
        assert c.token_ids == ref.token_ids
        assert c.prefill_tokens == len(prompt) - min(common_prefix_len(cached, prompt), len(prompt) - 1)


def test_budget_never_exceeded_and_lru(tok):
    pair = random_pair(tok)
    probe = engine(pair)
    budget_mb = 3.5 * probe.cache_bytes / 2**20  # room for three documents' caches
    e = engine(pair, kv_budget_mb=budget_mb, max_new_tokens=2)
    rng = random.Random(3)
    lru: list[str] = []
    for _ in range(30):
        doc = f"d{rng.randrange(6)}"
        e.complete_ids([rng.randrange(3, 300) for _ in range(rng.randint(5, 40))], doc_key=doc)
        if doc in lru:
            lru.remove(doc)
        lru.append(doc)
        lru = lru[-3:]
        assert list(e.caches) == lru  # least recently used went first
        held = sum(r.reserved_bytes() for s in e.caches.values() for r in (s.target, s.draft))
        assert held <= e.budget and e.kv_bytes() <= e.budget
    assert e.counters["evictions"] > 0


def test_single_slot_over_budget_is_refused(tok):
    e = engine(random_pair(tok), kv_budget_mb=0.01)
    for _ in range(2):  # refused with a clear message, and the engine survives it
        with pytest.raises(EngineError, match="kv-budget-mb") as err:
            e.complete_ids([5, 6, 7], doc_key="big")
        assert err.value.code == "overloaded"
    assert not e.caches and e.sched.depth() == (0, 0)


def test_warmup_prefills_what_the_request_reuses(tok):
    pair = random_pair(tok, seed=7)
    e, fresh = engine(pair), engine(pair)
    prefix, suffix = "def area(r):\n    return 3.14 * r * r\n\n\ndef vol", "\n"
    computed = e.warmup(prefix, suffix, doc_key="w")
    prompt = e.fim_prompt(prefix, suffix)
    assert computed == len(prompt)
    assert e.warmup(prefix, suffix, doc_key="w") == 0  # already there
    c = e.complete(prefix + "u", suffix, doc_key="w")
    assert c.prefill_tokens <= 3  # only the typed character's tokens
    assert c.token_ids == fresh.complete(prefix + "u", suffix, doc_key="x").token_ids


def test_warmup_with_chunks_leaves_the_prompt_complete_reads(tok):
    """The same arguments give the same prompt: a warmup with chunks of other files fills the
    target's and the draft's caches with exactly what the completion then reads."""
    pair = random_pair(tok, seed=8)
    e, fresh = engine(pair), engine(pair)
    prefix, suffix = "def volume(r, h):\n    return area(", ")\n"
    extra = (Chunk("geo/shapes.py", "def area(r):\n    ..."),)
    prompt = e.fim_prompt(prefix, suffix, None, extra)
    assert prompt != e.fim_prompt(prefix, suffix) and len(prompt) > len(e.fim_prompt(prefix, suffix))
    assert e.warmup(prefix, suffix, doc_key="w", extra=extra) == len(prompt)
    assert e.caches["w"].target.ids == prompt and e.caches["w"].draft.ids == prompt
    c = e.complete(prefix, suffix, doc_key="w", extra=extra)
    assert c.prompt_tokens == len(prompt) and c.prefill_tokens <= 1
    assert c.token_ids == fresh.complete(prefix, suffix, doc_key="x", extra=extra).token_ids


def test_warmup_leaves_the_draft_while_the_document_decodes_plain(tok):
    """Where drafting measured slower than plain (the schedule chose plain decoding), warmup fills
    the target's cache only; the draft catches up when drafting is tried, and the ids are the
    same either way."""
    pair = random_pair(tok, seed=9)
    e, fresh = engine(pair), engine(pair)
    prefix, suffix = "def area(r):\n    return 3.14 * r * r\n\n\ndef vol", "\n"
    e.warmup("x = 1\n", "", doc_key="w")
    cache = e.caches["w"]
    cache.drafts.k.drafting = False
    assert not cache.drafts.active()
    prompt = e.fim_prompt(prefix, suffix)
    assert e.warmup(prefix, suffix, doc_key="w") == len(prompt) - common_prefix_len(prompt, e.fim_prompt("x = 1\n", ""))
    assert cache.target.ids == prompt and cache.draft.ids != prompt
    cache.drafts.k.drafting = True
    assert e.warmup(prefix, suffix, doc_key="w") == 0 and cache.draft.ids == prompt  # the draft caught up
    assert e.complete(prefix, suffix, doc_key="w").token_ids == fresh.complete(prefix, suffix, doc_key="x").token_ids


def test_draft_length_adapts_per_syntax_node_kind(tok):
    """Each kind of node the caller names keeps its own acceptance history; output is unchanged."""
    e = engine(random_pair(tok, seed=9), max_new_tokens=12)
    prefix = "def f(a, b):\n    return g(a"
    plain = e.complete(prefix, doc_key="k").token_ids
    for kind in ("argument_list", "block", "argument_list"):
        assert e.complete(prefix, doc_key="k", node_kind=kind).token_ids == plain
    drafts = e.caches["k"].drafts
    assert list(drafts.by_kind) == ["block", "argument_list"]  # most recently used last
    assert drafts.k_for("argument_list") is drafts.by_kind["argument_list"]
    assert drafts.k_for(None) is drafts.k


def test_the_stop_says_why(tok):
    """A client.TextStop's reason becomes the completion's stop_reason; a plain callable (a stop
    sequence) is "stop"."""
    e = engine(random_pair(tok, seed=3), max_new_tokens=12)

    class Syntax:
        reason = None

        def __call__(self, text):
            if len(text) >= 2:
                self.reason = "syntax"
                return 2
            return None

    assert isinstance(Syntax(), TextStop)
    c = e.complete("def f(x):\n    return ", "\n", doc_key="s", stop_text=Syntax())
    assert c.stop_reason == "syntax" and len(c.text) <= 2
    c = e.complete("def f(x):\n    return ", "\n", doc_key="p", stop_text=lambda t: 1 if t else None)
    assert c.stop_reason == "stop" and len(c.text) <= 1
