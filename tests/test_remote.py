"""RemoteEngine against a real `completer serve`: the engine API over the wire, from threads."""
from __future__ import annotations

import threading

import pytest
from test_server import TOKEN, server  # noqa: F401 - the fixture is used by name

from completer.engine.models import load_tokenizer
from completer.remote import RemoteEngine, RemoteError

PREFIX, SUFFIX = "def scale(xs, k):\n    return [", "]\n"


@pytest.fixture(scope="module")
def remote(server):  # noqa: F811
    r = RemoteEngine(f"ws://{server}", token=TOKEN)
    yield r
    r.close()


def test_complete_streams_and_reports(remote):
    deltas = []
    c = remote.complete(PREFIX, SUFFIX, doc_key="r.py", on_text=deltas.append)
    assert c.text and "".join(deltas) == c.text
    j = c.to_json()
    assert j["text"] == c.text and j["new_tokens"] == c.stats.new_tokens > 0 and "ttft_ms" in j


def test_stop_text_and_cancel(remote):
    c = remote.complete(PREFIX, SUFFIX, doc_key="s.py", stop_text=lambda t: 2 if len(t) >= 2 else None)
    assert len(c.text) == 2 and c.stats.stop_reason == "stop"
    cancel = threading.Event()
    cancel.set()  # cancelled before the server starts it: a done frame says so
    c = remote.complete("import sys\n", "", doc_key="c.py", max_new=120, cancel=cancel)
    assert c.stats.cancelled and c.stats.stop_reason in ("cancelled", "superseded")


def test_concurrent_callers(remote):
    out = {}

    def call(i):
        out[i] = remote.complete(PREFIX + "x" * i, SUFFIX, doc_key=f"t{i}.py").text

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == [0, 1, 2] and all(out.values())


def test_warmup_tokens_and_budget(remote, tiny_pair):
    assert remote.warmup(PREFIX, SUFFIX, doc_key="w.py") == 0
    tok = load_tokenizer(str(tiny_pair[0]))  # the server's model dir is local: counts are exact
    assert remote.count_tokens(PREFIX) == len(tok.encode(PREFIX, add_special_tokens=False).ids)
    info = remote.info
    assert remote.prompt_budget() == info["prompt_budget"]
    assert remote.prompt_budget(32) == max(info["ctx"] - 32 - info["max_draft_len"] - 1, info["ctx"] // 2)


def test_wrong_token_is_a_clear_error(server):  # noqa: F811
    with pytest.raises(RemoteError, match="401|unauthorized"):
        RemoteEngine(f"ws://{server}/ws", token="nope").complete("x", doc_key="d")
