"""The `next_edit` frame of `completer serve` end to end: a real server on the embedded pair and a
real websockets client — the reply's shape (edits in the text's lines and character columns, the
engine's numbers), the reasons (no history), bad frames and bad input answered with error frames
while the connection keeps serving, cancellation, and the service's next-edit confidence gate."""
from __future__ import annotations

import msgpack
import pytest
from helpers.edits import applied
from helpers.serve import ask, metric, metrics, start_server, stop_server
from websockets.asyncio.client import connect as ws_connect

from completer.edits.diff import TextEdit, apply_edits

pytestmark = pytest.mark.slow

BEFORE = '''\
def add(name, value):
    path = "😀/" + name
    print("adding", name, value)
    return path, name
'''
TEXT = BEFORE.replace("def add(name,", "def add(key,")


@pytest.fixture(scope="module")
def server():
    """The shipped pair: frames ask it with "format": "completer" although it was never taught
    next edits (the default "auto" does not ask it): the frames and their numbers, not its answers."""
    p, addr = start_server("--device", "cpu")
    yield addr
    stop_server(p)


async def test_next_edit_frame(server):
    async with connect_ws(server) as ws:
        frame = {"type": "next_edit", "id": 7, "text": TEXT, "line": 0, "col": 11, "before": BEFORE,
                 "path": "add.py", "language": "python", "format": "completer", "rename_first": False}
        r = await ask(ws, frame)
        assert r["type"] == "next_edit" and r["id"] == 7 and isinstance(r["edits"], list)
        assert {"new_tokens", "target_forwards", "accepted_per_forward", "total_ms", "speculative"} <= set(r["stats"])
        assert r["stats"]["new_tokens"] > 0 and r["stats"]["speculative"] is True
        assert (r["edits"] == []) == ("reason" in r)
        applied(TEXT, [TextEdit(**e) for e in r["edits"]])  # within the text, in order, each a change
        r = await ask(ws, {**frame, "id": "b", "before": TEXT})
        assert (r["type"], r["id"], r["edits"], r["reason"]) == ("next_edit", "b", [], "no_history")
        # "auto" does not ask the shipped pair; the rename name -> key is carried from the syntax tree
        auto = {k: v for k, v in frame.items() if k != "format"}
        r = await ask(ws, {**auto, "id": "c"})
        assert (r["stats"]["source"], r["stats"]["model_reason"], r["stats"]["new_tokens"]) == ("rename", "untrained", 0)
        assert apply_edits(TEXT, [TextEdit(**e) for e in r["edits"]]) == TEXT.replace("name", "key")
        default = {k: v for k, v in auto.items() if k != "rename_first"}  # the rename first: no model asked
        r = await ask(ws, {**default, "id": "e", "format": "completer"})
        assert (r["stats"]["source"], r["stats"]["new_tokens"], "model_reason" in r["stats"]) == ("rename", 0, False)
        assert apply_edits(TEXT, [TextEdit(**e) for e in r["edits"]]) == TEXT.replace("name", "key")
        r = await ask(ws, {**auto, "id": "d", "rename": False})
        assert (r["edits"], r["reason"]) == ([], "untrained")


async def test_the_jump_is_a_field_of_the_answer_beside_edits(server):
    # a function renamed at its def, used 30 lines further down (past the region): the frame's
    # `jump` names that place and carries its edit, at the top level like completer/nextEdit's
    before = "def fetch(url):\n    return url\n" + "".join(f"x{i} = {i}\n" for i in range(30)) + "y = fetch('a')\n"
    text = before.replace("def fetch(", "def fetch_all(")
    async with connect_ws(server) as ws:
        r = await ask(ws, {"type": "next_edit", "id": 9, "text": text, "line": 0, "col": 13, "before": before,
                           "path": "f.py", "language": "python"})
    assert (r["edits"], r["stats"]["source"], "jump" in r["stats"]) == ([], "rename", False), r
    assert r["jump"] == {"start_line": 32, "start_col": 4, "end_line": 32, "end_col": 9,
                         "edits": [{"start_line": 32, "start_col": 4, "end_line": 32, "end_col": 9, "text": "fetch_all"}]}


@pytest.mark.parametrize("bad, code", [
    ({"line": 99}, "bad_request"), ({"col": -1}, "bad_request"), ({"before": "no\ncommon\nlines\n"}, "bad_request"),
    ({"line": "0"}, "bad_request"), ({"text": None}, "bad_request"), ({"id": None}, "bad_request"),
    ({"rename": "yes"}, "bad_request"), ({"rename_first": 1}, "bad_request"),
])
async def test_bad_next_edit_frames_get_error_frames(server, bad, code):
    async with connect_ws(server) as ws:
        frame = {"type": "next_edit", "id": 1, "text": TEXT, "line": 0, "col": 11, "before": BEFORE, **bad}
        r = await ask(ws, {k: v for k, v in frame.items() if v is not None})
        assert r["type"] == "error" and r["code"] == code, r
        assert await ask(ws, {"type": "ping"}) == {"type": "pong"}


async def test_a_cancelled_next_edit_answers(server):
    # the model asked first (a rewrite of the region: many decode steps), so the cancel frame
    # finds it in flight; the rename rule would answer within a millisecond, before it is read
    async with connect_ws(server) as ws:
        await ws.send(msgpack.packb({"type": "next_edit", "id": 3, "text": TEXT, "line": 0, "col": 11,
                                     "before": BEFORE, "path": "add.py", "format": "completer",
                                     "rename_first": False}))
        await ws.send(msgpack.packb({"type": "cancel", "id": 3}))
        r = msgpack.unpackb(await ws.recv())
        assert r["type"] == "next_edit" and r["id"] == 3 and r["edits"] == [] and r["reason"] == "cancelled"


async def test_rewrite_frame_and_the_ws_engine(server):
    """A remote language server's next edit: the `rewrite` frame (WsEngine.rewrite) gives what
    the in-process engine gives for the same request."""
    import asyncio

    from completer.config import EngineConfig
    from completer.edits.formats import EditPrompt, HistoryItem
    from completer.engine.engine import Engine
    from completer.remote import connect

    req = EditPrompt((HistoryItem("add.py", BEFORE.splitlines(keepends=True)[0], TEXT.splitlines(keepends=True)[0]),),
                     "add.py", TEXT, 11)
    remote = connect(f"ws://{server}")
    got = await asyncio.to_thread(remote.rewrite, req, fmt="completer", doc_key="add.py", max_new=40)
    local = Engine(EngineConfig(device="cpu")).rewrite(req, fmt="completer", doc_key="x", max_new=40)
    assert (got.text, got.new_tokens, got.stop_reason) == (local.text, local.new_tokens, local.stop_reason)
    assert got.speculative and got.edit_format == "completer" and got.malformed is False
    plain = await asyncio.to_thread(remote.rewrite, req, fmt="completer", doc_key="add.py", max_new=40,
                                    speculative=False)
    assert (plain.text, plain.speculative, plain.accepted_per_forward) == (got.text, False, 1.0)
    async with connect_ws(server) as ws:
        frame = {"type": "rewrite", "id": 1, "doc": "a", "path": "a.py", "region": "x\n", "history": [3]}
        r = await ask(ws, frame)
        assert (r["type"], r["code"]) == ("error", "bad_request") and "history[0]" in r["message"]
        r = await ask(ws, {**frame, "history": [], "format": "nope"})
        assert (r["type"], r["code"]) == ("error", "bad_request") and "next-edit format" in r["message"]


def connect_ws(server):
    return ws_connect(f"ws://{server}/ws")


async def test_next_edit_feedback_is_counted(server):
    import asyncio


    name = 'completer_requests_total{kind="next_edit_feedback",outcome="accepted"}'
    async with connect_ws(server) as ws:
        before = metric(await asyncio.to_thread(metrics, server), name)
        await ws.send(msgpack.packb({"type": "feedback", "id": 7, "accepted": True, "kind": "next_edit"}))
        r = await ask(ws, {"type": "feedback", "id": 7, "accepted": True, "kind": "nope"})
        assert (r["type"], r["code"]) == ("error", "bad_request") and "kind" in r["message"]
        assert metric(await asyncio.to_thread(metrics, server), name) == before + 1


async def test_the_services_next_edit_gate_drops_and_counts():
    """`completer serve --next-edit-min-confidence 1`: no token of a rewrite is that sure, so the
    `next_edit` frame answers no edits with reason `unsure` (the refused token's probability in
    stats.confidence), and /metrics counts the drop."""
    import asyncio

    p, addr = start_server("--device", "cpu", "--next-edit-min-confidence", "1")
    try:
        async with connect_ws(addr) as ws:
            r = await ask(ws, {"type": "next_edit", "id": 1, "text": TEXT, "line": 0, "col": 11, "before": BEFORE,
                               "path": "add.py", "language": "python", "format": "completer", "rename": False})
            assert (r["edits"], r["reason"]) == ([], "unsure") and 0 < r["stats"]["confidence"] < 1
            # the rename rule stands in for the refused answer
            r = await ask(ws, {"type": "next_edit", "id": 2, "text": TEXT, "line": 0, "col": 11, "before": BEFORE,
                               "path": "add.py", "language": "python", "format": "completer", "rename_first": False})
            assert (r["stats"]["source"], r["stats"]["model_reason"]) == ("rename", "unsure")
            assert apply_edits(TEXT, [TextEdit(**e) for e in r["edits"]]) == TEXT.replace("name", "key")
        text = await asyncio.to_thread(metrics, addr)
        assert metric(text, "completer_engine_rewrites_unsure") == 2
        assert metric(text, "completer_engine_next_edit_min_confidence_in_force") == 1.0
    finally:
        stop_server(p)
