"""Resource bounds (issue 19 items 6, 7c, 10): a 1 MB line through the real CLI and language
server, documents' memory returned on close (counted as parsers and trees, not RSS timings), and
document text that never becomes a control token. Latencies are printed, never asserted."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities
from tokenizers import Tokenizer

from completer.fim import FimFormat
from completer.prompt import encode_text, fim_ids
from lsp.service import MAX_PARSED_DOCUMENTS

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "draft_models/default/target/tokenizer.json"
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"], "PYTHONPATH": str(ROOT)}


def one_mb_line() -> str:
    """A 1 MB list literal on one line with a parse error in it (the worst case of the issue: the
    old parse check walked its 280 k children per candidate), then a function to complete."""
    items = ", ".join(str(i) for i in range(140_000))
    return f"data = [{items},, ]\n\n\ndef mean(values):\n    s = 0\n    for v in values:\n        "


# -- item 10: document text is text ----------------------------------------------------------------
SPECIAL_DOC = 'END = "<|endoftext|>"  # <fim_prefix> <fim_suffix><fim_middle> <pad> <|fim_prefix|>\n'


def test_special_strings_in_a_document_never_become_control_ids():
    tok = Tokenizer.from_file(str(TOKENIZER))
    control = {i for i, a in tok.get_added_tokens_decoder().items() if a.special}
    assert set(tok.encode(SPECIAL_DOC, add_special_tokens=False).ids) & control  # the bug: encode alone
    ids = encode_text(tok, SPECIAL_DOC)
    assert not set(ids) & control and tok.decode(ids) == SPECIAL_DOC
    fmt = FimFormat.detect(tok)
    prompt = fim_ids(tok, fmt, SPECIAL_DOC * 3, SPECIAL_DOC, 4096)
    assert [i for i in prompt if i in control] == [fmt.suffix, fmt.middle]  # only the format's own


def test_fim_tokens_kept_as_plain_added_tokens_are_split():
    """Qwen2.5's tokenizer keeps <|fim_prefix|> etc. as added tokens that are not special: the
    tokenizer's own flag does not cover them."""
    tok = Tokenizer.from_file(str(TOKENIZER))
    tok.add_tokens(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"])
    plain = {tok.token_to_id(s) for s in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>")}
    doc = SPECIAL_DOC + "s = '<|fim_suffix|><|fim_middle|>' + '<|file_sep|>'\n"
    assert set(tok.encode(doc, add_special_tokens=False).ids) & plain
    ids = encode_text(tok, doc)
    assert not set(ids) & plain and tok.decode(ids) == doc


def test_encode_text_costs_what_encode_costs():
    """Printed, not asserted: one encode of a copy of the tokenizer plus a set check."""
    tok = Tokenizer.from_file(str(TOKENIZER))
    text = (ROOT / "completer/documents.py").read_text() * 10
    encode_text(tok, "warm")
    for name, f in (("encode", lambda: tok.encode(text, add_special_tokens=False)), ("encode_text", lambda: encode_text(tok, text))):
        best = min(_timed(f) for _ in range(3))
        print(f"{name}: {len(text)} chars in {best * 1e3:.1f} ms")
    assert encode_text(tok, text) == tok.encode(text, add_special_tokens=False).ids  # no control strings in it


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


# -- item 6: the 1 MB line through the real CLI ----------------------------------------------------
@pytest.mark.slow
def test_one_mb_line_through_the_cli(tmp_path):
    src = one_mb_line()
    path = tmp_path / "big.py"
    path.write_text(src)
    line = src.count("\n")  # the cursor: the end of the file, in the loop's body
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "completer.cli", "complete", str(path), "--line", str(line),
                          "--col", "8", "--json"], capture_output=True, text=True, timeout=600,
                         env={**ENV, "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    print(f"1 MB line, CLI: {time.perf_counter() - t0:.1f} s wall (models included), total_ms {r['total_ms']}, "
          f"syntax_ms {r['syntax_ms']}, postprocess_ms {r.get('postprocess_ms')}, skipped {r['syntax_skipped']}")
    assert r["gate"] == "multi_line" and set(r["syntax_skipped"]) <= {"header", "parse_check"}
    prefix = next(s for s in r["spans"] if s[0] == "prefix")
    assert prefix[1] > 0 and prefix[2] == len(src)  # offsets in the whole file, not in the parsed window


@pytest.mark.slow
def test_cursor_inside_a_one_mb_line_gets_a_prompt(tmp_path):
    """The line does not fit the prompt: its last part before the cursor does (was: no prefix)."""
    src = one_mb_line().split("\n")[0]
    path = tmp_path / "line.py"
    path.write_text(src + "\n")
    out = subprocess.run([sys.executable, "-m", "completer.cli", "complete", str(path), "--line", "0",
                          "--col", str(len(src) - 3), "--json"], capture_output=True, text=True, timeout=600,
                         env={**ENV, "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    prefix = next(s for s in r["spans"] if s[0] == "prefix")
    assert r["context_tokens"] > 100 and len(src) - 3 - prefix[1] > 300 and prefix[2] == len(src) - 3


# -- items 6 and 7c through the language server ------------------------------------------------------
async def _start(client: LanguageClient, options: dict) -> None:
    await client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), initialization_options=options))
    for _ in range(1200):  # the engine loads in the background after `initialized`
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine not in ("loading", "not loaded"):
            return
        await asyncio.sleep(0.05)


def _open(client: LanguageClient, uri: str, text: str) -> None:
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


@pytest.mark.slow
@pytest.mark.asyncio
async def test_documents_give_their_memory_back(client: LanguageClient, tiny_pair):
    target, draft = tiny_pair
    await _start(client, {"target": str(target), "draft": str(draft), "max_new_tokens": 4, "debounce_ms": 0,
                          "device": "cpu"})
    src = (ROOT / "completer/documents.py").read_text()
    for i in range(300):
        _open(client, f"file:///tmp/doc{i}.py", src)
        client.text_document_did_close(t.DidCloseTextDocumentParams(
            text_document=t.TextDocumentIdentifier(uri=f"file:///tmp/doc{i}.py")))
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.documents == 0 and stats.parsed_documents == 0 and stats.parsers == 1

    n = MAX_PARSED_DOCUMENTS + 6
    for i in range(n):
        _open(client, f"file:///tmp/open{i}.py", src)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.documents == n and stats.parsed_documents == MAX_PARSED_DOCUMENTS
    # the least recently used document lost its tree: it is parsed again when it is used
    info = await client.protocol.send_request_async("completer/documentInfo", {"uri": "file:///tmp/open0.py"})
    assert info.parsed and info.length == len(src)
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.parsed_documents == MAX_PARSED_DOCUMENTS and stats.parsers == 1


@pytest.mark.slow
@pytest.mark.asyncio
async def test_one_mb_line_through_the_language_server(client: LanguageClient):
    await _start(client, {"debounce_ms": 0})  # the embedded pair
    src = one_mb_line()
    uri = "file:///tmp/big.py"
    _open(client, uri, src)
    t0 = time.perf_counter()
    res = await client.text_document_inline_completion_async(t.InlineCompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=6, character=8),
        context=t.InlineCompletionContext(trigger_kind=t.InlineCompletionTriggerKind.Invoked)))
    stats = await client.protocol.send_request_async("completer/stats", {})
    print(f"1 MB line, LSP: {(time.perf_counter() - t0) * 1e3:.0f} ms, latency {stats.latency_ms}")
    assert stats.requests == 1 and stats.engine == "ready" and getattr(stats, "engine_exceptions", 0) == 0
    assert res is None or all(item.insert_text for item in res.items)


# -- freed memory goes back to the OS ----------------------------------------------------------------
def test_large_messages_give_their_freed_memory_back_after_a_burst(monkeypatch):
    """glibc keeps what a 10 MB message freed as resident free heap (RSS swung 40 MB between large
    documents in the transport fuzz); after a large message the server calls malloc_trim at each
    of memory.AFTER_S (what the message's work frees later comes back too), for a burst only
    after its last message, and not at all for small messages."""
    from completer import memory
    from lsp import protocol
    from lsp.server import build

    calls = []
    monkeypatch.setattr(memory, "give_back", lambda: calls.append(time.monotonic()) or True)
    monkeypatch.setattr(memory, "AFTER_S", (0.05, 0.3))
    ls = build()
    big = json.dumps({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": "file:///big.py", "languageId": "python", "version": 1, "text": "x = 1\n" * 200_000}}}).encode()
    small = json.dumps({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 1}}).encode()

    async def run():
        protocol.dispatch(ls, small)
        await asyncio.sleep(0.2)
        assert calls == []
        for _ in range(3):
            sent = time.monotonic()
            protocol.dispatch(ls, big)
        assert memory.pending() == 2  # the last message's two, the burst's earlier ones cancelled
        for _ in range(200):  # the timers fire once the burst is over
            if len(calls) == 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.4)
        assert memory.pending() == 0
        return sent

    sent = asyncio.run(run())
    # a timer never fires before its time (asyncio's clock resolution aside): the second came 0.3 s
    # after the last message at the earliest, however late a loaded machine runs the first
    assert len(big) >= memory.LARGE and len(calls) == 2 and calls[1] >= sent + 0.29


def test_give_back_trims_where_glibc_is():
    from completer import memory
    glibc = sys.platform.startswith("linux") and "CS_GNU_LIBC_VERSION" in os.confstr_names \
        and os.confstr("CS_GNU_LIBC_VERSION")
    assert memory.give_back() is bool(glibc)
