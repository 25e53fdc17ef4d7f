"""The next completion before Tab on remote engines (completer/remote/typethrough.py): with the
option `prefetch`, once a completion is shown the HTTP clients ask the server for the completion
after it, and accepting and asking again is answered from it; any other request stops it. Driven
against the fake HTTP engine (tests/helpers/fake_http.py: "a + b" for every completion), on both
llama-server's /infill and OpenAI's /v1/completions; every wait is on a state, never a clock."""
from __future__ import annotations

import json

import pytest
from helpers import wait_for
from helpers.fake_http import clients

PREFIX = "def f(a, b):\n    return "


def _cut(n: int):
    return lambda t: n if len(t) >= n else None


def _asked(fake, text: str) -> int:
    """POSTs whose body holds `text` (the prompt of a prefetch after it)."""
    return sum(text in json.dumps(b) for b in fake.bodies)


@pytest.mark.parametrize("kind", ["llamacpp", "openai"])
def test_accepting_is_answered_by_the_prefetch(fake, kind):
    cl = clients(fake, prefetch=True)[kind]
    first = cl.complete(PREFIX, "", doc_key="p.py")
    assert first.text == "a + b" and not first.prefetched
    wait_for(lambda: cl.stats()["prefetches"] == 1, 20, "the prefetch")
    accepted = json.dumps(PREFIX + "a + b")[1:-1]
    assert _asked(fake, accepted) == 1  # the continuation was asked once, in the background
    served = cl.complete(PREFIX + "a + b", "", doc_key="p.py", stop_text=_cut(2))
    assert (served.text, served.prefetched, served.new_tokens, served.stop_reason) == ("a ", True, 0, "stop")
    assert _asked(fake, accepted) == 1 and cl.stats()["prefetch_served"] == 1  # no request at request time
    # its continuation is prefetched next (a chain), and typing through the served text still works
    wait_for(lambda: cl.stats()["prefetches"] == 2, 20, "the chained prefetch")
    rest = cl.complete(PREFIX + "a + ba", "", doc_key="p.py")
    assert rest.type_through and rest.text == " "


@pytest.mark.parametrize("kind", ["llamacpp", "openai"])
def test_another_state_drops_it_and_the_option_turns_it_off(fake, kind):
    cl = clients(fake, prefetch=True)[kind]
    cl.complete(PREFIX, "", doc_key="p.py")
    wait_for(lambda: cl.stats()["prefetches"] == 1, 20, "the prefetch")
    cl.complete(PREFIX + "x", "", doc_key="p.py")  # the user typed something else: the prefetch is dropped
    assert not cl.complete(PREFIX + "a + b", "", doc_key="p.py").prefetched
    cl.forget("p.py")
    cl.reconfigure(prefetch=False)
    assert cl.settle(20)  # the prefetches the two requests queued: dropped, or ended if already asked
    before, made = len(fake.bodies), cl.stats()["prefetches"]
    cl.complete(PREFIX, "", doc_key="p.py")
    again = cl.complete(PREFIX + "a + b", "", doc_key="p.py")
    assert not again.prefetched and len(fake.bodies) == before + 2 and cl.stats()["prefetches"] == made
    assert cl.settle(20) and cl.stats()["prefetches"] == made and len(fake.bodies) == before + 2
    off = clients(fake)[kind]  # connect without options: off
    off.complete(PREFIX, "", doc_key="p.py")
    assert not off.complete(PREFIX + "a + b", "", doc_key="p.py").prefetched


@pytest.mark.parametrize("kind", ["llamacpp", "openai"])
def test_a_request_stops_a_running_prefetch(fake, kind):
    cl = clients(fake, prefetch=True)[kind]
    fake.mode = "trickle"  # every answer streams, a piece every 50 ms, until the client hangs up
    first = cl.complete(PREFIX, "", doc_key="p.py", max_new=10_000, stop_text=_cut(3))  # the prefetch: 10 000
    assert first.text == "aaa"
    wait_for(lambda: len(fake.bodies) == 2, 20, "the prefetch to be sent")  # it streams, endlessly
    other = cl.complete("x = ", "", doc_key="q.py", stop_text=_cut(3))  # another document's request
    assert other.text == "aaa" and cl.stats()["prefetch_cancelled"] == 1
    wait_for(lambda: cl.stats()["prefetches"] == 1, 20, "the stopped prefetch to end")
    fake.mode = "ok"
    # the stopped prefetch serves nothing: accepting asks the server
    assert not cl.complete(PREFIX + "aaa", "", doc_key="p.py").prefetched
