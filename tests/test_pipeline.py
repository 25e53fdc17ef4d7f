"""The pipeline against a scripted engine (no model): what it sends, what it keeps."""
from __future__ import annotations

import threading

import pytest
from helpers.scripted import Scripted

from completer.client import EngineClient
from completer.documents import PositionError, parse_snapshot
from completer.pipeline import CompletionOptions, complete_at, warmup_at
from completer.syntax import SyntaxOptions

SRC = "import os\n\n\ndef area(w, h):\n    \n\n\ndef main():\n    pass\n"


def test_multi_line_completion_is_stopped_and_cleaned():
    eng = Scripted("return w * h\n\n\ndef main():\n    pass\n")
    assert isinstance(eng, EngineClient)
    seen = []
    cancel = threading.Event()
    r = complete_at(eng, SRC, (4, 4), language="python", doc_key="doc", cancel=cancel, on_text=seen.append,
                    options=CompletionOptions(max_new_tokens=32))
    assert r.text == "return w * h"
    assert eng.calls[0]["node_kind"] == r.syntax.node_kind == "module"  # keys the engine's draft length
    call = eng.calls[0]
    assert call["prefix"].endswith("def area(w, h):\n    ") and call["suffix"].startswith("\n\n\ndef main")
    assert call["doc_key"] == "doc" and call["max_new"] == 32 and call["cancel"] is cancel
    assert "".join(seen) == "return w * h"  # streamed: settled lines, post-processed (syntax/stream.py)
    s = r.to_json()  # one flat result: the engine's numbers and the syntax layer's decisions
    assert s["gate"] == "multi_line" and 0 < s["context_tokens"] <= eng.budget - 3
    assert s["text"] == r.text and s["raw_text"].startswith("return w * h") and s["stop_reason"] == "stop"
    assert s["prompt_tokens"] == 10 and s["ttft_ms"] == 1.0 and s["total_ms"] >= s["syntax_ms"] > 0
    assert s["tokens_saved"] == s["raw_context_tokens"] - s["context_tokens"] >= 0
    assert s["postprocess_ms"] > 0 and s["syntax_ms"] + s["engine_total_ms"] + s["postprocess_ms"] <= s["total_ms"] + 0.01
    assert s["dropped"] is None and r.syntax.why_empty() is None


@pytest.mark.parametrize("reply,rule", [
    ("\n\n\n\n\n\n\n\n\n\n", "degenerate"),              # blank lines: the stop keeps nothing
    ("return w * h\n    return w * h\n    return w * h\n", None),  # a repeat after a real line: that line shows
    ("else:\n", "adds parse errors"),                          # every cut still breaks the parse
])
def test_a_completion_that_shows_nothing_names_the_rule_and_keeps_the_raw_text(reply, rule):
    r = complete_at(Scripted(reply), SRC, (4, 4), language="python")
    if rule is None:
        assert r.text and r.syntax.dropped is None
        return
    assert r.text.strip() == "" and r.syntax.dropped is not None
    # what was generated until the stop fired (the degenerate stop: as soon as it could tell)
    d = r.syntax.dropped
    assert d.rule == rule and d.text and reply.startswith(d.text) and r.to_json()["dropped"] == {"rule": rule, "text": d.text}
    assert rule in r.syntax.why_empty()


def test_single_line_overlap_and_gate():
    eng = Scripted("w, h)\nmore")
    src = "def f(w, h):\n    return area()\n"
    r = complete_at(eng, src, src.index("area(") + 5, language="python")
    assert r.text == "w, h"
    r = complete_at(eng, "# a comm", 8, language="python")
    assert r.text == "" and r.syntax.gate == "empty" and len(eng.calls) == 1  # the engine was not asked
    assert r.stop_reason == "gated" and r.new_tokens == 0


def test_parse_errors_are_trimmed():
    eng = Scripted("return (w *\n")
    r = complete_at(eng, SRC, (4, 4), language="python")
    assert r.syntax.parse_errors_after <= r.syntax.parse_errors_before
    assert "(" not in r.text


def test_the_deadline_skips_checks_and_the_result_names_them():
    eng = Scripted("return (w *\n")
    r = complete_at(eng, SRC, (4, 4), language="python")
    assert r.syntax.skipped == () and "(" not in r.text
    r = complete_at(eng, SRC, (4, 4), language="python", options=CompletionOptions(syntax=SyntaxOptions(syntax_budget_ms=0)))
    assert r.syntax.skipped == ("parse_check",) and r.text.startswith("return (w *")  # unchecked


def test_a_large_text_is_parsed_around_the_cursor_and_spans_stay_in_its_offsets():
    filler = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12_000))
    src = filler + SRC
    eng = Scripted("return w * h\n")
    off = len(filler) + SRC.index("    \n") + 4
    r = complete_at(eng, src, off, language="python")
    assert r.text == "return w * h"
    spans = {k: (a, b) for k, a, b in r.syntax.spans}
    assert spans["prefix"][1] == off and src[spans["prefix"][0]:off] == eng.calls[-1]["prefix"][-(off - spans["prefix"][0]):]
    # the context's lines are the whole file's too
    prefix = next(e for e in r.syntax.context if e["kind"] == "prefix")
    assert prefix["end_line"] == src[:off].count("\n") and prefix["start_line"] == src[:spans["prefix"][0]].count("\n")


def test_positions_and_warmup():
    eng = Scripted("x")
    with pytest.raises(PositionError):
        complete_at(eng, SRC, (99, 0), language="python")
    with pytest.raises(PositionError):
        complete_at(eng, SRC, len(SRC) + 1, language="python")
    assert warmup_at(eng, parse_snapshot(SRC, "python"), SRC.index("    \n") + 4, doc_key="d") > 0
    assert eng.warm[0][2] == "d" and eng.warm[0][0].endswith("def area(w, h):\n    ")
    assert complete_at(eng, "plain words ", 12).syntax.language == "plaintext"


UTIL = """def scale_all(values, factor):
    \"\"\"Every value times factor.\"\"\"
    return [v * factor for v in values]


def offset_all(values, by):
    return [v + by for v in values]


def unused(a):
    return a
"""


def _workspace(tmp_path):
    from completer.workspace import WorkspaceIndex

    (tmp_path / "util.py").write_text(UTIL)
    (tmp_path / "main.py").write_text("")
    index = WorkspaceIndex(tmp_path)
    index.build()
    return index, str(tmp_path / "main.py")


def test_cross_file_chunks_go_first_in_a_stable_order_while_typing_in_one_function(tmp_path):
    index, path = _workspace(tmp_path)
    head = "from util import offset_all, scale_all\n\n\ndef main(xs):\n    return "
    tail = "\n\n\ndef other(xs):\n    return offset_all(\n"
    eng = Scripted("xs")
    seen = []
    for typed in ["offset_all(scale_all(", "offset_all(scale_all(x", "offset_all(scale_all(xs), ",
                  "offset_all(scale_all(xs), 1"]:
        r = complete_at(eng, head + typed + tail, len(head + typed), language="python", workspace=index, path=path)
        seen.append([c.path + ":" + c.text.split("(")[0] for c in eng.calls[-1]["extra"]])
        assert [(c["kind"], c["path"]) for c in r.syntax.context][:3] == [
            ("definition", "util.py"), ("definition", "util.py"), ("prefix", "main.py")]
    # by path and line; kept after the cursor left scale_all's call (only offset_all's is needed
    # there) because it stayed in main(): the prompt's head did not change
    assert seen == [["util.py:def scale_all", "util.py:def offset_all"]] * 4
    at = len(head + "1" + tail) - 1
    r = complete_at(eng, head + "1" + tail, at, language="python", workspace=index, path=path)
    assert [c.text.split("(")[0] for c in eng.calls[-1]["extra"]] == ["def offset_all"]  # other(): its own
    assert r.syntax.context[0]["start_line"] == UTIL.splitlines().index("def offset_all(values, by):")
    assert "unused" not in str(eng.calls)


def test_cross_file_context_leaves_the_rest_of_the_budget_to_the_file(tmp_path):
    index, path = _workspace(tmp_path)
    src = "from util import scale_all\n\n\ndef main(xs):\n" + "".join(f"    v{i} = {i}\n" for i in range(200)) + \
        "    return scale_all("
    eng = Scripted("xs)", budget=300)
    r = complete_at(eng, src, len(src), language="python", workspace=index, path=path)
    chunk_tokens = sum(c["tokens"] for c in r.syntax.context if c["path"] == "util.py")
    assert 0 < chunk_tokens <= int((300 - 3) * index.options.cross_file_share)
    assert r.syntax.context_tokens + chunk_tokens <= 300 - 3
    assert eng.calls[-1]["extra"] and complete_at(eng, src, len(src), language="python").syntax.context_tokens > \
        r.syntax.context_tokens
