"""The next completion before Tab (Engine._prefetch): once a completion is shown and the engine is
idle, the engine completes as if the user accepted it, so that accepting and asking again is
answered without a model call — the same text the model would give then, cut by that request's
own stop rule; any other request for the document drops it; it waits while interactive work
runs. Driven by events, never by timing."""
from __future__ import annotations

from helpers.engines import engine, random_pair

from completer.engine.scheduler import INTERACTIVE

PREFIX, SUFFIX = "def total(items):\n    s = 0\n    for x in items:\n        ", "\n    return s\n"


def _done(e, doc: str):
    """The document's prefetch once finished (waits on its record's condition, not on a clock)."""
    with e.sched.cond:
        rec = e.prefetches.get(doc)
    assert rec is not None, "no prefetch was started"
    with rec.cond:
        assert rec.cond.wait_for(lambda: rec.done, timeout=120)
    return rec


def test_accepting_and_asking_again_is_served_from_the_prefetch(tok):
    pair = random_pair(tok)
    e, fresh = engine(pair, prefetch=True, max_new_tokens=6), engine(pair, max_new_tokens=6)
    shown = e.complete(PREFIX, SUFFIX, doc_key="a.py")
    assert shown.text and not shown.prefetched
    rec = _done(e, "a.py")
    assert rec.ok and rec.prefix == PREFIX + shown.text

    deltas: list[str] = []
    nxt = e.complete(PREFIX + shown.text, SUFFIX, doc_key="a.py", on_text=deltas.append)
    want = fresh.complete(PREFIX + shown.text, SUFFIX, doc_key="a.py")
    assert nxt.prefetched and not nxt.type_through and nxt.text == want.text
    assert "".join(deltas) == nxt.text
    assert (nxt.new_tokens, nxt.target_forwards) == (0, 0)  # no model call at request time
    st = e.stats()
    assert st["prefetch_served"] == 1 and st["prefetches"] >= 1
    # the chain goes on: the served text is shown, so its own continuation is prefetched next
    assert _done(e, "a.py").prefix == PREFIX + shown.text + nxt.text


def test_the_requests_own_stop_rule_cuts_the_prefetched_text(tok):
    e = engine(random_pair(tok), prefetch=True, max_new_tokens=6)
    shown = e.complete(PREFIX, SUFFIX, doc_key="b.py")
    full = _done(e, "b.py").text
    assert len(full) > 1
    c = e.complete(PREFIX + shown.text, SUFFIX, doc_key="b.py", stop_text=lambda t: 1 if len(t) >= 1 else None)
    assert c.prefetched and c.text == full[:1] and c.stop_reason == "stop"


def test_another_edit_drops_the_prefetch_and_generates(tok):
    pair = random_pair(tok)
    e, fresh = engine(pair, prefetch=True, max_new_tokens=6), engine(pair, max_new_tokens=6)
    e.complete(PREFIX, SUFFIX, doc_key="c.py")
    _done(e, "c.py")
    other = PREFIX + "y = "
    c = e.complete(other, SUFFIX, doc_key="c.py")
    assert not c.prefetched and c.text == fresh.complete(other, SUFFIX, doc_key="c.py").text
    assert e.stats()["prefetch_served"] == 0
    with e.sched.cond:  # the new completion's own continuation replaced the stale one
        rec = e.prefetches.get("c.py")
    assert rec is None or rec.prefix == other + c.text


def test_a_prefetch_waits_while_interactive_work_runs(tok):
    e = engine(random_pair(tok), prefetch=True, max_new_tokens=6)
    busy = e.sched.acquire("someone-else.py", INTERACTIVE)  # a request running for another document
    try:
        shown = e.complete(PREFIX, SUFFIX, doc_key="d.py")
        with e.sched.cond:  # the prefetch queues behind it (warmup priority) and computes nothing
            assert e.sched.cond.wait_for(lambda: any(t.doc == "d.py" for t in e.sched.waiting), timeout=120)
            rec = e.prefetches.get("d.py")
        assert rec is not None and not rec.done and rec.text == ""
    finally:
        e.sched.release(busy)
    rec = _done(e, "d.py")
    assert rec.ok and rec.prefix == PREFIX + shown.text and rec.text


def test_a_warmup_on_the_prefetchs_way_is_left_to_it(tok):
    e = engine(random_pair(tok), prefetch=True, max_new_tokens=6)
    shown = e.complete(PREFIX, SUFFIX, doc_key="e.py")
    _done(e, "e.py")
    assert e.warmup(PREFIX + shown.text, SUFFIX, doc_key="e.py") == 0
    assert e.warmup(PREFIX + shown.text[:1], SUFFIX, doc_key="e.py") == 0  # typing through it
    assert e.warmup(PREFIX + "zz", SUFFIX, doc_key="e.py") > 0  # elsewhere: a real warmup


def test_off_by_option(tok):
    e = engine(random_pair(tok), prefetch=False)
    e.complete(PREFIX, SUFFIX, doc_key="f.py")
    assert e.prefetches.get("f.py") is None and e.stats()["prefetches"] == 0


def test_closing_the_document_while_its_prefetch_waits_frees_its_cache(tok):
    """A forget that lands while the document's prefetch waits for (or holds) its ticket: the
    prefetch, which re-creates the document's cache when it runs, drops it when it ends."""
    e = engine(random_pair(tok), prefetch=True, max_new_tokens=6)
    busy = e.sched.acquire("someone-else.py", INTERACTIVE)
    try:
        e.complete(PREFIX, SUFFIX, doc_key="g.py")
        with e.sched.cond:
            assert e.sched.cond.wait_for(lambda: any(t.doc == "g.py" for t in e.sched.waiting), timeout=120)
            rec = e.prefetches.get("g.py")
        e.forget("g.py")
        assert "g.py" not in e.caches and rec.forgotten
    finally:
        e.sched.release(busy)
    with rec.cond:
        assert rec.cond.wait_for(lambda: rec.done, timeout=120)
    with e.sched.cond:  # its cache was made again for it and goes when it ends (not at LRU eviction)
        assert e.sched.cond.wait_for(lambda: "g.py" not in e.caches, timeout=120)
