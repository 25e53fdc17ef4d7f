"""The WebSocket client (`ws://` engines) against a real `completer serve` on the tiny pair: the
engine API over the wire from threads, the token, feedback and document close forwarded (seen
in the server's /metrics), and reconnection after the service restarts."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from helpers import free_port

from completer.client import EngineError, prompt_budget
from completer.engine.models import load_tokenizer
from completer.remote import connect
from completer.remote.ws import WsEngine

pytestmark = pytest.mark.slow

TOKEN = "s3cret-ws"
PREFIX, SUFFIX = "def scale(xs, k):\n    return [", "]\n"


class Serve:
    """`completer serve` on a fixed port, so it can be stopped and started again."""

    def __init__(self, tiny_pair):
        target, draft = tiny_pair
        self.port = free_port()
        self.argv = [sys.executable, "-m", "completer.cli", "serve", "--port", str(self.port), "--token", TOKEN,
                     "--target", str(target), "--draft", str(draft), "--max-new-tokens", "24"]
        self.p: subprocess.Popen | None = None

    def start(self) -> Serve:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.p = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True, env=env)
        for line in self.p.stderr:
            if "models ready" in line or "error" in line:
                break
        assert self.p.poll() is None, "completer serve did not start"
        threading.Thread(target=self.p.stderr.read, daemon=True).start()  # keep draining its log
        return self

    def stop(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.terminate()
            self.p.wait(timeout=30)

    def metric(self, name: str) -> float:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/metrics",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            m = re.search(rf"^{re.escape(name)} (\S+)", r.read().decode(), re.MULTILINE)
        return float(m.group(1)) if m else 0.0

    def wait_metric(self, name: str, want: float) -> float:
        """The metric once it reaches `want` (the server applies feedback and forget in a worker)."""
        for _ in range(200):
            v = self.metric(name)
            if v == want:
                return v
            time.sleep(0.02)
        return self.metric(name)


@pytest.fixture(scope="module")
def serve(tiny_pair):
    s = Serve(tiny_pair).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(serve):
    r = connect(f"ws://127.0.0.1:{serve.port}", token=TOKEN)
    yield r
    r.close()


def test_complete_streams_and_reports(remote):
    deltas = []
    c = remote.complete(PREFIX, SUFFIX, doc_key="r.py", on_text=deltas.append)
    assert c.text and "".join(deltas) == c.text
    assert c.new_tokens > 0 and c.prompt_tokens > 0 and c.ttft_ms > 0 and c.stop_reason != "cancelled"


def test_stop_text_and_cancel(remote):
    c = remote.complete(PREFIX, SUFFIX, doc_key="s.py", stop_text=lambda t: 2 if len(t) >= 2 else None)
    assert len(c.text) == 2 and c.stop_reason == "stop"
    cancel = threading.Event()
    cancel.set()  # cancelled before the server starts it: a done frame says so
    c = remote.complete("import sys\n", "", doc_key="c.py", max_new=20, cancel=cancel)
    assert c.stop_reason in ("cancelled", "superseded")


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
    assert remote.prompt_budget(16) == prompt_budget(info["ctx"], 16, info["max_draft_len"])


def test_feedback_and_forget_reach_the_server(remote, serve):
    accepted = serve.metric("completer_engine_feedback_accepted")
    chars = serve.metric("completer_engine_feedback_accepted_chars")
    remote.complete(PREFIX, SUFFIX, doc_key="fb.py")
    remote.feedback("fb.py", "abcd", True, 2)
    assert serve.wait_metric("completer_engine_feedback_accepted", accepted + 1) == accepted + 1
    assert serve.metric("completer_engine_feedback_accepted_chars") == chars + 2
    docs = serve.metric("completer_engine_kv_cached_documents")
    remote.forget("fb.py")  # the document's KV cache is freed on the server
    assert docs >= 1 and serve.wait_metric("completer_engine_kv_cached_documents", docs - 1) == docs - 1


def test_wrong_token_is_a_clear_error(serve):
    with pytest.raises(EngineError) as err:
        WsEngine(f"ws://127.0.0.1:{serve.port}/ws", token="nope").complete("x", doc_key="d")
    assert err.value.code == "unauthorized" and "nope" not in err.value.message


def test_reconnects_after_the_service_restarts(tiny_pair):
    s = Serve(tiny_pair).start()
    r = WsEngine(f"ws://127.0.0.1:{s.port}", token=TOKEN, timeout_ms=5000, retries=1)
    try:
        assert r.complete(PREFIX, SUFFIX, doc_key="a.py").text
        s.stop()
        with pytest.raises(EngineError) as err:  # down: one retry with back-off, then a clear error
            for _ in range(3):  # the first send may still find the closing socket
                r.complete(PREFIX, SUFFIX, doc_key="a.py")
        assert err.value.code == "unavailable" and str(s.port) in err.value.message
        s.start()
        assert r.complete(PREFIX, SUFFIX, doc_key="a.py").text  # the same client, no restart
        assert r.stats()["reconnects"] == 1 and r.stats()["connected"]
    finally:
        r.close()
        s.stop()


def test_openai_client_on_our_server(serve):
    """`completer serve` also speaks /v1/completions: the OpenAI client there builds no FIM prompt
    (the model reports owned_by "completer": the server builds it from `suffix`)."""
    c = connect(f"openai:http://127.0.0.1:{serve.port}/v1", api_key=TOKEN)
    c.warm_start()
    assert c.inner.fmt == "suffix" and not c.inner.exact_tokens
    deltas = []
    r = c.complete(PREFIX, SUFFIX, doc_key="oa.py", max_new=12, on_text=deltas.append)
    assert r.text and "".join(deltas) == r.text and r.extra["fim_format"] == "suffix"
    cut = c.complete(PREFIX, SUFFIX, doc_key="oa2.py", max_new=12, stop_text=lambda t: 1 if t else None)
    assert cut.text == r.text[:1] and cut.stop_reason == "stop"
    with pytest.raises(EngineError) as err:
        connect(f"openai:http://127.0.0.1:{serve.port}/v1", api_key=TOKEN, model="gpt-4").warm_start()
    assert err.value.code == "model" and "gpt-4" in err.value.message
    with pytest.raises(EngineError) as err:
        connect(f"openai:http://127.0.0.1:{serve.port}/v1", api_key="wrong").warm_start()
    assert err.value.code == "unauthorized" and "wrong" not in err.value.message


def test_reconfigure_reaches_the_server_from_the_next_request(serve):
    """The options a request carries (max_new_tokens, temperature, top_p) go in every complete
    frame once set; a value outside the schema is refused before anything is sent."""
    r = connect(f"ws://127.0.0.1:{serve.port}", token=TOKEN, max_new_tokens=5)
    try:
        assert r.complete("import os\n", "", doc_key="n.py").new_tokens == 5  # the server's default: 24
        r.reconfigure(max_new_tokens=3, temperature=0.5, top_p=0.9, engine_timeout_ms=4000, kv_budget_mb=1)
        c = r.complete("import sys\n", "", doc_key="m.py")
        assert c.new_tokens == 3 and r.timeout == 4.0
        assert r.prompt_budget() == prompt_budget(r.info["ctx"], 3, r.info["max_draft_len"])
        with pytest.raises(EngineError) as err:
            r.reconfigure(temperature=-1)
        assert err.value.code == "bad_request" and "temperature" in err.value.message
    finally:
        r.close()


def test_repository_context_goes_in_the_frames(remote, serve):
    """`extra` reaches the server's prompt (more prompt tokens), and a warmup with the same chunks
    leaves that prompt cached for the completion after it."""
    from completer.client import Chunk

    extra = (Chunk("pkg/util.py", "def helper(x):\n    return x + 1\n"), Chunk("pkg/io.py", "def read(path):\n    ..."))
    plain = remote.complete("y = helper(", ")\n", doc_key="x1.py", max_new=2)
    with_extra = remote.complete("y = helper(", ")\n", doc_key="x2.py", max_new=2, extra=extra)
    assert with_extra.prompt_tokens > plain.prompt_tokens + 10
    warmed_up = 'completer_requests_total{kind="warmup",outcome="ok"}'
    before = serve.metric(warmed_up)
    remote.warmup("y = helper(", ")\n", doc_key="x3.py", extra=extra)
    assert serve.wait_metric(warmed_up, before + 1) == before + 1  # not answered: seen in /metrics
    warmed = remote.complete("y = helper(", ")\n", doc_key="x3.py", max_new=2, extra=extra)
    assert warmed.prompt_tokens == with_extra.prompt_tokens and warmed.prefill_tokens <= 1
