"""Next edits on remote engines: the rewrite as a raw text prompt to llama-server's /completion
and to an OpenAI-compatible /v1/completions (against a scripted HTTP server: the request each
sends, the answer read back, the numbers), the real llama-server serving the embedded target
(skipped when it is not built, as tests/test_remote_llamacpp.py), and completer/nextEdit end to
end through the real language server on a scripted llama-server: the edits' LSP positions in
UTF-16, the feedback counted, and the latency in completer/stats."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.lsp import open_doc, start, type_text
from lsprotocol import types as t
from pytest_lsp import LanguageClient

from completer.client import EngineError
from completer.edits.formats import EDIT_FORMATS, EditPrompt, HistoryItem
from completer.prompt import piece_text
from completer.remote import connect

REGION = "def f(name):\n    return name + 1\n"
# the remote model's answer even where the last edit is a rename (else the syntax tree's, unasked)
ON_THE_MODEL = {"next_edit_format": "sweep", "next_edit_rename_first": False}
REQ = EditPrompt((HistoryItem("a.py", "def f(x):\n", "def f(name):\n"),), "a.py", REGION, 6)


class Scripted(ThreadingHTTPServer):
    """llama-server's /props, /tokenize, /completion and /v1/models, /v1/completions, streaming
    `answer` in two deltas."""
    daemon_threads = True

    def __init__(self, model: str = "fake-model"):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.model, self.answer, self.bodies = model, "", []
        self.hold = threading.Event()  # cleared: an answer waits for it (a slow model)
        self.hold.set()
        self.asked = threading.Event()  # a completion request arrived
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a) -> None:
        pass

    def _send(self, body: bytes, ctype: str = "application/json", hold: threading.Event | None = None) -> None:
        """The answer; with `hold`, the headers at once and the body once it is set (a slow model)."""
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.end_headers()
        if hold is not None:
            self.wfile.flush()
            hold.wait(30)
        try:
            self.wfile.write(body)
        except OSError:  # the client hung up (a cancelled request)
            pass

    def do_GET(self) -> None:
        props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2, "model_alias": self.server.model}
        models = {"object": "list", "data": [{"id": self.server.model, "object": "model", "owned_by": "x"}]}
        self._send(json.dumps(props if self.path == "/props" else models).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.bodies.append((self.path, body))
        a = self.server.answer
        half = len(a) // 2
        if self.path == "/tokenize":
            self._send(json.dumps({"tokens": list(range(len(body.get("content", "")) // 3 + 1))}).encode())
        elif self.path == "/completion":
            self.server.asked.set()
            self._send(_sse({"content": a[:half], "stop": False}, {"content": a[half:], "stop": False},
                            {"content": "", "stop": True, "stop_type": "word", "tokens_predicted": 12,
                             "timings": {"prompt_n": 40, "cache_n": 10, "predicted_n": 12, "draft_n": 10,
                                         "draft_n_accepted": 8}}), "text/event-stream", self.server.hold)
        else:
            chunk = lambda s, why=None: {"choices": [{"text": s, "index": 0, "finish_reason": why}]}
            self._send(_sse(chunk(a[:half]), chunk(a[half:]), chunk("", "stop"),
                            {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 12}}, b"[DONE]"),
                       "text/event-stream")


@pytest.fixture
def scripted():
    s = Scripted()
    yield s
    s.hold.set()
    s.shutdown()
    s.server_close()


def test_llama_server_rewrite_request_and_answer(scripted):
    c = connect(f"llamacpp:{scripted.base}")
    scripted.answer = "def f(name):\n    return name + 2\n"
    got = c.rewrite(REQ, fmt="sweep", doc_key="a.py")
    assert got.text == scripted.answer and (got.edit_format, got.malformed) == ("sweep", False)
    assert got.extra == {"draft_n": 10, "draft_n_accepted": 8}
    assert (got.new_tokens, got.target_forwards, got.accepted_per_forward) == (12, 4, 3.0)
    assert got.stop_reason == "stop" and got.speculative and got.prompt_tokens == 50
    path, body = scripted.bodies[-1]
    assert path == "/completion" and body["prompt"] == piece_text(EDIT_FORMATS["sweep"].prompt(REQ))
    assert body["stop"] == list(EDIT_FORMATS["sweep"].stops) and body["temperature"] == 0.0
    assert body["cache_prompt"] is True and isinstance(body["id_slot"], int) and "speculative.n_max" not in body
    assert body["n_predict"] == (len(REGION) // 3 + 1) * 5 // 4 + 32  # the region's tokens x 1.25 + 32
    c.rewrite(REQ, fmt="sweep", doc_key="a.py", speculative=False, max_new=9)
    assert scripted.bodies[-1][1]["speculative.n_max"] == 0 and scripted.bodies[-1][1]["n_predict"] == 9
    # auto: a model named after neither family, no FIM format known → Zeta's plain-text format
    scripted.answer = "```a.py\n<|editable_region_start|>\ndef f(name):\n    return name<|user_cursor_is_here|>\n"
    got = c.rewrite(REQ, doc_key="a.py")
    assert (got.text, got.edit_format) == ("def f(name):\n    return name\n", "zeta")
    scripted.answer = "no markers at all"
    got = c.rewrite(REQ, doc_key="a.py")
    assert (got.text, got.malformed) == ("", True)
    with pytest.raises(EngineError, match="next-edit format"):
        c.rewrite(REQ, fmt="nope")
    assert c.stats()["rewrites"] == 4


def test_openai_compatible_rewrite(scripted):
    scripted.model = "sweepai/sweep-next-edit-1.5B"
    c = connect(f"openai:{scripted.base}/v1", fim_format="qwen")
    scripted.answer = "def f(name):\n    return name * 2\n"
    got = c.rewrite(REQ, doc_key="doc-1")
    assert got.text == scripted.answer and got.edit_format == "sweep" and got.stop_reason == "eos"
    assert (got.new_tokens, got.prompt_tokens) == (12, 50)
    path, body = scripted.bodies[-1]
    assert path == "/v1/completions" and body["prompt"].endswith("<|file_sep|>updated/a.py\n")
    assert body["stop"] == ["<|file_sep|>", "<|endoftext|>", "<|im_end|>"] and body["user"] == "doc-1"
    assert body["model"] == "sweepai/sweep-next-edit-1.5B" and body["temperature"] == 0.0


@pytest.mark.slow
def test_real_llama_server_rewrites_in_our_format():
    from helpers.llama import LlamaServer, llama_paths

    binary, gguf = llama_paths()
    server = LlamaServer(binary, gguf).start()
    try:
        c = connect(f"llamacpp:{server.url}")
        got = c.rewrite(REQ, fmt="completer", doc_key="a.py", max_new=24)
        assert got.new_tokens > 0 and got.stop_reason in ("eos", "length") and got.edit_format == "completer"
        plain = c.rewrite(REQ, fmt="completer", doc_key="b.py", max_new=24, speculative=False)
        assert plain.text == got.text  # greedy: the same answer however the server decodes it
    finally:
        server.kill()


# -- completer/nextEdit through the real language server on a scripted llama-server --------------
URI = "file:///tmp/emoji.py"
SOURCE = 'def greet(name):\n    s = "😀 " + name\n    return s, name\n'


@pytest.mark.slow
@pytest.mark.asyncio
async def test_next_edit_positions_are_utf16_and_feedback_counts(client: LanguageClient, scripted):
    await start(client, {**ON_THE_MODEL, "engine": f"llamacpp:{scripted.base}"})
    open_doc(client, SOURCE, URI)
    type_text(client, 0, 10, "who", 2, URI)  # the parameter renamed: name → whoname → (below) who
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=URI, version=3),
        content_changes=[t.TextDocumentContentChangePartial(
            range=t.Range(start=t.Position(line=0, character=13), end=t.Position(line=0, character=17)), text="")]))
    now = SOURCE.replace("greet(name)", "greet(who)")
    scripted.answer = now.replace("+ name", "+ who").replace("s, name", "s, who")
    got = await client.protocol.send_request_async("completer/nextEdit", {
        "textDocument": {"uri": URI}, "position": {"line": 0, "character": 13}})
    assert got.version == 3 and not hasattr(got, "reason"), got
    ranges = [((e.range.start.line, e.range.start.character), (e.range.end.line, e.range.end.character), e.newText)
              for e in got.edits]
    # line 1 `    s = "😀 " + name`: `name` at chars 15-19, UTF-16 units 16-20 (the emoji takes two)
    assert ranges == [((1, 16), (1, 20), "who"), ((2, 14), (2, 18), "who")]
    ((_, body),) = [b for b in scripted.bodies if b[0] == "/completion"]
    assert "<|file_sep|>emoji.py.diff\noriginal:\ndef greet(name):\nupdated:\ndef greet(who):\n" in body["prompt"]
    client.protocol.notify("completer/feedback", {"id": got.id, "kind": "nextEdit", "accepted": True})
    client.protocol.notify("completer/feedback", {"id": got.id, "kind": "nextEdit", "accepted": False})  # once
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert (stats.next_edit_shown, stats.next_edit_accepted, stats.next_edit_rejected) == (1, 1, 0)
    assert stats.next_edit_latency_ms.p50 > 0 and stats.next_edit_latency_ms.p90 >= stats.next_edit_latency_ms.p50


@pytest.mark.slow
@pytest.mark.asyncio
async def test_next_edit_prompt_holds_the_workspaces_definitions(client: LanguageClient, scripted, tmp_path):
    """With Sweep's format, a definition from another file of the workspace is a file section of
    the prompt (repository context); the paths are relative to the workspace root."""
    import asyncio

    (tmp_path / "util.py").write_text("def scale(value, factor):\n    return value * factor\n")
    main = "from util import scale\n\n\ndef run(name):\n    return scale(name, 2) + scale(name, 3)\n"
    (tmp_path / "main.py").write_text(main)
    uri = (tmp_path / "main.py").as_uri()
    await client.initialize_session(t.InitializeParams(
        capabilities=t.ClientCapabilities(), root_uri=tmp_path.as_uri(),
        initialization_options={**ON_THE_MODEL, "engine": f"llamacpp:{scripted.base}"}))
    for _ in range(200):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine == "ready" and stats.workspace and stats.workspace.complete:
            break
        await asyncio.sleep(0.05)
    open_doc(client, main, uri)
    type_text(client, 3, 8, "who", 2, uri)  # run(name) → run(whoname)
    scripted.answer = "def run(whoname):\n    return scale(whoname, 2) + scale(whoname, 3)\n"  # the region: run()
    got = await client.protocol.send_request_async("completer/nextEdit", {
        "textDocument": {"uri": uri}, "position": {"line": 3, "character": 11}})
    assert [e.newText for e in got.edits] == ["whoname", "whoname"], got
    ((_, body),) = [b for b in scripted.bodies if b[0] == "/completion"]
    assert body["prompt"].startswith("<|file_sep|>util.py\ndef scale(value, factor):")
    assert "<|file_sep|>main.py.diff\noriginal:\ndef run(name):\nupdated:\ndef run(whoname):\n" in body["prompt"]
    assert "<|file_sep|>current/main.py\n" in body["prompt"]


@pytest.mark.slow
def test_cli_next_edit_on_a_remote_engine(scripted, tmp_path):
    """The CLI's contract on an engine whose answer is known: the edits applied to FILE give the
    predicted file (--json), and the plain output is that change as a unified diff."""
    import subprocess
    import sys
    from pathlib import Path

    from completer.edits.diff import TextEdit, apply_edits

    old, new = tmp_path / "old.py", tmp_path / "main.py"
    before = "def run(name):\n    x = 'é😀' + name\n    return x, name\n"
    now = before.replace("run(name)", "run(who)")
    old.write_text(before)
    new.write_text(now)
    predicted = now.replace("+ name", "+ who").replace("x, name", "x, who")
    scripted.answer = predicted
    argv = [str(Path(sys.executable).parent / "completer"), "next-edit", str(new), "--line", "0", "--col", "10",
            "--before", str(old), "--engine", f"llamacpp:{scripted.base}", "--next-edit-format", "sweep",
            "--no-next-edit-rename-first"]
    r = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "reason" not in out and out["format"] == "sweep" and out["new_tokens"] == 12
    assert out["edits"][0] == {"start_line": 1, "start_col": 15, "end_line": 1, "end_col": 19, "text": "who"}
    assert apply_edits(now, [TextEdit(**e) for e in out["edits"]]) == predicted  # columns in characters
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.startswith(f"--- {new}\n+++ {new}\n@@ ")
    assert r.stdout.endswith("@@ -1,3 +1,3 @@\n def run(who):\n-    x = 'é😀' + name\n-    return x, name\n"
                             "+    x = 'é😀' + who\n+    return x, who\n")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_an_edit_computed_on_an_older_text_is_dropped(client: LanguageClient, scripted):
    """The user types while the model works: the request stops, and its answer says stale
    (never edits for a text that is gone)."""
    import asyncio

    await start(client, {**ON_THE_MODEL, "engine": f"llamacpp:{scripted.base}"})
    open_doc(client, SOURCE, URI)
    type_text(client, 0, 10, "who", 2, URI)
    scripted.answer = SOURCE.replace("name", "whoname")
    scripted.hold.clear()
    pending = asyncio.ensure_future(client.protocol.send_request_async("completer/nextEdit", {
        "textDocument": {"uri": URI}, "position": {"line": 0, "character": 13}}))
    assert await asyncio.to_thread(scripted.asked.wait, 30)  # the model is at work
    type_text(client, 2, 0, "#", 3, URI)
    got = await asyncio.wait_for(pending, 30)
    assert (got.edits, got.reason, got.version) == ([], "stale", 2)
    scripted.hold.set()
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.next_edit_dropped_stale == 1
