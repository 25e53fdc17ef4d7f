"""The OpenAI-compatible endpoints of `completer serve`, through plain HTTP clients against a real
server on the embedded pair: a completion (plain and streamed) equals the WebSocket's for the same
prompt, stop sequences, /v1/models, the token and Origin rules, OpenAI's error shapes (400, 401,
403, 404, 413), and a client that hangs up mid-stream cancels its generation."""
from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import msgpack
import pytest
from helpers.serve import metric, start_server, stop_server
from tokenizers import Tokenizer
from websockets.asyncio.client import connect

from draft_models import DEFAULT_TARGET

pytestmark = pytest.mark.slow

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "def fib(n):\n    if n < 2:\n        return n\n    return "
SUFFIX = "\n\n\nprint(fib(10))\n"
TOKENIZER = Tokenizer.from_file(str(DEFAULT_TARGET / "tokenizer.json"))  # the served (embedded) target's


@pytest.fixture(scope="module")
def server():
    p, addr = start_server("--token", TOKEN, "--max-frame-bytes", "65536", "--max-new-tokens", "32")
    yield addr
    stop_server(p)


def call(server: str, path: str, body=None, headers=AUTH, raw: bytes | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or a POST."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{server}{path}", data=data,
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def stream(server: str, body: dict) -> list:
    """The events of a streamed completion: chunk objects, then "[DONE]"."""
    conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), AUTH)
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    events = [line[len(b"data: "):].strip() for line in r if line.startswith(b"data: ")]
    conn.close()
    return [e.decode() if e == b"[DONE]" else json.loads(e) for e in events]


def is_error(status: int, body: dict, want_status: int, code: str | None = None) -> bool:
    e = body["error"]
    return (status == want_status and set(e) == {"message", "type", "param", "code"} and bool(e["message"])
            and (code is None or e["code"] == code))


async def test_a_completion_equals_the_websocket_one(server):
    status, models = await asyncio.to_thread(call, server, "/v1/models")
    assert status == 200 and models["object"] == "list"
    model = models["data"][0]["id"]
    body = {"model": model, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 24, "temperature": 0, "user": "fib"}
    status, r = await asyncio.to_thread(call, server, "/v1/completions", body)
    assert status == 200 and r["object"] == "text_completion" and r["model"] == model and r["id"]
    (choice,) = r["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] in ("stop", "length")
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        await ws.send(msgpack.packb({"type": "complete", "id": 1, "doc": "fib.py", "prefix": PREFIX,
                                     "suffix": SUFFIX, "max_new_tokens": 24, "stream": False}))
        done = msgpack.unpackb(await ws.recv())
    assert done["type"] == "done" and choice["text"] == done["text"] != ""  # greedy: the same tokens
    u = r["usage"]
    assert u["completion_tokens"] == len(TOKENIZER.encode(choice["text"], add_special_tokens=False).ids) > 0
    assert u["completion_tokens"] <= done["stats"]["new_tokens"]  # the text's tokens, not every one decoded
    assert u["prompt_tokens"] == done["stats"]["prompt_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_streamed_equals_plain_and_stop_sequences_cut_both(server):
    body = {"prompt": "import os\nimport sys\n", "max_tokens": 24}
    status, r = call(server, "/v1/completions", body)
    text = r["choices"][0]["text"]
    assert status == 200 and len(text) >= 6
    events = stream(server, body)
    assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    chunks = events[:-1]
    assert len({e["id"] for e in chunks}) == 1 and all(e["object"] == "text_completion" for e in chunks)
    assert [e["choices"][0]["finish_reason"] for e in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"]
    assert "".join(e["choices"][0]["text"] for e in chunks) == text
    stop = text[4:6]
    cut = text[: text.find(stop)]
    status, r = call(server, "/v1/completions", {**body, "stop": [stop, "never-generated"]})
    assert status == 200 and r["choices"][0]["text"] == cut and r["choices"][0]["finish_reason"] == "stop"
    chunks = stream(server, {**body, "stop": stop})[:-1]
    assert "".join(e["choices"][0]["text"] for e in chunks) == cut  # not even part of the stop went out
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body, raw, status, code", [
    (None, b"{not json", 400, "bad_request"),
    (None, b"[" * 100_00 + b"]" * 100_00, 400, "bad_request"),          # nesting beyond the parser
    ([1, 2], None, 400, "bad_request"),
    ({"suffix": "x"}, None, 400, "bad_request"),                        # no prompt
    ({"prompt": ["a", "b"]}, None, 400, "bad_request"),
    ({"prompt": "x", "max_tokens": "9"}, None, 400, "bad_request"),
    ({"prompt": "x", "max_tokens": 10**6}, None, 400, "bad_request"),
    ({"prompt": "x", "temperature": 7}, None, 400, "bad_request"),
    ({"prompt": "x", "stop": ["a", 1]}, None, 400, "bad_request"),
    ({"prompt": "x", "stream": "yes"}, None, 400, "bad_request"),
    ({"prompt": "x", "n": 6}, None, 400, "bad_request"),  # n: 1..5 (the option alternatives)
    ({"prompt": "x", "model": "gpt-4"}, None, 404, "model_not_found"),
    ({"prompt": "x" * 70_000}, None, 413, "too_large"),
    ({"prompt": "x", "extra": {"path": "a.py", "text": ""}}, None, 400, "bad_request"),
    ({"prompt": "x", "extra": [{"path": "a.py"}]}, None, 400, "bad_request"),
    ({"prompt": "x", "extra": [{"path": "a.py", "text": ""}] * 65}, None, 400, "bad_request"),
])
def test_bad_requests_get_openai_errors(server, body, raw, status, code):
    got, r = call(server, "/v1/completions", body, raw=raw)
    assert is_error(got, r, status, code), r
    if isinstance(body, dict) and "extra" in body:
        assert r["error"]["param"] == "extra" and "extra" in r["error"]["message"]
    assert call(server, "/v1/models")[0] == 200  # the server keeps serving


def test_token_origin_and_paths(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert is_error(*call(server, "/v1/models", headers=headers), 401)
        assert is_error(*call(server, "/v1/completions", {"prompt": "x"}, headers=headers), 401)
    assert call(server, "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert is_error(*call(server, "/v1/models", headers={**AUTH, "Origin": "https://evil.example"}), 403)
    req = urllib.request.Request(f"http://{server}/v1/models", headers={**AUTH, "Origin": "http://localhost:5173"})
    with urllib.request.urlopen(req) as r:  # a local page may read the answer
        assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert is_error(*call(server, "/v1/chat/nope"), 404)


def test_hanging_up_mid_stream_cancels_the_generation(server):
    def cancelled() -> float:
        with urllib.request.urlopen(urllib.request.Request(f"http://{server}/metrics", headers=AUTH)) as r:
            return metric(r.read().decode(), "completer_engine_stops_cancelled")

    before = cancelled()
    conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "import os\nimport sys\n", "max_tokens": 256,
                                                        "stream": True, "user": "gone"}), AUTH)
    r = conn.getresponse()
    assert r.status == 200 and next(line for line in r if line.startswith(b"data: "))
    r.close()  # hang up after the first chunk: 256 tokens take far longer than one
    conn.close()
    deadline = time.monotonic() + 60
    while cancelled() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cancelled() == before + 1


def test_a_full_queue_is_429_with_a_retry_hint():
    """One generation at a time and one waiting: of two more requests one waits, the other is
    refused at once with 429 and Retry-After; once the first client hangs up the waiting one runs."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    p, server = start_server("--token", TOKEN, "--max-batch", "1", "--max-queue", "1")
    try:
        conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "import os\n", "max_tokens": 256,
                                                            "stream": True, "user": "a"}), AUTH)
        r = conn.getresponse()
        assert next(line for line in r if line.startswith(b"data: "))  # generating (256 tokens: seconds)
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(call_with_headers, server, {"prompt": "x = ", "max_tokens": 4, "user": u})
                    for u in ("b", "c")]
            first = wait(futs, return_when=FIRST_COMPLETED).done.pop()
            status, headers, body = first.result()
            assert is_error(status, body, 429, "overloaded") and int(headers["Retry-After"]) >= 1
            r.close()
            conn.close()  # the first client hangs up: the waiting request runs
            (other,) = [f for f in futs if f is not first]
            assert other.result()[0] == 200
    finally:
        stop_server(p)


def call_with_headers(server: str, body: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(f"http://{server}/v1/completions", data=json.dumps(body).encode(), headers=AUTH)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.load(e)


# -- what OpenAI clients send (Continue, Tabby, openai-node, the openai package) ---------------------
def test_fim_clients_stops_and_a_prompt_list_of_one(server):
    stops = ["\n\n", "<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "```",
             "\nclass ", "\ndef ", "\n#", "<|fim_pad|>", "<|repo_name|>", "\nif ", "\nprint", "//", "/*"]
    body = {"prompt": "import os\nimport sys\n", "max_tokens": 16, "stop": stops}
    status, plain = call(server, "/v1/completions", body)
    assert status == 200, plain
    status, listed = call(server, "/v1/completions", {**body, "prompt": [body["prompt"]]})
    assert status == 200 and listed["choices"][0]["text"] == plain["choices"][0]["text"]
    assert is_error(*call(server, "/v1/completions", {**body, "stop": stops + ["x"]}), 400, "bad_request")
    assert is_error(*call(server, "/v1/completions", {**body, "prompt": [1, 2, 3]}), 400, "bad_request")
    assert is_error(*call(server, "/v1/completions", {**body, "prompt": []}), 400, "bad_request")


def test_temperature_and_top_p_apply_to_the_request(server):
    body = {"prompt": "def main():\n    ", "max_tokens": 24}
    greedy = {call(server, "/v1/completions", {**body, "temperature": 0, "user": f"g{i}"})[1]["choices"][0]["text"]
              for i in range(2)}
    assert len(greedy) == 1
    sampled = {call(server, "/v1/completions", {**body, "temperature": 1.5, "user": f"s{i}"})[1]["choices"][0]["text"]
               for i in range(4)}
    assert sampled - greedy  # sampled: not the greedy text every time
    # top-p this small keeps only the most likely token: greedy again, through rejection sampling
    narrow = {call(server, "/v1/completions", {**body, "temperature": 1.5, "top_p": 1e-6,
                                               "user": f"n{i}"})[1]["choices"][0]["text"] for i in range(2)}
    assert narrow == greedy


def test_usage_of_a_stream_and_of_a_type_through_answer(server):
    body = {"prompt": "import os\nimport sys\n", "max_tokens": 16}
    status, plain = call(server, "/v1/completions", {**body, "user": "usage-a"})
    assert status == 200 and plain["usage"]["completion_tokens"] > 0
    events = stream(server, {**body, "user": "usage-b", "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"] == plain["usage"]
    assert all("usage" not in e for e in events[:-2])
    assert "usage" not in stream(server, {**body, "user": "usage-c"})[-2]  # only when asked for
    text = plain["choices"][0]["text"]
    status, r = call(server, "/v1/completions", {**body, "prompt": body["prompt"] + text[:3], "user": "usage-a"})
    assert status == 200 and r["choices"][0]["text"] == text[3:]  # typed through: served without the model
    u = r["usage"]
    assert u["prompt_tokens"] > plain["usage"]["prompt_tokens"] // 2 and u["completion_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_preflight_allows_the_headers_asked_for_and_a_model_by_id(server):
    conn = http.client.HTTPConnection(*server.split(":"), timeout=30)
    asked = "authorization, content-type, x-stainless-lang, x-stainless-retry-count, x-stainless-timeout"
    conn.request("OPTIONS", "/v1/completions", headers={"Origin": "http://localhost:5173",
                                                       "Access-Control-Request-Method": "POST",
                                                       "Access-Control-Request-Headers": asked})
    r = conn.getresponse()
    allowed = {h.strip().lower() for h in r.getheader("Access-Control-Allow-Headers").split(",")}
    assert r.status == 204 and {h.strip() for h in asked.split(",")} <= allowed
    conn.close()
    model = call(server, "/v1/models")[1]["data"][0]
    status, got = call(server, "/v1/models/" + urllib.parse.quote(model["id"], safe=""))
    assert status == 200 and got == model
    assert is_error(*call(server, "/v1/models/gpt-4"), 404, "model_not_found")


def test_a_superseded_request_says_so(server):
    """A newer request with the same `user` supersedes an older one: the older one's stream ends
    with a "superseded" error event; a plain one is 409, marked not to be retried."""
    long = {"prompt": "import os\nimport sys\n", "max_tokens": 256, "user": "sup"}
    conn = http.client.HTTPConnection(*server.split(":"), timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({**long, "stream": True}), AUTH)
    r = conn.getresponse()
    assert next(line for line in r if line.startswith(b"data: "))  # generating (256 tokens: about a second)
    assert call(server, "/v1/completions", {"prompt": "x = ", "max_tokens": 4, "user": "sup"})[0] == 200
    events = [json.loads(line[6:]) for line in r if line.startswith(b"data: ") and line.strip() != b"data: [DONE]"]
    conn.close()
    assert events[-1]["error"]["code"] == "superseded"

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        older = pool.submit(call_with_headers, server, long)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not older.done() and not live(server):
            time.sleep(0.01)
        assert call(server, "/v1/completions", {"prompt": "x = ", "max_tokens": 4, "user": "sup"})[0] == 200
        status, headers, body = older.result()
    assert is_error(status, body, 409, "superseded") and headers["x-should-retry"] == "false"


def live(server: str) -> bool:
    with urllib.request.urlopen(urllib.request.Request(f"http://{server}/metrics", headers=AUTH)) as r:
        return metric(r.read().decode(), "completer_engine_queue_live") > 0


def test_lone_surrogates_are_replaced_not_a_500(server):
    raw = b'{"prompt": "s = \'\\ud83d", "suffix": "\\ude00\'\\n", "max_tokens": 4, "stop": ["\\ud83d"], "user": "\\udc00"}'
    status, r = call(server, "/v1/completions", raw=raw)
    assert status == 200 and r["object"] == "text_completion", r
    events = stream(server, json.loads(raw))
    assert events[-1] == "[DONE]"


def test_the_openai_client(server):
    import openai

    client = openai.OpenAI(base_url=f"http://{server}/v1", api_key=TOKEN, max_retries=0)
    mid = client.models.list().data[0].id
    assert client.models.retrieve(mid).id == mid
    stops = ["\n\n", "<|endoftext|>", "<file_sep>", "```", "\nclass ", "\ndef ", "\n#", "\nif ", "\nprint"]
    kw = {"model": mid, "prompt": [PREFIX], "suffix": SUFFIX, "max_tokens": 16, "temperature": 0, "stop": stops}
    r = client.completions.create(**kw, user="oa-1")
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    chunks = list(client.completions.create(**kw, user="oa-2", stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    # usage counts the tokens of the text returned (not the drafts a round verified past the stop's cut)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://{server}/v1", api_key="wrong", max_retries=0).models.list()


def test_extra_is_repository_context_in_the_prompt(server):
    """Our optional `extra` field: the chunks go in the prompt (more prompt tokens), and a
    mistake in it is a 400 naming it (test_bad_requests_get_openai_errors)."""
    body = {"prompt": "y = helper(", "suffix": ")\n", "max_tokens": 2, "user": "extra"}
    chunks = [{"path": "pkg/util.py", "text": "def helper(x):\n    return x + 1\n"}]
    status, plain = call(server, "/v1/completions", body)
    assert status == 200
    status, with_extra = call(server, "/v1/completions", {**body, "user": "extra2", "extra": chunks})
    assert status == 200 and with_extra["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 5
