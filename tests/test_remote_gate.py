"""The confidence gate over a remote server's log-probabilities (completer/confidence.py's
StreamGate), the same contract through both remote clients against a real llama-server built by
.ci/llamacpp.sh: `llamacpp:` asks /infill for `n_probs`, `openai:` asks /v1/completions for
`logprobs` (llama-server streams them as a `content` list). min_confidence set: the completion
ends before the first less sure token, as the in-process engine's does; unset (a remote model
has no calibration here): off, and nothing is asked. The same for next edits' rewrites with
next_edit_min_confidence."""
from __future__ import annotations

import pytest
from helpers.llama import PREFIX, SUFFIX

from completer.edits.formats import EditPrompt, HistoryItem
from completer.remote.llamacpp import LlamaCpp
from completer.remote.openai import OpenAI

CLIENTS = {
    "llamacpp": lambda url: LlamaCpp(url, timeout_ms=20000, retries=1),
    "openai": lambda url: OpenAI(url + "/v1", fim_format="completer", timeout_ms=20000),
}


@pytest.fixture(params=sorted(CLIENTS))
def client(request, llama):
    c = CLIENTS[request.param](llama.url)
    c.warm_start()
    yield c
    close = getattr(c, "close", None)
    if close is not None:
        close()


@pytest.mark.slow
def test_the_confidence_gate_on_the_servers_log_probabilities(client):
    plain = client.complete(PREFIX, SUFFIX, doc_key="g.py", max_new=12)
    assert plain.text and plain.confidence is None and plain.unsure_text == ""
    client.reconfigure(min_confidence=1.0)  # no token is that sure: nothing is shown, nothing streamed
    deltas: list[str] = []
    none = client.complete(PREFIX, SUFFIX, doc_key="g.py", max_new=12, on_text=deltas.append)
    assert (none.text, none.stop_reason, deltas) == ("", "unsure", []) and none.unsure_text
    assert plain.text.startswith(none.unsure_text)
    client.reconfigure(min_confidence=0.2)
    some = client.complete(PREFIX, SUFFIX, doc_key="g.py", max_new=12, on_text=deltas.append)
    assert plain.text.startswith(some.text) and "".join(deltas) == some.text
    assert some.confidence is None if not some.text else some.confidence >= 0.2
    if some.stop_reason == "unsure":  # a word the refused token continues is taken back whole
        assert some.unsure_text and not (some.text[-1:].isalnum() and some.unsure_text[0].isalnum())
    client.reconfigure(min_confidence=None)
    assert client.complete(PREFIX, SUFFIX, doc_key="g.py", max_new=12).text == plain.text


@pytest.mark.slow
def test_the_next_edit_gate_on_the_servers_log_probabilities(client):
    """next_edit_min_confidence on a remote rewrite: a refused token ends the answer, and the answer
    is none (stop_reason "unsure", the refused token and its probability); unset: off, nothing asked."""
    req = EditPrompt((HistoryItem("g.py", "def area(r):\n", "def area(radius):\n"),), "g.py",
                     "def area(radius):\n    return 3.14 * r * r\n")
    plain = client.rewrite(req, fmt="completer", doc_key="e.py", max_new=8)
    assert plain.new_tokens > 0 and plain.stop_reason != "unsure" and plain.confidence is None
    client.reconfigure(next_edit_min_confidence=1.0)
    none = client.rewrite(req, fmt="completer", doc_key="e.py", max_new=8)
    assert (none.text, none.stop_reason, none.malformed) == ("", "unsure", False)
    assert none.unsure_text and 0 < none.confidence < 1
    client.reconfigure(next_edit_min_confidence=None)
    again = client.rewrite(req, fmt="completer", doc_key="e.py", max_new=8)
    assert (again.text, again.stop_reason, again.new_tokens) == (plain.text, plain.stop_reason, plain.new_tokens)
