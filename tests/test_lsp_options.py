"""End to end through the real `completer-lsp` process (pytest-lsp): every option of the language
server's schema changed by workspace/didChangeConfiguration either applies to the running engine
(or the service) from the next request on, or reloads the engine; and a warmup on a syntax trigger
never holds a completion back (issue 21, items 1 and 6)."""
from __future__ import annotations

import asyncio

import pytest
from helpers.lsp import inline, open_doc, tiny_options
from lsprotocol import types as t
from pytest_lsp import LanguageClient

from completer import config
from lsp.options import SCOPES

pytestmark = pytest.mark.slow

# Values that load (or fail to load quickly) where the generic rule would pick one that cannot:
# paths and URLs are not numbers or choices.
SPECIAL = {"engine": "ws://127.0.0.1:9", "engine_api_key": "a-key", "engine_model": "a-model",
           "quant_groups": "embed=fp16,attn=int8,mlp=int8,head=int8",
           "min_confidence": 0.25, "next_edit_min_confidence": 0.25}  # unset by default (the model's calibration)


def _another(opt: config.Option, current, values: dict):
    """A valid value of `opt` other than `current`."""
    m = opt.meta
    if opt.name in SPECIAL:
        return SPECIAL[opt.name]
    if opt.name in ("target", "draft"):
        return current.rstrip("/") + "/"  # the same model, another value: a reload
    if opt.name == "next_edit_model":
        return values["target"]  # the target writes the next edits too, from an engine of their own
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
        initialization_options=tiny_options(tiny_pair)))
    stats = await _settled(client)
    assert stats.engine == "ready"
    engine_names = {o.name for o in config.OPTIONS.values() if o.scope == "engine"}
    options = [o for o in config.OPTIONS.values() if o.scope in SCOPES]
    assert {o.scope for o in options} == set(SCOPES)
    # live ones first: a reload that fails (an engine URL nobody serves) leaves no engine to ask
    options.sort(key=lambda o: bool(o.meta["reload"]))
    values = {o.name: o.default for o in options} | tiny_options(tiny_pair)
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
            open_doc(client)
            got = await client.text_document_inline_completion_async(inline(8, 11))
            assert isinstance(got, t.InlineCompletionList)
    assert {"temperature", "top_p", "draft_len", "kv_budget_mb", "max_batch", "type_through", "seed",
            "warmup_chunk", "engine_timeout_ms", "engine_retries"} <= set(seen["live"])
    assert {"target", "device", "engine"} <= set(seen["reload"])
    assert len(seen["live"]) + len(seen["reload"]) == len(options)
