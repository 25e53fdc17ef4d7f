"""End to end through the real `completer-lsp` process (pytest-lsp): every option of the language
server's schema changed by workspace/didChangeConfiguration either applies to the running engine
(or the service) from the next request on, or reloads the engine; and a warmup on a syntax trigger
never holds a completion back (issue 21, items 1 and 6)."""
from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from lsprotocol import types as t
from pytest_lsp import LanguageClient
from test_lsp import SERVER, _inline, _open, _start, _tiny_options, _type

from completer import config
from lsp.options import SCOPES

# Values that load (or fail to load quickly) where the generic rule would pick one that cannot:
# paths and URLs are not numbers or choices.
SPECIAL = {"engine": "ws://127.0.0.1:9", "engine_api_key": "a-key", "engine_model": "a-model",
           "quant_groups": "embed=fp16,attn=int8,mlp=int8,head=int8",
           "min_confidence": 0.25}  # unset by default (the model's calibration)


@pytest_lsp.fixture(config=SERVER)
async def client(lsp_client: LanguageClient):
    yield
    await lsp_client.shutdown_session()


def _another(opt: config.Option, current, values: dict):
    """A valid value of `opt` other than `current`."""
    m = opt.meta
    if opt.name in SPECIAL:
        return SPECIAL[opt.name]
    if opt.name in ("target", "draft"):
        return current.rstrip("/") + "/"  # the same model, another value: a reload
    if opt.type is bool:
        return not current
    if m["choices"]:
        return next(c for c in m["choices"] if c != current)
    if opt.type is str:
        return next(c for c in ("auto", "cpu") if c != current)
    lo, hi = m["lo"], values[m["hi"]] if isinstance(m["hi"], str) else m["hi"]
    steps = (1, -1) if opt.type is int else (current * 0.5, 1.0, -current * 0.5)
    for v in (current + d for d in steps):
        if v != current and (lo is None or v > lo or (v == lo and not m["lo_open"])) and (hi is None or v <= hi):
            return v
    raise AssertionError(f"no other value for {opt.name}")


async def _settled(client: LanguageClient):
    for _ in range(1200):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine != "loading":
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError("the engine never finished loading")


@pytest.mark.asyncio
async def test_every_option_applies_live_or_reloads(client: LanguageClient, tiny_pair, tmp_path):
    await client.initialize_session(t.InitializeParams(
        capabilities=t.ClientCapabilities(), root_uri=tmp_path.as_uri(),
        initialization_options=_tiny_options(tiny_pair)))
    stats = await _settled(client)
    assert stats.engine == "ready"
    engine_names = {o.name for o in config.OPTIONS.values() if o.scope == "engine"}
    options = [o for o in config.OPTIONS.values() if o.scope in SCOPES]
    assert {o.scope for o in options} == set(SCOPES)
    # live ones first: a reload that fails (an engine URL nobody serves) leaves no engine to ask
    options.sort(key=lambda o: bool(o.meta["reload"]))
    values = {o.name: o.default for o in options} | _tiny_options(tiny_pair)
    seen = {"live": [], "reload": []}
    for opt in options:
        new = _another(opt, values[opt.name], values)
        values[opt.name] = new
        before = stats
        client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings={"completer": {opt.name: new}}))
        stats = await _settled(client)
        loads = stats.loads - before.loads
        if opt.meta["reload"]:
            assert loads == 1, f"{opt.name}: a reload option reloads"
            seen["reload"].append(opt.name)
            continue
        assert loads == 0, f"{opt.name}: a live option does not reload"
        assert getattr(stats.options, opt.name) == new, opt.name  # what each request reads from now on
        if opt.name in engine_names:  # it reached the running engine
            assert getattr(stats.engine_stats.config, opt.name) == new, opt.name
        if opt.scope == "workspace":  # the index was rebuilt with it
            assert stats.index_rebuilds == getattr(before, "index_rebuilds", 0) + 1, opt.name
        seen["live"].append(opt.name)
        if opt.name == "max_draft_len":  # the engine still completes with every live change so far
            _open(client)
            got = await client.text_document_inline_completion_async(_inline(8, 11))
            assert isinstance(got, t.InlineCompletionList)
    assert {"temperature", "top_p", "draft_len", "kv_budget_mb", "max_batch", "type_through", "seed",
            "warmup_chunk", "engine_timeout_ms", "engine_retries"} <= set(seen["live"])
    assert {"target", "device", "engine"} <= set(seen["reload"])
    assert len(seen["live"]) + len(seen["reload"]) == len(options)


LONG = "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n\n" for i in range(60))


@pytest.mark.asyncio
async def test_a_completion_during_a_warmup_does_not_wait_for_it(client: LanguageClient, tiny_pair):
    # one-token warmup chunks: a warmup of a long document takes hundreds of steps, and the
    # engine's scheduler pauses it between two of them for a completion on another thread. The
    # native step runs the tiny pair's steps in ~0.1 ms, so a warmup can end before the request
    # reaches the engine: then another document's warmup is tried (each one's prompt is new).
    await _start(client, _tiny_options(tiny_pair, warmup_chunk=1))
    _open(client)
    line = LONG.count("\n")
    for attempt in range(5):
        uri = f"file:///tmp/long{attempt}.py"
        _open(client, LONG.replace("return a *", f"return a + {attempt} *"), uri)
        _type(client, line, 0, "x = ", 2, uri)  # an `assign` trigger: a warmup starts
        for _ in range(2000):  # until it holds the engine (stats runs on the completions' thread)
            stats = await client.protocol.send_request_async("completer/stats", {})
            if stats.engine_stats.queue_live == 1 or getattr(stats, "warmups", 0) > attempt:
                break
        got = await client.text_document_inline_completion_async(_inline(8, 11))
        assert isinstance(got, t.InlineCompletionList)
        for _ in range(600):
            stats = await client.protocol.send_request_async("completer/stats", {})
            if getattr(stats, "warmups", 0) == attempt + 1:
                break
            await asyncio.sleep(0.05)
        assert stats.warmups == attempt + 1 and stats.warmup_tokens > 100
        if stats.engine_stats.warmup_preempted >= 1:  # the completion went first, between two chunks
            return
    pytest.fail("in 5 warmups the completion never arrived while one held the engine")


@pytest.mark.asyncio
async def test_the_request_after_a_warmup_finds_its_prompt_cached(client: LanguageClient, tiny_pair):
    await _start(client, _tiny_options(tiny_pair))
    _open(client, LONG, "file:///tmp/long.py")
    line = LONG.count("\n")
    _type(client, line, 0, "x = ", 2, "file:///tmp/long.py")
    for _ in range(600):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if getattr(stats, "warmups", 0) == 1:
            break
        await asyncio.sleep(0.05)
    assert stats.warmup_tokens > 100
    await client.text_document_inline_completion_async(_inline(line, 4, "file:///tmp/long.py"))
    after = await client.protocol.send_request_async("completer/stats", {})
    # the warmup's prompt is the request's: nothing (or the one token the step re-reads) is prefilled again
    assert after.engine_stats.prefill_tokens - stats.engine_stats.prefill_tokens <= 1
