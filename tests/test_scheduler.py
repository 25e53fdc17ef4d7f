"""Scheduling: one live generation per document (a burst leaves only the newest, the older stop
within one step), interactive before warmup, queueing and refusal, batched steps that give the
serial results, and server-side type-through."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers.engines import engine, random_pair

from completer.client import EngineError
from completer.engine.batch import StepBatcher
from completer.engine.scheduler import INTERACTIVE, Scheduler, SchedulerConfig

torch.set_num_threads(1)
PROMPT = list(range(10, 90))


def wait_until(cond, what: str) -> None:
    """Poll a condition another thread will make true (no timing assertion: a hang guard)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < 60, f"never happened: {what}"
        time.sleep(0.002)


def in_thread(fn, *a, **kw) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["out"] = fn(*a, **kw)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            box["err"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def test_burst_for_one_document_leaves_the_newest(tok):
    e = engine(random_pair(tok), drafter="none", max_new_tokens=40)
    steps: list[int] = []
    burst: dict = {}

    def on_tokens(ids):
        steps.append(len(ids))
        if len(steps) == 3:  # mid-generation: three newer requests for the same document
            for name in ("b", "c", "d"):
                burst[name] = in_thread(e.complete_ids, PROMPT[:50 + len(burst)], doc_key="doc")
                wait_until(lambda: e.sched.waiting_for("doc") == 1, "the newest request waits")
                assert e.sched.depth() == (1, 1)  # one live generation, one waiting request
            wait_until(lambda: not burst["b"][0].is_alive() and not burst["c"][0].is_alive(),
                       "superseded waiting requests return")

    _, st = e.complete_ids(PROMPT, doc_key="doc", on_tokens=on_tokens)
    assert st.stop_reason == "superseded"
    assert st.target_forwards == 2  # the step it was in when superseded was its last
    for name in ("b", "c"):
        out_ids, out_st = burst[name][1]["out"]
        assert out_ids == [] and out_st.stop_reason == "superseded"
    burst["d"][0].join()
    d_ids, d_st = burst["d"][1]["out"]
    assert d_st.stop_reason in ("length", "eos")
    assert d_ids == engine(random_pair(tok), drafter="none", max_new_tokens=40).complete_ids(
        PROMPT[:52], doc_key="x")[0]
    assert e.counters["superseded"] == 3


def test_caller_cancel_stops_within_one_step(tok):
    e = engine(random_pair(tok), drafter="model", max_new_tokens=40)
    cancel = threading.Event()
    calls = []

    def on_tokens(ids):
        calls.append(ids)
        if len(calls) == 2:
            cancel.set()

    _, st = e.complete_ids(PROMPT, doc_key="doc", cancel=cancel, on_tokens=on_tokens)
    assert st.stop_reason == "cancelled" and st.target_forwards == 1


def test_warmup_yields_to_interactive_requests(tok):
    e = engine(random_pair(tok), warmup_chunk=16)
    log: list[str] = []
    real = e.sched.batcher.forward
    started: dict = {}

    def doc_of(runner):
        return next(d for d, s in e.caches.items() if runner in (s.target, s.draft))

    def spy(runner, ids):
        doc = doc_of(runner)
        log.append(doc)
        if doc == "w" and "i" not in started:  # the first warmup chunk: a request arrives
            started["i"] = in_thread(e.complete_ids, PROMPT[:30], doc_key="i")
            wait_until(lambda: e.sched.depth()[1] == 2, "the request is admitted next to the warmup")
        return real(runner, ids)

    e.sched.batcher.forward = spy
    computed = e.prefill(PROMPT * 2, doc_key="w")
    started["i"][0].join()
    assert computed == len(PROMPT) * 2
    assert started["i"][1]["out"][1].stop_reason in ("length", "eos")
    assert e.counters["warmup_preempted"] >= 1
    last_i = len(log) - 1 - log[::-1].index("i")
    # after its first chunk (target and draft), the warmup waited for the whole request
    assert log[0] == "w" and log[:last_i].count("w") == 2
    assert e.sched.depth() == (0, 0)


def test_a_hold_keeps_warmups_waiting_and_pauses_a_running_one(tok):
    """Interactive work outside the engine (the language server's next-edit follower) holds it:
    a warmup that arrives waits, and a running one stops at its next chunk until the hold ends."""
    e = engine(random_pair(tok), warmup_chunk=16)
    log: list[str] = []
    real = e.sched.batcher.forward
    hold = e.hold_warmup()
    held = threading.Event()

    def spy(runner, ids):
        log.append("chunk")
        if not held.is_set():  # during the first chunk, the follower starts
            hold.__enter__()
            held.set()
        return real(runner, ids)

    e.sched.batcher.forward = spy
    th, box = in_thread(e.prefill, PROMPT * 2, doc_key="w")
    wait_until(lambda: e.counters["warmup_preempted"] >= 1, "the warmup pauses at its next chunk")
    wait_until(lambda: e.sched.depth() == (1, 0), "the warmup waits, not live")
    chunks = len(log)
    with e.hold_warmup():  # nested: one release is not enough
        hold.__exit__(None, None, None)
        assert e.sched.depth() == (1, 0)
    th.join()
    assert box["out"] == len(PROMPT) * 2 and len(log) > chunks
    assert e.sched.depth() == (0, 0)

    with e.hold_warmup():  # a warmup that arrives during a hold waits for its end
        th, box = in_thread(e.prefill, PROMPT * 3, doc_key="v")
        wait_until(lambda: e.sched.waiting_for("v") == 1, "the warmup waits")
        assert "out" not in box
    th.join()
    assert box["out"] > 0


def test_a_request_for_the_warming_document_takes_over_after_one_chunk(tok):
    """A warmup holds the document's caches when a request for that document arrives on another
    thread: the warmup stops after the chunk it is computing, and the request reuses it."""
    pair = random_pair(tok)
    e, fresh = engine(pair, warmup_chunk=16), engine(pair)
    prompt = PROMPT * 2
    real = e.sched.batcher.forward
    started: dict = {}

    def spy(runner, ids):
        if "i" not in started:  # the warmup's first chunk: the request comes now
            started["i"] = in_thread(e.complete_ids, prompt, doc_key="w")
            wait_until(lambda: e.sched.waiting_for("w") == 1, "the request waits for the chunk")
        return real(runner, ids)

    e.sched.batcher.forward = spy
    computed = e.prefill(prompt, doc_key="w")
    th, box = started["i"]
    th.join()
    ids, st = box["out"]
    assert computed == 16 and st.prefill_tokens == len(prompt) - 16
    assert ids == fresh.complete_ids(prompt, doc_key="x")[0]
    assert e.sched.depth() == (0, 0)


def test_warmup_for_a_document_with_a_request_is_dropped(tok):
    e = engine(random_pair(tok), drafter="none", max_new_tokens=20)
    got = {}

    def on_tokens(ids):
        if not got:
            got["n"] = e.prefill(PROMPT + [5, 6], doc_key="doc")

    e.complete_ids(PROMPT, doc_key="doc", on_tokens=on_tokens)
    assert got["n"] == 0


def test_queue_limit_refuses_and_admission_resumes():
    s = Scheduler(SchedulerConfig(max_batch=1, max_queue=1))
    a = s.acquire("a")
    th, box = in_thread(s.acquire, "b")
    wait_until(lambda: s.waiting_for("b") == 1, "b waits behind a")
    with pytest.raises(EngineError, match="waiting") as err:
        s.acquire("c", INTERACTIVE)
    assert err.value.code == "overloaded"  # an overload, not a model fault
    s.release(a)
    th.join()
    assert box["out"].live and s.depth() == (0, 1)


def test_memory_guard_queues_instead_of_exceeding(tok):
    pair = random_pair(tok)
    e = engine(pair, drafter="none", max_new_tokens=6)
    e = engine(pair, drafter="none", max_new_tokens=6, kv_budget_mb=1.5 * e.cache_bytes / 2**20)
    other: dict = {}

    def on_tokens(ids):
        if not other:
            other["b"] = in_thread(e.complete_ids, PROMPT[:20], doc_key="b")
            wait_until(lambda: e.sched.waiting_for("b") == 1, "b queues for memory")
            assert list(e.caches) == ["a"]

    e.complete_ids(PROMPT, doc_key="a", on_tokens=on_tokens)
    other["b"][0].join()
    assert other["b"][1]["out"][1].stop_reason in ("length", "eos")
    assert list(e.caches) == ["b"] and e.counters["evictions"] == 1


def test_concurrent_documents_batch_and_match_serial(tok):
    pair = random_pair(tok, seed=11)
    prompts = {f"doc{i}": PROMPT[i * 5:60 + i * 7] for i in range(3)}
    serial = engine(pair, max_new_tokens=12)
    want = {d: serial.complete_ids(p, doc_key=d)[0] for d, p in prompts.items()}
    e = engine(pair, max_new_tokens=12, max_batch=4, batch_wait_ms=50)
    assert run_together(e, prompts) == want
    assert e.sched.batcher.batched_calls > 0


def test_type_through_serves_the_rest(tok):
    e = engine(random_pair(tok, seed=2), type_through=True, max_new_tokens=16)
    prefix, suffix = "def mean(xs):\n    return ", "\n"
    first = e.complete(prefix, suffix, doc_key="t")
    assert len(first.text) > 3
    for n in (1, 3):
        c = e.complete(prefix + first.text[:n], suffix, doc_key="t")
        assert c.type_through and c.text == first.text[n:]
    c = e.complete(prefix + "#", suffix, doc_key="t")  # typed something else: generate
    assert not c.type_through


def test_type_through_follows_a_generation_in_flight(tok):
    e = engine(random_pair(tok, seed=2), type_through=True, max_new_tokens=16, drafter="none")
    prefix, suffix = "def mean(xs):\n    return ", "\n"
    cancel = threading.Event()
    follower: dict = {}
    streamed: list[str] = []

    def on_text(delta):
        if not follower and len(e.records.get("t").text) >= 2:
            typed = e.records.get("t").text[:2]
            follower["typed"] = typed
            follower["run"] = in_thread(e.complete, prefix + typed, suffix, doc_key="t",
                                        on_text=streamed.append)
            wait_until(lambda: e.records.get("t").followers == 1, "the new request follows")
            cancel.set()  # the editor cancels the old request: the follower keeps it alive

    first = e.complete(prefix, suffix, doc_key="t", cancel=cancel, on_text=on_text)
    follower["run"][0].join()
    c = follower["run"][1]["out"]
    assert first.stop_reason in ("length", "eos")
    assert c.type_through and c.text == first.text[len(follower["typed"]):]
    assert "".join(streamed) == c.text


def test_step_budget_caps_the_draft_under_load():
    b = StepBatcher(max_batch=16, step_tokens=32)
    assert b.max_draft_now() is None  # alone: the adaptive draft length decides
    for live, cap in ((2, 15), (4, 7), (16, 1), (40, 1)):  # each verifies its draft + 1 of 32 tokens
        b.set_active(live)
        assert b.max_draft_now() == cap
    b.step_tokens = 0
    assert b.max_draft_now() is None


def verify_widths_together(pair, step_tokens: int) -> tuple[list[int], dict]:
    """Three documents decoding together: the target verify widths seen while ≥ 2 were live, and
    each document's ids."""
    prompts = {f"doc{i}": PROMPT[i * 5:60 + i * 7] for i in range(3)}
    e = engine(pair, max_new_tokens=12, max_batch=4, batch_wait_ms=50, draft_len=4,
               batch_step_tokens=step_tokens)
    widths: list[int] = []
    real = e.sched.batcher.forward

    def spy(runner, ids):
        verify = len(ids) <= e.cfg.max_draft_len + 1 and any(runner is s.target for s in e.caches.values())
        if verify and e.sched.depth()[1] >= 2:  # live only falls once all three run: the cap read was ≤ this
            widths.append(len(ids))
        return real(runner, ids)

    e.sched.batcher.forward = spy
    return widths, run_together(e, prompts)


def run_together(e, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each document's ids, its generation in its own thread; all are live before any verify step."""
    together = threading.Barrier(len(prompts))
    seen: list[int] = []

    def first_step(ids):
        if threading.get_ident() not in seen:
            seen.append(threading.get_ident())
            together.wait()

    runs = {d: in_thread(e.complete_ids, p, doc_key=d, on_tokens=first_step) for d, p in prompts.items()}
    for th, _ in runs.values():
        th.join()
    return {d: box["out"][0] for d, (_, box) in runs.items()}


def test_batched_verify_width_is_capped_and_output_unchanged(tok):
    pair = random_pair(tok, seed=11)
    # 5 tokens for 2 or 3 generations: a draft of 1 each (verify width 2)
    capped, ids = verify_widths_together(pair, step_tokens=5)
    free, free_ids = verify_widths_together(pair, step_tokens=0)
    assert capped and max(capped) == 2
    assert max(free) > 2  # without the cap the adaptive draft length (starting at 4) is wider
    assert ids == free_ids  # greedy: the cap changes the pace, never the text


@pytest.mark.parametrize(("old", "new", "rest"), [
    (("x = ", "\n", "foo(1)"), ("x = f", "\n"), "oo(1)"),     # typed its beginning
    (("x = ", "\n", "foo(1)"), ("x = g", "\n"), ""),          # typed something else
    (("x = ", "\n", "foo(1)"), ("x = foo(1)", "\n"), ""),     # typed all of it
    (("x = ", "\n", "foo(1)"), ("x = ", "\n"), ""),           # the same request again: generate
    (("x = ", "\n", "foo(1)"), ("x = f", ")\n"), ""),         # another suffix
])
def test_type_through_is_one_rule_for_the_engine_and_remote_clients(old, new, rest):
    from completer.engine.records import Record
    from completer.remote.typethrough import _typed_rest

    rec = Record(old[0], old[1])
    rec.update(old[2], done=True, ok=True)
    typed = rec.typed(*new)
    assert (old[2][len(typed):] if typed is not None else "") == rest == _typed_rest(old, *new)
