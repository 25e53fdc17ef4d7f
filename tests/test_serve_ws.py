"""The WebSocket endpoint of `completer serve` (completer/serve/ws.py) over the wire: a real
subprocess on the tiny pair (the session's `served`), a real websockets client. Streaming,
warmups and repository context, cancellation, malformed frames (each answered, the server keeps
serving), a fuzz of 10 000 hostile frames, forget and feedback, the in-flight limit."""
from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import msgpack
import pytest
from helpers.serve import AUTH, TOKEN, ask, metric, metrics
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from completer.serve import protocol

pytestmark = pytest.mark.slow


@pytest.fixture
def server(served) -> str:
    return served[1]


async def run(ws, frame) -> tuple[list[str], dict]:
    """Send a complete frame; (chunk texts, done frame)."""
    await ws.send(msgpack.packb(frame))
    chunks = []
    while True:
        r = msgpack.unpackb(await ws.recv())
        assert r["id"] == frame["id"], r
        if r["type"] == "chunk":
            chunks.append(r["text"])
        else:
            return chunks, r


async def test_streams_a_completion(server):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        hello = await ask(ws, {"type": "hello", "client": "test"})
        assert hello["server"] == "completer" and hello["ready"] and hello["model"]["ctx"] == 256
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}
        frame = {"type": "complete", "id": 1, "doc": "a.py", "prefix": "def add(a, b):\n    return ",
                 "suffix": "\n"}
        chunks, done = await run(ws, frame)
        assert done["type"] == "done" and not done["cancelled"]
        assert chunks and "".join(chunks) == done["text"]
        st = done["stats"]
        assert st["new_tokens"] == 24 and st["prompt_tokens"] == st["prefill_tokens"] > 0
        for k in ("ttft_ms", "total_ms", "target_forwards", "accepted_per_forward", "queue_ms"):
            assert k in st
        # the same document again: its KV cache is kept (no prefill beyond the last token)
        _, again = await run(ws, {**frame, "id": "two", "prefix": frame["prefix"] + "a", "stream": False,
                                  "language": "python"})
        st = again["stats"]  # through the syntax layer (language given): its decisions come along, flat
        assert st["gate"] and st["node_kind"] == "return_statement" and st["language"] == "python"
        assert st["type_through"] or st["prefill_tokens"] <= 3


# a file longer than the tiny pair's 256-token context: the syntax layer's window differs from the raw text
LONG = "".join(f"def f{i}(x):\n    return x * {i}\n\n\n" for i in range(40))
LONG_PREFIX, LONG_SUFFIX = LONG + "def total(xs):\n    return ", "\n\n\nprint(total([1, 2]))\n"


async def _warm(ws, server: str, frame: dict) -> None:
    """Send a warmup frame (not answered) and wait until the server counts it done."""
    name = 'completer_requests_total{kind="warmup",outcome="ok"}'
    before = metric(await asyncio.to_thread(metrics, server), name)
    await ws.send(msgpack.packb(frame))
    while metric(await asyncio.to_thread(metrics, server), name) == before:
        await asyncio.sleep(0.02)


async def test_a_warmup_with_a_language_leaves_the_prompt_the_complete_uses(server):
    """The warmup goes through the syntax layer like the complete that follows: the complete
    finds its whole prompt cached. The raw prefix/suffix (no language) leaves another prompt."""
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        prefills = {}
        for doc, language in (("raw.py", None), ("syntax.py", "python")):
            warm = {"type": "warmup", "doc": doc, "prefix": LONG_PREFIX, "suffix": LONG_SUFFIX}
            await _warm(ws, server, {**warm, "language": language} if language else warm)
            _, done = await run(ws, {"type": "complete", "id": doc, "doc": doc, "prefix": LONG_PREFIX,
                                     "suffix": LONG_SUFFIX, "language": "python", "stream": False})
            assert done["type"] == "done" and done["stats"]["gate"] != "empty", done
            prefills[doc] = done["stats"]["prefill_tokens"]
    assert prefills["syntax.py"] <= 1 and prefills["raw.py"] > 32, prefills


CHUNKS = [{"path": "pkg/util.py", "text": "def helper(x):\n    return x + 1\n"},
          {"path": "pkg/io.py", "text": "def read(path):\n    ..."}]


async def test_repository_context_goes_into_the_prompt_and_its_warmup(server):
    """`extra` chunks are in the prompt (more tokens), and a warmup with them leaves the prompt
    that the complete with them reads (only the last token computed)."""
    frame = {"type": "complete", "doc": "ctx.py", "prefix": "y = helper(", "suffix": ")\n", "stream": False,
             "max_new_tokens": 2}
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        _, plain = await run(ws, {**frame, "id": 1})
        _, with_extra = await run(ws, {**frame, "id": 2, "doc": "ctx2.py", "extra": CHUNKS})
        assert with_extra["stats"]["prompt_tokens"] > plain["stats"]["prompt_tokens"] + 10, (plain, with_extra)
        await _warm(ws, server, {"type": "warmup", "doc": "ctx3.py", "prefix": frame["prefix"],
                                 "suffix": frame["suffix"], "max_new_tokens": 2, "extra": CHUNKS})
        _, warmed = await run(ws, {**frame, "id": 3, "doc": "ctx3.py", "extra": CHUNKS})
        assert warmed["stats"]["prompt_tokens"] == with_extra["stats"]["prompt_tokens"]
        assert warmed["stats"]["prefill_tokens"] <= 1, warmed


async def test_repository_context_in_frames_is_bounded(server):
    """`extra` [{path, text}]: checked and bounded, each mistake a bad_request naming it."""
    base = {"type": "complete", "doc": "x.py", "prefix": "x = ", "stream": False}
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        for i, (extra, words) in enumerate((
                ("util.py", "must be a list"),
                (["util.py"], 'extra[0]" must be a map'),
                ([{"path": "util.py"}], 'extra[0]": missing field "text"'),
                ([{"path": "", "text": "x"}], "extra[0].path"),
                ([{"path": 7, "text": "x"}], 'field "path" must be a string'),
                ([{"path": "a.py", "text": ""}] * (protocol.MAX_CHUNKS + 1), f"at most {protocol.MAX_CHUNKS}"))):
            for frame in ({**base, "id": i, "extra": extra}, {"type": "warmup", "doc": "x.py", "prefix": "x",
                                                              "extra": extra}):
                err = await ask(ws, frame)
                assert err["type"] == "error" and err["code"] == "bad_request" and words in err["message"], err
        err = await ask(ws, {**base, "id": "t", "temperature": 99})
        assert err["code"] == "bad_request" and "temperature" in err["message"]
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


async def test_cancel_and_supersede(server):
    async with connect(f"ws://{server}/ws?token={TOKEN}") as ws:
        base = {"type": "complete", "doc": "b.py", "prefix": "import os\n", "suffix": "", "max_new_tokens": 120}
        await ws.send(msgpack.packb({**base, "id": 1}))
        await ws.send(msgpack.packb({"type": "cancel", "id": 1}))
        frames = []
        while not any(f["type"] == "done" for f in frames):
            frames.append(msgpack.unpackb(await ws.recv()))
        assert frames[-1]["cancelled"] is True
        await ws.send(msgpack.packb({"type": "cancel", "id": "never-sent"}))  # ignored, no reply
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


@pytest.mark.parametrize("frame, code", [
    (b"\xc1\x00", "bad_frame"),                                   # not msgpack
    (msgpack.packb([1, 2, 3]), "bad_frame"),                      # not a map
    (msgpack.packb({"id": 1}), "bad_frame"),                      # no type
    ("a text frame", "bad_frame"),
    (msgpack.packb({"type": "teleport", "id": 9}), "unknown_type"),
    (msgpack.packb({"type": "complete", "id": 2, "doc": 5, "prefix": "x"}), "bad_request"),
    (msgpack.packb({"type": "complete", "id": 3, "doc": "d"}), "bad_request"),
    (msgpack.packb({"type": "complete", "id": [1], "doc": "d", "prefix": "x"}), "bad_request"),
    (msgpack.packb({"type": "complete", "id": 4, "doc": "d", "prefix": "x", "max_new_tokens": 10**6}),
     "bad_request"),
    (msgpack.packb({"type": "complete", "id": 5, "doc": "d", "prefix": "x", "stream": "yes"}), "bad_request"),
    (msgpack.packb({"type": "feedback", "id": 1, "accepted": "no"}), "bad_request"),
    (msgpack.packb({"type": "warmup", "doc": "d"}), "bad_request"),
    (msgpack.packb({"type": "ping", "pad": "x" * 5000}), "too_large"),
])
async def test_malformed_frames_get_errors_and_the_server_keeps_serving(server, frame, code):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        err = await ask(ws, frame)
        assert err["type"] == "error" and err["code"] == code and err["message"]
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}  # the connection survives


async def test_oversized_beyond_the_hard_limit_closes_only_that_connection(server):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        await ws.send(b"\x00" * (64 * 1024))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


async def test_lone_surrogates_in_a_frame_are_replaced(server):
    """A JavaScript msgpack encoder writes a lone surrogate (a string cut inside a pair) as its
    3-byte WTF-8 form: the frame is answered (U+FFFD in its place), not refused or a 500."""
    pack = msgpack.Packer(unicode_errors="surrogatepass").pack
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        await ws.send(pack({"type": "complete", "id": "s\ud83d", "doc": "cut.py", "prefix": "s = '\ud83d",
                            "suffix": "\ude00'\n", "stream": False}))
        done = msgpack.unpackb(await ws.recv())
    assert done["type"] == "done" and done["id"] == "s\ufffd", done


async def test_forget_frees_the_document_and_feedback_reaches_the_engine(server):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        frame = {"type": "complete", "id": 1, "doc": "f.py", "prefix": "import sys\n", "stream": False}
        _, first = await run(ws, frame)
        _, again = await run(ws, {**frame, "id": 2})  # kept: served from the cache or the last completion
        assert again["stats"]["type_through"] or again["stats"]["prefill_tokens"] < first["stats"]["prompt_tokens"]
        accepted = metric(metrics(server), "completer_engine_feedback_accepted")
        await ws.send(msgpack.packb({"type": "feedback", "id": 2, "accepted": True, "accepted_chars": 2,
                                     "doc": "f.py", "text": again["text"]}))
        await ws.send(msgpack.packb({"type": "forget", "doc": "f.py"}))  # no reply
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}  # frames are handled in order
        _, fresh = await run(ws, {**frame, "id": 3})
        st = fresh["stats"]
        assert not st["type_through"] and st["prefill_tokens"] == st["prompt_tokens"] > 0
        assert metric(metrics(server), "completer_engine_feedback_accepted") == accepted + 1


async def test_too_many_in_flight_is_overloaded_with_a_retry_hint(server):
    async with connect(f"ws://{server}/ws", additional_headers=AUTH) as ws:
        for i in range(5):  # --max-inflight 4; the frames are handled before any generation ends
            await ws.send(msgpack.packb({"type": "complete", "id": i, "doc": f"o{i}.py", "prefix": "x = ",
                                         "max_new_tokens": 120}))
        done, errors = set(), []
        while len(done) + len(errors) < 5:
            r = msgpack.unpackb(await ws.recv())
            if r["type"] == "done":
                done.add(r["id"])
            elif r["type"] == "error":
                errors.append(r)
        assert done == {0, 1, 2, 3}
        assert [(e["id"], e["code"]) for e in errors] == [(4, "overloaded")] and errors[0]["retry_after_ms"] > 0


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1))


def _hostile(rng: random.Random, max_frame: int):
    """One hostile frame (bytes or str) and whether it is beyond the hard limit (closes the connection)."""
    junk = [None, True, -1, 2**64 - 1, -2**63, 1.5, float("nan"), "", "x" * 300, b"\x00\xff", [], [1, [2]], {},
            {"a": {"b": None}}, {1: 2}]
    kind = rng.randrange(12)
    if kind == 0:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64))), False
    if kind == 1:  # truncated msgpack of a real frame
        whole = msgpack.packb({"type": "complete", "id": rng.randrange(99), "doc": "t.py", "prefix": "def f(x):\n"})
        return whole[: rng.randrange(len(whole))], False
    if kind == 2:  # deeply nested arrays or maps, bare or inside a field
        depth = rng.choice([50, 500, 1000, 1500])
        unit = rng.choice([b"\x91", b"\x81\xa1a"])
        nested = unit * depth + b"\xc0"
        return (nested if rng.random() < .5 else b"\x82\xa4type\xa8complete\xa3doc" + nested), False
    if kind == 3:  # not a map
        return msgpack.packb(rng.choice(junk[:-3])), False
    if kind == 4:  # a text frame
        return "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randrange(40))), False
    if kind == 5:  # over the frame limit: an error frame; rarely beyond 4x: the connection closes
        if rng.random() < .02:
            return b"\x00" * (4 * max_frame + 1), True
        return msgpack.packb({"type": "ping", "pad": "x" * rng.randrange(max_frame, 4 * max_frame - 64)}), False
    if kind == 6:  # unknown types, or a type that is not a string
        return msgpack.packb({"type": rng.choice(["teleport", "COMPLETE", "", "\x00", "hello" * 50,
                                                  *junk[2:5]]), "id": 1}), False
    if kind == 7:  # cancel storm, on a live request too
        return msgpack.packb({"type": "cancel", "id": rng.choice([rng.randrange(8), "storm", "storm", *junk])}), False
    # real types with wrong fields: at least one required field wrong or missing, others random
    typ = rng.choice(["complete", "warmup", "feedback", "forget", "hello", "cancel"])
    frame = {"type": typ, "id": rng.randrange(1000)}
    schema = {"complete": ["id", "doc", "prefix", "suffix", "language", "max_new_tokens", "stream", "node_kind"],
              "warmup": ["doc", "prefix", "suffix", "language"], "feedback": ["id", "accepted", "accepted_chars",
              "doc", "text"], "forget": ["doc"], "hello": ["token", "client"], "cancel": ["id"]}[typ]
    for name in schema:
        if rng.random() < .7:
            frame[name] = rng.choice(junk)
    if typ == "complete":
        frame["prefix"] = rng.choice(junk[:5])  # never a string: no generation starts
    return msgpack.packb(frame), False


async def test_fuzz_ten_thousand_hostile_frames(served):
    """Every 500 hostile frames, a real completion still gets its done; the process lives on and
    its memory does not grow."""
    proc, server = served
    rng = random.Random(1234)
    replies: list[dict] = []

    async def reader(ws):
        try:
            async for m in ws:
                replies.append(msgpack.unpackb(m, strict_map_key=False))
        except ConnectionClosed:
            pass

    ws = await connect(f"ws://{server}/ws", additional_headers=AUTH, max_size=None)
    task = asyncio.create_task(reader(ws))
    rss0, sent, closed, answered = None, 0, 0, 0
    for batch in range(20):
        await ws.send(msgpack.packb({"type": "complete", "id": "storm", "doc": "storm.py", "prefix": "import os\n",
                                     "max_new_tokens": 60}))
        for _ in range(500):
            frame, closes = _hostile(rng, 4096)
            if closes:  # its own connection: the server closes it with 1009
                async with connect(f"ws://{server}/ws", additional_headers=AUTH, max_size=None) as side:
                    await side.send(frame)
                    with pytest.raises(ConnectionClosed):
                        await side.recv()
                closed += 1
            else:
                await ws.send(frame)
            sent += 1
        await ws.send(msgpack.packb({"type": "ping"}))
        await ws.send(msgpack.packb({"type": "complete", "id": f"real{batch}", "doc": "real.py",
                                     "prefix": f"def f{batch}(x):\n    return ", "max_new_tokens": 8}))
        while not any(r.get("type") == "done" and r.get("id") == f"real{batch}" for r in replies):
            assert not task.done(), "the connection closed"
            await asyncio.sleep(0.005)
        done = next(r for r in replies if r.get("type") == "done" and r["id"] == f"real{batch}")
        assert not done["cancelled"] and done["stats"]["new_tokens"] > 0
        assert {"type": "pong"} in replies
        for r in replies:
            assert r["type"] in ("error", "chunk", "done", "pong", "hello"), r
            if r["type"] == "error":
                assert r["code"] in ("bad_frame", "bad_request", "unknown_type", "too_large", "overloaded"), r
                assert r["code"] != "overloaded" or r["retry_after_ms"] > 0
        answered += sum(r["type"] == "error" for r in replies)
        replies.clear()
        if batch == 1:
            rss0 = _rss_kb(proc.pid)
    assert sent == 10_000 and closed > 0 and answered > 8_000 and proc.poll() is None
    assert _rss_kb(proc.pid) < 1.1 * rss0
    await ws.close()
    await task
