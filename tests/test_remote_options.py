"""What the HTTP clients send, read from a recording fake server (helpers/fake_http.py): the
sampling options (temperature, top_p, seed) from `connect` and, after `reconfigure`, the new
values from the next request on (also timeouts, retries, length and type-through); repository
context (`extra`) as llama-server's `input_extra` and in the OpenAI client's rendered prompt."""
from __future__ import annotations

import pytest
from helpers.fake_http import KEY, clients

from completer.client import Chunk, EngineError

EXTRA = (Chunk("pkg/util.py", "def helper(x):\n    return x + 1\n"), Chunk("web/api.ts", "export function get(): number"))


def test_sampling_options_reach_the_server(fake):
    for name, c in clients(fake, temperature=0.7, top_p=0.9, seed=5).items():
        c.complete("a = ", "\n", doc_key=f"{name}.py")
        body = fake.bodies[-1]
        assert (body["temperature"], body["top_p"], body["seed"]) == (0.7, 0.9, 5), name


def test_reconfigure_applies_from_the_next_request(fake):
    for name, c in clients(fake).items():
        c.complete("a = ", "\n", doc_key="a.py")
        body = fake.bodies[-1]
        assert body["temperature"] == 0 and body["top_p"] == 1 and "seed" not in (body if name == "openai" else {})
        c.reconfigure(temperature=0.25, top_p=0.5, max_new_tokens=7, engine_timeout_ms=1500, engine_retries=0,
                      draft_len=3, target="elsewhere")  # not a remote client's: ignored
        c.complete("b = ", "\n", doc_key="b.py")
        body = fake.bodies[-1]
        assert (body["temperature"], body["top_p"]) == (0.25, 0.5), name
        assert body["n_predict" if name == "llamacpp" else "max_tokens"] == 7, name
        fake.mode = "hang"
        with pytest.raises(EngineError) as err:
            c.complete("c = ", "\n", doc_key="c.py")
        assert err.value.code == "unavailable" and "1500 ms" in err.value.message, name
        fake.mode = "ok"
        with pytest.raises(EngineError) as err:
            c.reconfigure(top_p=0)
        assert err.value.code == "bad_request" and "top_p" in err.value.message


def test_type_through_can_be_turned_off(fake):
    for name, c in clients(fake).items():
        first = c.complete("s = ", "\n", doc_key="t.py")  # "a + b"
        n = len(fake.bodies)
        assert c.complete("s = a", "\n", doc_key="t.py").text == first.text[1:]  # served without a request
        assert len(fake.bodies) == n, name
        c.reconfigure(type_through=False)
        c.complete("s = ", "\n", doc_key="t.py")
        c.complete("s = a", "\n", doc_key="t.py")
        assert len(fake.bodies) == n + 2, name


def test_repository_context_goes_to_the_server(fake):
    c = clients(fake)
    c["llamacpp"].complete("x = ", "\n", doc_key="x.py", extra=EXTRA)
    assert fake.bodies[-1]["input_extra"] == [{"filename": ch.path, "text": ch.text} for ch in EXTRA]
    c["llamacpp"].warmup("x = ", "\n", doc_key="x.py", extra=EXTRA)
    assert fake.bodies[-1]["input_extra"] == [{"filename": ch.path, "text": ch.text} for ch in EXTRA]
    c["openai"].complete("x = ", "\n", doc_key="x.py", extra=EXTRA)  # the fake serves a Qwen: its file separators
    prompt = fake.bodies[-1]["prompt"]
    assert prompt.startswith("<|file_sep|>pkg/util.py\ndef helper(x):\n    return x + 1\n"
                             "<|file_sep|>web/api.ts\nexport function get(): number\n<|fim_prefix|>x = ")
    c["openai"].warmup("x = ", "\n", doc_key="x.py", extra=EXTRA)
    assert fake.bodies[-1]["prompt"] == prompt  # the warmup prefills what the completion asks for
    assert KEY not in prompt


def test_the_configured_options_reach_a_remote_engine_built_from_them(fake):
    """pipeline.make_engine (the CLI's and the language server's way to build an engine) hands
    the configured options to the client."""
    from completer.pipeline import make_engine

    c = make_engine(f"llamacpp:{fake.base}", engine_api_key=KEY, temperature=0.4, top_p=0.8, seed=9,
                    max_new_tokens=11, draft_len=2)
    c.complete("a = ", "\n", doc_key="m.py")
    body = fake.bodies[-1]
    assert (body["temperature"], body["top_p"], body["seed"], body["n_predict"]) == (0.4, 0.8, 9, 11)
