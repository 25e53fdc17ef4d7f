"""One client's next edits do not hold the others (issue 35, item 7): the diff behind a next edit is
bounded in work (counted: SequenceMatcher's pairs), and while a large next_edit frame is being
worked on, another connection's completion is answered — a real aiohttp server and WebSocket
clients, an engine stand-in, the order forced with events (no timing)."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import msgpack
import pytest
from aiohttp import web
from websockets.asyncio.client import connect

from completer.client import Completion
from completer.config import ServeConfig
from completer.edits import diff
from completer.edits.diff import MAX_DIFF_CELLS, opcodes, region_edits
from completer.serve import app as app_module
from completer.serve.app import EngineService
from completer.serve.workers import Workers

LINES = 10_000


@pytest.fixture
def cells(monkeypatch) -> list[int]:
    """The pairs each SequenceMatcher of completer/edits/diff.py was given (len(a) × len(b))."""
    seen: list[int] = []

    class Counted(diff.SequenceMatcher):
        def __init__(self, isjunk, a, b, autojunk):
            seen.append(len(a) * len(b))
            super().__init__(isjunk, a, b, autojunk)

    monkeypatch.setattr(diff, "SequenceMatcher", Counted)
    return seen


def _replayed(a: list[str], b: list[str]) -> list[str]:
    out = []
    for tag, i1, i2, j1, j2 in opcodes(a, b):
        assert tag != "equal" or a[i1:i2] == b[j1:j2]
        out += b[j1:j2]
    return out


@pytest.mark.parametrize("name, a, b", [
    ("identical", ["x = f(x)\n"] * LINES, ["x = f(x)\n"] * LINES),
    ("one line changed", ["x = f(x)\n"] * LINES, ["x = f(x)\n"] * 5000 + ["y\n"] + ["x = f(x)\n"] * 4999),
    ("one line added", ["x = f(x)\n"] * LINES, ["x = f(x)\n"] * 5000 + ["y\n"] + ["x = f(x)\n"] * 5000),
    ("nothing shared at the ends", ["a\n", "b\n"] * (LINES // 2), ["b\n", "a\n"] * (LINES // 2)),
])
def test_the_diff_of_ten_thousand_lines_is_bounded(cells, name, a, b):
    assert _replayed(a, b) == b
    assert sum(cells) <= MAX_DIFF_CELLS, (name, cells)  # 10 000 × 10 000 pairs before
    old, new = "".join(a), "".join(b)
    spans = diff.span_edits(old, new)
    assert sum(cells) <= 3 * MAX_DIFF_CELLS
    edits = region_edits(old, new, 0)
    assert diff.apply_edits(old, edits) == new and len(spans) == len(edits)


def test_next_edit_history_of_ten_thousand_lines_is_bounded(cells):
    """serve's next_edit frame reads its history from two versions (predict.from_versions): the
    same bound (8.8 s for 10 000 identical lines with difflib's own matcher)."""
    from completer.edits.predict import from_versions

    old = "x = f(x)\n" * LINES
    new = "x = f(x)\n" * 5000 + "y = 1\n" + "x = f(x)\n" * 5000
    items = from_versions(old, new, "m.py")
    assert [(h.old, h.new) for h in items] == [("", "y = 1\n")] and sum(cells) <= MAX_DIFF_CELLS


def test_small_diffs_are_sequence_matchers_own():
    a, b = list("abcabba"), list("cbabac")
    assert opcodes(a, b) == diff.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


# -- the server ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Sampling:
    temperature: float = 0.0
    top_p: float = 1.0


class _Engine:
    """What a plain completion asks of the engine, answered at once."""
    sampling = _Sampling()

    def complete(self, prefix: str, suffix: str, **kw) -> Completion:
        return Completion("1", new_tokens=1, stop_reason="eos")

    def forget(self, doc_key: str) -> None:
        pass


async def _ask(port: int, frame: dict) -> dict:
    async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
        await ws.send(msgpack.packb(frame))
        while True:
            r = msgpack.unpackb(await ws.recv())
            if r["type"] != "chunk":
                return r


async def test_a_completion_is_answered_while_two_large_next_edits_are_worked_on(monkeypatch):
    service = EngineService(ServeConfig(), make_engine=lambda: None)
    service.engine, service.workers, service.ready = _Engine(), Workers(1, 8), True  # one worker: the 1-core case
    entered, release = threading.Event(), threading.Event()
    compared = app_module.from_versions

    def held(before: str, text: str, path: str):  # the two versions' diff, held until the completion is answered
        entered.set()
        assert release.wait(60)
        return compared(before, text, path)

    monkeypatch.setattr(app_module, "from_versions", held)
    runner = web.AppRunner(service.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        text = "value = compute(value)\n" * LINES
        edits = [asyncio.create_task(_ask(port, {"type": "next_edit", "id": i, "text": text, "before": text,
                                                 "line": 0, "col": 0, "path": f"n{i}.py"})) for i in (1, 2)]
        assert await asyncio.to_thread(entered.wait, 60)
        # the first next edit is being worked on, the second waits behind it: a completion from
        # another connection is answered meanwhile (before: it waited for the one worker)
        done = await asyncio.wait_for(_ask(port, {"type": "complete", "id": 9, "doc": "c.py",
                                                  "prefix": "x = ", "stream": False}), 30)
        assert (done["type"], done["text"]) == ("done", "1") and not release.is_set()
        assert not any(t.done() for t in edits)
        release.set()
        for r in await asyncio.wait_for(asyncio.gather(*edits), 60):
            assert (r["type"], r["edits"], r["reason"]) == ("next_edit", [], "no_history")
    finally:
        release.set()
        service.stop()
        await runner.cleanup()
