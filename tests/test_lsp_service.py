"""lsp/service.py, what the language server does behind its handlers: cancellation and
supersession, requests that wait while the engine loads, options applied live or by a reload,
engine faults and failed loads said once, the stats of a dropped completion, and warmups on syntax
triggers. End to end through the real `completer-lsp` (pytest-lsp), except where an order must be
driven rather than raced: a completion during a warmup runs the Service and its Engine in-process,
the test holding each side at the point it names."""
from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.embedded import degenerate_place
from helpers.lsp import SOURCE, URI, inline, open_doc, server_stats, start, tiny_options, type_text
from lsprotocol import types as t
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient, client_capabilities

from completer.engine.scheduler import INTERACTIVE
from lsp.options import parse_options
from lsp.service import Edit, Service

ROOT = Path(__file__).resolve().parents[1]
LONG = "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n\n" for i in range(60))


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cancel_and_supersede(client: LanguageClient, tiny_pair):
    await start(client, tiny_options(tiny_pair, debounce_ms=300, max_new_tokens=32))
    open_doc(client)
    # $/cancelRequest during the debounce: the request ends with RequestCancelled
    fut = client.protocol.send_request(t.TEXT_DOCUMENT_INLINE_COMPLETION, inline(8, 11), msg_id="c1")
    client.protocol.notify(t.CANCEL_REQUEST, t.CancelParams(id="c1"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wrap_future(fut)
    assert err.value.code == t.LSPErrorCodes.RequestCancelled
    # a newer request for the same document supersedes the older: it answers empty
    first = client.text_document_inline_completion_async(inline(8, 11))
    await asyncio.sleep(0.05)
    second = client.text_document_inline_completion_async(inline(8, 11))
    a, b = await asyncio.gather(first, second)
    assert not a.items
    assert isinstance(b, t.InlineCompletionList)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.cancelled == 1 and stats.superseded >= 1


@pytest.mark.slow
@pytest.mark.asyncio
async def test_tokens_spent_on_a_dropped_completion_are_counted(client: LanguageClient):
    # held-out stdlib code where the embedded pair writes a repeated run (tests/helpers/embedded.py)
    # (tests/test_degenerate.py): the degenerate rule drops it, and the stats say what it cost
    await start(client, {"max_new_tokens": 64, "debounce_ms": 0, "device": "cpu"})
    text, off = degenerate_place()
    open_doc(client, text)
    line = text[:off].count("\n")
    got = await client.text_document_inline_completion_async(inline(line, off - text.rfind("\n", 0, off) - 1))
    assert not got.items
    stats = await server_stats(client)
    assert stats.empty == 1 and stats.dropped_degenerate == 1 and stats.wasted_tokens > 0


def _stack_source() -> str:
    return (ROOT / "examples" / "stack.py").read_text()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_request_before_the_engine_is_ready_waits_for_it(client: LanguageClient):
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        initialization_options={"max_new_tokens": 24, "debounce_ms": 0, "device": "cpu"}))
    open_doc(client, _stack_source())  # at once: the models are still loading
    # a waiting request ends on $/cancelRequest, and when a newer one for its document comes
    fut = client.protocol.send_request(t.TEXT_DOCUMENT_INLINE_COMPLETION, inline(7, 19), msg_id="w1")
    client.protocol.notify(t.CANCEL_REQUEST, t.CancelParams(id="w1"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wrap_future(fut)
    assert err.value.code == t.LSPErrorCodes.RequestCancelled
    older = client.text_document_inline_completion_async(inline(7, 19))
    older, got = await asyncio.gather(older, client.text_document_inline_completion_async(inline(7, 19)))
    assert not older.items
    assert got.items and got.items[0].insert_text.strip()  # the newest one is answered once ready
    stats = await server_stats(client)
    assert (stats.waited_for_engine, stats.cancelled, stats.superseded) == (3, 1, 1)
    assert stats.loads == 1 and stats.engine == "ready"
    # $/progress: begin at 0 %, reports with rising percentages up to 100 %, end
    (reports,) = [r for tok, r in client.progress_reports.items() if str(tok).startswith("completer/load-models")]
    assert isinstance(reports[0], t.WorkDoneProgressBegin) and reports[0].percentage == 0
    assert isinstance(reports[-1], t.WorkDoneProgressEnd) and reports[-1].message == "ready"
    percent = [r.percentage for r in reports[1:-1]]
    assert percent and percent == sorted(percent) and percent[-1] == 100


@pytest.mark.slow
@pytest.mark.asyncio
async def test_enable_and_configuration_changes(client: LanguageClient, tiny_pair):
    await start(client, tiny_options(tiny_pair, enable=False, warmup=False))
    open_doc(client)
    for _ in range(3):
        assert not (await client.text_document_inline_completion_async(inline(9, 0))).items
    stats = await server_stats(client)
    assert (stats.requests, stats.disabled, stats.loads) == (3, 3, 1)
    assert not stats.gate_reasons and stats.engine_stats.requests == 0  # the engine was never asked

    # an LSP-only option: applied at once, no reload
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"enable": True, "max_lines": 4}}))
    got = await client.text_document_inline_completion_async(inline(9, 0))
    assert isinstance(got, t.InlineCompletionList)
    stats = await server_stats(client)
    assert (stats.requests, stats.disabled, stats.loads) == (4, 3, 1)
    assert sum(stats.gate_reasons._asdict().values()) == 1  # the engine path ran

    # flat settings with an invalid value: one warning naming it, the rest applied
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"debounce_ms": "soon", "enable": False}))
    assert not (await client.text_document_inline_completion_async(inline(9, 0))).items
    stats = await server_stats(client)
    assert (stats.disabled, stats.loads) == (4, 1)
    assert any("debounce_ms" in m.message and m.type == t.MessageType.Warning for m in client.messages)

    # an option that needs new models: reloaded in the background, said once, requests wait
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"enable": True, "drafter": "ngram"}}))
    got = await client.text_document_inline_completion_async(inline(9, 0))
    assert isinstance(got, t.InlineCompletionList)
    stats = await server_stats(client)
    assert stats.loads == 2 and stats.engine == "ready" and stats.engine_stats.config.drafter == "ngram"
    assert [m.message for m in client.messages if "reloading" in m.message] == [
        "completer: reloading the engine for the new drafter"]


def _serve(port: int = 0) -> tuple[subprocess.Popen, int]:
    """A real `completer serve` (the embedded pair) and its port, once it is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline().decode()
    port = int(re.search(r":(\d+)/ws", line).group(1))
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"completer serve did not get ready: {line}")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_engine_error_is_shown_once(client: LanguageClient):
    engine, port = _serve()
    try:
        await start(client, {"engine": f"ws://127.0.0.1:{port}", "engine_retries": 0, "debounce_ms": 0,
                              "max_new_tokens": 24})
        open_doc(client, _stack_source())
        assert (await client.text_document_inline_completion_async(inline(7, 19))).items
        engine.kill()  # the engine goes away: each request fails with EngineError("unavailable")
        engine.wait()
        for _ in range(3):
            assert not (await client.text_document_inline_completion_async(inline(7, 19))).items
        stats = await server_stats(client)
        assert stats.engine_errors == 3 and stats.engine_error.startswith("unavailable: ")
        shown = [m for m in client.messages if "unavailable" in m.message]
        assert len(shown) == 1 and shown[0].type == t.MessageType.Warning
        engine, _ = _serve(port)  # back: the next request reconnects, the state clears
        assert (await client.text_document_inline_completion_async(inline(7, 19))).items
        stats = await server_stats(client)
        assert stats.engine_error is None and stats.engine == "ready"
        assert [m.message for m in client.messages if m.type == t.MessageType.Info] == ["completer: engine back"]
    finally:
        engine.kill()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_failed_load_is_said_once_and_completions_stay_off(client: LanguageClient):
    # a model that is not there: no retry fixes it (an engine that is down is kept: test_remote_lsp.py)
    await start(client, {"target": str(ROOT / "no-such-model"), "debounce_ms": 0})
    open_doc(client)
    for _ in range(2):
        assert not (await client.text_document_inline_completion_async(inline(9, 0))).items
    stats = await server_stats(client)
    assert stats.engine.startswith("failed: ") and stats.engine_failed == 2
    errors = [m.message for m in client.messages if m.type == t.MessageType.Error]
    assert len(errors) == 1 and "completions are off" in errors[0]


async def test_a_completion_during_a_warmup_does_not_wait_for_it(tiny_pair):
    """A warmup on a syntax trigger runs on a thread of its own and gives way between two chunks:
    a completion for another document is answered while the warmup is unfinished. The order is
    driven through the engine's scheduler, not raced (the tiny pair's steps take ~0.1 ms): the
    warmup, having computed its first chunk, is held until the completion's ticket is live beside
    it; the completion is held until the warmup has given way (paused); the rest of the warmup is
    held until the completion is answered. Were the completion queued behind the warmup, or the
    warmup not to give way, a hold would run out and the test fail."""
    service = Service(parse_options(tiny_options(tiny_pair, warmup_chunk=1))[0])
    assert await service.load() == "ready"
    sched = service.engine.sched
    holding, live, gave_way, answered = (threading.Event() for _ in range(4))
    ran_out: list[str] = []
    checks = itertools.count(1)
    acquire, should_yield, pause = sched.acquire, sched.should_yield, sched.pause

    def hold(event: threading.Event, until: str) -> None:
        if not event.wait(30):
            ran_out.append(until)

    def acquire_held(doc, priority=INTERACTIVE):
        ticket = acquire(doc, priority)
        if priority == INTERACTIVE:  # the completion, live next to the warmup
            live.set()
            hold(gave_way, "the warmup gives way")
        return ticket

    def should_yield_held():  # the warmup asks before each chunk
        n = next(checks)
        if n == 2:  # its first chunk is computed: it holds the engine
            holding.set()
            hold(live, "the completion is live")
        elif n > 2:  # given way and admitted again
            hold(answered, "the completion is answered")
        return should_yield()

    def pause_seen(ticket):
        gave_way.set()
        return pause(ticket)

    sched.acquire, sched.should_yield, sched.pause = acquire_held, should_yield_held, pause_seen
    uri, line = "file:///tmp/long.py", LONG.count("\n")
    try:
        service.open(URI, SOURCE, "python", 1)
        service.open(uri, LONG, "python", 1)
        service.change(uri, 2, [Edit(((line, 0), (line, 0)), "x = ")])  # an `assign` trigger: a warmup
        assert await asyncio.to_thread(holding.wait, 30), "the trigger started no warmup"
        await asyncio.wait_for(service.complete(URI, 8, 11), 60)
        unfinished = service.counters["warmups"] == 0
        answered.set()
        for _ in range(600):
            if service.counters["warmups"] == 1:
                break
            await asyncio.sleep(0.05)
        stats = await service.stats()
    finally:
        for event in (live, gave_way, answered):  # a failed run leaves no hook waiting
            event.set()
        service.shutdown()
    assert not ran_out, f"held until it ran out: {ran_out}"
    assert unfinished, "the completion was answered only after the warmup ended"
    assert stats.get("shown", 0) + stats.get("empty", 0) == 1 and "superseded" not in stats  # answered
    assert stats["warmups"] == 1 and stats["warmup_tokens"] > 100
    assert stats["engine_stats"]["warmup_preempted"] == 1  # it gave way once, between two chunks


async def test_the_next_edit_follower_holds_the_engines_warmups_while_it_runs(tiny_pair):
    """The follower (renames and signatures carried past the region) is interactive work that
    does not go through the engine: while it runs, warmups wait (a warmup's prefill beside it on
    the two cores of a laptop-class machine slowed its answers several fold); after, they go on."""
    service = Service(parse_options(tiny_options(tiny_pair))[0])
    assert await service.load() == "ready"
    seen: list[bool] = []
    real = service.follower.answer

    def answer(*a, **kw):
        seen.append(service.engine.sched.should_yield())
        return real(*a, **kw)

    service.follower.answer = answer
    service.open(URI, SOURCE, "python", 1)
    await service.next_edit(URI, 0, 0)
    assert seen == [True] and not service.engine.sched.should_yield()


async def test_a_completion_waiting_out_its_debounce_lets_the_warmup_prefill(tiny_pair):
    """The editor asks for a completion right with the edit that triggers a warmup: the warmup
    prefills while the request waits out its debounce (it takes the cache over then)."""
    service = Service(parse_options(tiny_options(tiny_pair, debounce_ms=2000))[0])
    assert await service.load() == "ready"
    uri, line = "file:///tmp/long.py", LONG.count("\n")
    service.open(uri, LONG, "python", 1)
    service.change(uri, 2, [Edit(((line, 0), (line, 0)), "x = ")])  # an `assign` trigger: a warmup
    await service.complete(uri, line, 4)
    assert service.counters["warmups"] == 1 and service.counters["warmup_tokens"] > 0


async def test_a_warmup_starts_after_the_requests_its_edit_brought(tiny_pair, monkeypatch):
    """An editor asks for a next edit right after the edit that triggers a warmup: the warmup
    builds its prompt only once that request is answered (WARMUP_SETTLE_S, then no hold)."""
    import lsp.service as service_module

    monkeypatch.setattr(service_module, "WARMUP_SETTLE_S", 0.5)  # the request surely arrives within it
    service = Service(parse_options(tiny_options(tiny_pair))[0])
    assert await service.load() == "ready"
    order: list[str] = []
    real_answer, real_warmup = service.follower.answer, service_module.warmup_at

    def answer(*a, **kw):
        order.append("follow")
        time.sleep(0.6)  # past the settle time: the warmup must wait for the hold, not the clock
        got = real_answer(*a, **kw)
        order.append("answered")
        return got

    def warmup_at(*a, **kw):
        order.append("warmup")
        return real_warmup(*a, **kw)

    service.follower.answer = answer
    monkeypatch.setattr(service_module, "warmup_at", warmup_at)
    uri, line = "file:///tmp/long.py", LONG.count("\n")
    service.open(uri, LONG, "python", 1)
    service.change(uri, 2, [Edit(((line, 0), (line, 0)), "x = ")])  # an `assign` trigger: a warmup
    await service.next_edit(uri, line, 4)
    for _ in range(600):
        if service.counters["warmups"]:
            break
        await asyncio.sleep(0.05)
    assert order == ["follow", "answered", "warmup"] and service.counters["warmups"] == 1


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_request_after_a_warmup_finds_its_prompt_cached(client: LanguageClient, tiny_pair):
    await start(client, tiny_options(tiny_pair))
    open_doc(client, LONG, "file:///tmp/long.py")
    line = LONG.count("\n")
    type_text(client, line, 0, "x = ", 2, "file:///tmp/long.py")
    for _ in range(600):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if getattr(stats, "warmups", 0) == 1:
            break
        await asyncio.sleep(0.05)
    assert stats.warmup_tokens > 100
    await client.text_document_inline_completion_async(inline(line, 4, "file:///tmp/long.py"))
    after = await client.protocol.send_request_async("completer/stats", {})
    # the warmup's prompt is the request's: nothing (or the one token the step re-reads) is prefilled again
    assert after.engine_stats.prefill_tokens - stats.engine_stats.prefill_tokens <= 1
