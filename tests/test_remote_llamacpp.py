"""The llama-server client (`llamacpp:` engines) against a real llama-server built by
.ci/llamacpp.sh, serving the embedded target converted to GGUF: streaming, per-document slots
and their prompt cache, warmup, the in-loop stop and cancel closing the stream (the server stops
generating), API key, a server killed mid-stream and brought back.

Without a built llama-server these tests skip, or fail when CI is set (.ci/run builds it)."""
from __future__ import annotations

import os
import threading

import pytest
from helpers.llama import PREFIX, SUFFIX, TARGET, LlamaServer
from tokenizers import Tokenizer

from completer.client import Chunk, EngineError, prompt_budget
from completer.remote import TypeThrough, connect
from completer.remote.llamacpp import LlamaCpp


@pytest.fixture
def client(llama):
    c = LlamaCpp(llama.url, timeout_ms=20000, retries=1)
    c.warm_start()
    yield c
    c.close()


@pytest.mark.slow
def test_completes_and_streams(client):
    deltas = []
    c = client.complete(PREFIX, SUFFIX, doc_key="a.py", max_new=12, on_text=deltas.append)
    assert c.text and "".join(deltas) == c.text
    assert c.new_tokens == 12 and c.stop_reason == "length" and c.prompt_tokens > 50
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    assert client.count_tokens(PREFIX) == len(tok.encode(PREFIX, add_special_tokens=False).ids)
    assert client.ctx == 512 and client.prompt_budget() == prompt_budget(512, 64)
    assert client.prompt_budget(16) == prompt_budget(512, 16)


@pytest.mark.slow
def test_document_slots_keep_their_prompt_cache(client):
    a0 = client.complete(PREFIX, SUFFIX, doc_key="slot-a.py", max_new=4)
    client.complete("import sys\n\nprint(sys.argv)\n", "", doc_key="slot-b.py", max_new=4)  # another slot
    a1 = client.complete(PREFIX + "    ", SUFFIX, doc_key="slot-a.py", max_new=4)  # the user typed on
    assert a0.extra["id_slot"] != client.slots["slot-b.py"]
    assert a1.extra["id_slot"] == a0.extra["id_slot"]
    assert a1.extra["tokens_cached"] >= a0.prompt_tokens - 8  # the suffix and prefix came from the slot
    assert a1.prefill_tokens < 8


@pytest.mark.slow
def test_warmup_prefills_the_documents_slot(client):
    prefix = PREFIX.replace("read_lines", "load_rows")
    computed = client.warmup(prefix, SUFFIX, doc_key="warm.py")
    assert computed > 50
    c = client.complete(prefix, SUFFIX, doc_key="warm.py", max_new=4)
    assert c.prefill_tokens <= 1 and c.extra["tokens_cached"] >= computed - 1


@pytest.mark.slow
def test_slots_are_lru_and_forget_frees(client):
    for i in range(5):  # 4 server slots: the fifth document takes the least recently used one
        client.complete(f"x{i} = {i}\n", "", doc_key=f"lru{i}.py", max_new=1)
    assert "lru0.py" not in client.slots and len(set(client.slots.values())) == len(client.slots) == 4
    client.forget("lru4.py")  # the server refuses erase without --slot-save-path: the mapping goes
    assert "lru4.py" not in client.slots and client.stats()["kv_cached_documents"] == 3


@pytest.mark.slow
def test_stop_closes_the_stream_and_the_server_stops(client, llama):
    full = client.complete(PREFIX, SUFFIX, doc_key="stop.py", max_new=300)
    assert full.stop_reason == "length" and full.new_tokens == 300  # this prompt runs to the limit
    before = llama.predicted_total()
    c = client.complete(PREFIX, SUFFIX, doc_key="stop.py", max_new=300,
                        stop_text=lambda t: 3 if len(t) >= 3 else None)
    assert c.text == full.text[:3] and c.stop_reason == "stop"
    generated = llama.predicted_total() - before
    assert generated < 150, f"the server went on generating ({generated} tokens) after the stream closed"


@pytest.mark.slow
def test_cancel_from_another_thread(client, llama):
    cancel = threading.Event()
    before = llama.predicted_total()
    c = client.complete(PREFIX, SUFFIX, doc_key="cancel.py", max_new=300, cancel=cancel,
                        on_text=lambda d: cancel.set())  # a newer keystroke, right after the first token
    assert c.stop_reason == "cancelled" and len(c.text) < 40
    assert llama.predicted_total() - before < 150
    assert client.complete(PREFIX, SUFFIX, doc_key="cancel.py", max_new=2).new_tokens == 2  # no sticky state


@pytest.mark.slow
def test_type_through_serves_the_rest_without_a_request(llama):
    tt = connect(f"llamacpp:{llama.url}")
    assert isinstance(tt, TypeThrough)
    first = tt.complete(PREFIX, SUFFIX, doc_key="tt.py", max_new=12)
    requests = tt.stats()["requests"]
    typed = first.text[:2]
    rest = tt.complete(PREFIX + typed, SUFFIX, doc_key="tt.py", max_new=12)
    assert rest.text == first.text[2:] and rest.stop_reason == "type_through" and rest.type_through
    assert tt.stats()["requests"] == requests and tt.stats()["type_through"] == 1
    other = tt.complete(PREFIX + "zz", SUFFIX, doc_key="tt.py", max_new=2)  # typed something else
    assert not other.type_through and tt.stats()["requests"] == requests + 1


@pytest.mark.slow
def test_api_key_required_and_sent(llama_bin):
    binary, gguf = llama_bin
    s = LlamaServer(binary, gguf, "--api-key", "k-123").start()
    try:
        with pytest.raises(EngineError) as err:
            LlamaCpp(s.url, api_key="wrong-key-456").warm_start()
        assert err.value.code == "unauthorized" and "wrong-key-456" not in str(err.value)
        with pytest.raises(EngineError) as err:
            connect(f"llamacpp:{s.url}").complete(PREFIX, SUFFIX, doc_key="k.py", max_new=2)
        assert err.value.code == "unauthorized"
        c = connect(f"llamacpp:{s.url}", api_key="k-123").complete(PREFIX, SUFFIX, doc_key="k.py", max_new=2)
        assert c.new_tokens == 2
        os.environ["COMPLETER_API_KEY"] = "k-123"
        try:
            assert connect(f"llamacpp:{s.url}").complete(PREFIX, SUFFIX, doc_key="k.py", max_new=2).new_tokens == 2
        finally:
            del os.environ["COMPLETER_API_KEY"]
    finally:
        s.kill()


@pytest.mark.slow
def test_killed_mid_stream_then_back(llama_bin):
    binary, gguf = llama_bin
    s = LlamaServer(binary, gguf).start()
    c = LlamaCpp(s.url, timeout_ms=5000, retries=1)
    try:
        with pytest.raises(EngineError) as err:
            c.complete(PREFIX, SUFFIX, doc_key="k.py", max_new=300, on_text=lambda d: s.kill())
        assert err.value.code == "unavailable" and s.url in err.value.message
        with pytest.raises(EngineError) as err:  # down: refused, after one retry
            c.complete(PREFIX, SUFFIX, doc_key="k.py", max_new=2)
        assert err.value.code == "unavailable" and "refused" in err.value.message
        assert c.stats()["retries"] >= 1
        s.argv[s.argv.index("-np") + 1] = "2"  # back on the same port, with fewer slots
        s.start()
        for i in range(3):  # the same client recovers without a restart, and maps documents to 2 slots
            assert c.complete(PREFIX, SUFFIX, doc_key=f"k{i}.py", max_new=2).new_tokens == 2
        assert c.n_slots == 2 and sorted(c.slots.values()) == [0, 1]
    finally:
        s.kill()


def test_bad_urls_are_clear_errors():
    for url in ("http://127.0.0.1:1", "llamacpp:127.0.0.1:8012", "llamacpp:http://", "ftp://x", "openai:",
                "ws://"):
        with pytest.raises(EngineError) as err:
            connect(url)
        assert err.value.code == "bad_request" and "URL" in err.value.message


@pytest.mark.slow
def test_other_files_go_in_as_input_extra(llama_bin):
    """The real server takes `extra` as `input_extra` (in its prompt: more tokens), and a warmup
    with the same chunks leaves the slot's cache holding all of them for the completion after."""
    binary, gguf = llama_bin
    # the server gives extra chunks the context left beside one batch: a small batch leaves room
    s = LlamaServer(binary, gguf, "-b", "128", "-ub", "128").start()
    try:
        c = LlamaCpp(s.url)
        plain = c.complete("x = ", "\n", doc_key="e.py", max_new=1)
        extra = (Chunk("util.py", "def helper():\n    return 42\n"), Chunk("pkg/io.py", "def read(path):\n    ...\n"))
        with_extra = c.complete("x = ", "\n", doc_key="e.py", max_new=1, extra=extra)
        assert with_extra.prompt_tokens >= plain.prompt_tokens + sum(c.count_tokens(x.text) for x in extra)
        computed = c.warmup("y = ", "\n", doc_key="w.py", extra=extra)
        after = c.complete("y = ", "\n", doc_key="w.py", max_new=1, extra=extra)
        assert computed == after.prompt_tokens > 0
        assert after.extra["tokens_cached"] >= after.prompt_tokens - 1 and after.prefill_tokens <= 1, after
    finally:
        s.kill()
