"""Next-edit suggestions (issue 24): the editable region's rule, the rewrite diffed into small
edits (and their LSP positions in UTF-16), the history from two versions of a file or from the
language server's events, the drop rules of `predict` (on an engine that answers a chosen
rewrite: a unit test of the rules), the formats, the engine's rewrite (greedy ids equal with and
without speculative edits on the embedded pair; its prompt is the fine-tune's sample) and the
CLI's contract. What the model suggests is not asserted here (that is bench/next_edit.py's)."""
from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.edits import applied

from completer.client import Chunk, Completion
from completer.documents import Document, PositionError
from completer.edits import Change, EditHistory
from completer.edits.diff import TextEdit, apply_edits, lsp_edits, region_edits, span_edits
from completer.edits.formats import EDIT_FORMATS, EditPrompt, HistoryItem, detect
from completer.edits.predict import HistoryError, from_events, from_versions, predict
from completer.edits.region import RegionError, editable_region
from completer.prompt import piece_text

COMPLETER = Path(sys.executable).parent / "completer"

SRC = '''\
import os


class Store:
    def __init__(self, root, limit=10):
        self.root = root
        self.limit = limit
        self.items = []

    def add(self, name, value):
        path = os.path.join(self.root,
                            name)
        if len(self.items) >= self.limit:
            raise ValueError("full")
        self.items.append((path, value))
        return path


def main():
    s = Store("/tmp")
    s.add("a", 1)
'''
LINES = SRC.splitlines(keepends=True)


# -- the region ---------------------------------------------------------------------------------
def test_region_stays_in_the_enclosing_definition():
    assert editable_region(SRC, 12, language="python") == (9, 16)   # add(): its header to its last line
    assert editable_region(SRC, 5, language="python") == (4, 8)     # __init__ only
    assert editable_region(SRC, 19, language="python") == (18, 21)  # main()
    assert editable_region(SRC, 12, above=1, below=1, language="python") == (11, 14)


def test_region_never_ends_inside_a_statement():
    # below=0 would end after `path = os.path.join(self.root,`: it grows to the call's end
    assert editable_region(SRC, 10, above=0, below=0, language="python") == (10, 12)
    # ... unless max_lines forbids: then it keeps the cursor's line only (the top may cut)
    assert editable_region(SRC, 11, above=3, below=0, max_lines=1, language="python") == (11, 12)
    # the end of an `if` header with its body below: the body comes in
    assert editable_region(SRC, 12, above=0, below=0, language="python") == (12, 14)
    # without a tree only the counts apply
    assert editable_region(SRC, 10, above=0, below=0) == (10, 11)
    assert editable_region(SRC, 12, above=30, below=30, max_lines=5) == (8, 13)


def test_region_in_javascript():
    js = ('import x from "y";\n\nfunction add(a, b) {\n  const o = {\n    a: a,\n    b: b,\n  };\n'
          '  return o.a + o.b;\n}\n\nfunction main() {\n  return add(1, 2);\n}\n')
    assert editable_region(js, 11, language="javascript") == (10, 13)  # main() only
    assert editable_region(js, 3, above=0, below=0, language="javascript") == (3, 7)  # the whole object literal
    assert editable_region(js, 5, above=0, below=0, max_lines=2, language="javascript") == (5, 7)


def test_region_at_the_file_end_in_a_long_line_and_outside():
    n = SRC.count("\n")
    assert editable_region(SRC, n, language="python") == (n - 3, n + 1)  # the empty last line
    assert editable_region("", 0) == (0, 1)
    long = "x = 1\n" + "y = [" + "1, " * 400_000 + "]\n" + "z = 2\n"
    with pytest.raises(RegionError):
        editable_region(long, 1, language="python")
    assert editable_region(long, 2, language="python") == (2, 4)  # the long line is left out above
    with pytest.raises(PositionError):
        editable_region(SRC, n + 1)


# -- diff → edits -------------------------------------------------------------------------------
def test_a_rename_is_one_small_edit_per_use():
    old = "".join(LINES[9:16])
    new = old.replace("path", "target")
    edits = region_edits(old, new, 9)
    assert len(edits) == 4 and all(e.text == "target" for e in edits)
    assert all(e.start_line == e.end_line and e.end_col - e.start_col == 4 for e in edits)
    assert edits[0] == TextEdit(10, 8, 10, 12, "target")
    assert apply_edits(SRC, edits) == SRC.replace(old, new)


def test_random_rewrites_round_trip():
    rng = random.Random(0)
    words = ["a", "bb", "x_y", " ", "\t", "(", ")", "\n", "\r\n", "é", "😀", "中文"]
    for _ in range(300):
        old = "".join(rng.choice(words) for _ in range(rng.randint(0, 40)))
        new = list(old)
        for _ in range(rng.randint(0, 5)):
            i = rng.randint(0, len(new))
            if rng.random() < 0.5 and i < len(new):
                del new[i:i + rng.randint(1, 4)]
            else:
                new[i:i] = rng.choice(words)
        new = "".join(new)
        spans = span_edits(old, new)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        text = "head\n" + old + "\ntail"
        got = apply_edits(text, region_edits(old, new, 1))
        assert got == "head\n" + new + "\ntail", (old, new)


def test_lsp_positions_in_utf16_with_emoji_and_cjk():
    text = "a = '😀😀'\nb = '中文' + x\n"
    doc = Document("file:///t.py", text, "python", encoding="utf-16")
    old = text
    new = text.replace("+ x", "+ y")
    edits = region_edits(old, new, 0)
    assert edits == [TextEdit(1, 11, 1, 12, "y")]
    assert lsp_edits(doc, edits) == [{"range": {"start": {"line": 1, "character": 11},
                                                "end": {"line": 1, "character": 12}}, "newText": "y"}]
    new = text.replace("'😀😀'", "'😀😁'")
    (e,) = region_edits(old, new, 0)
    assert (e.start_col, e.end_col) == (6, 7)  # chars: the second emoji
    (r,) = lsp_edits(doc, [e])
    assert (r["range"]["start"]["character"], r["range"]["end"]["character"]) == (7, 9)  # UTF-16: surrogate pairs
    doc8 = Document("file:///t.py", text, "python", encoding="utf-8")
    (r,) = lsp_edits(doc8, [e])
    assert (r["range"]["start"]["character"], r["range"]["end"]["character"]) == (9, 13)


# -- history ------------------------------------------------------------------------------------
def test_history_from_two_versions():
    before = SRC.replace("def add(self, name, value)", "def add(self, key, value)")
    items = from_versions(SRC, before, "store.py")
    assert items == [HistoryItem("store.py", LINES[9], LINES[9].replace("name, value", "key, value"))]
    assert from_versions(SRC, SRC, "store.py") == []
    with pytest.raises(HistoryError):
        from_versions("completely\ndifferent\n", SRC, "store.py")


def test_history_from_the_language_servers_events():
    h = EditHistory()
    doc = Document("file:///s.py", SRC, "python")
    at = SRC.index("name, value")
    h.record(doc.uri, SRC, Change(at, at + 4, "key"), now=0.0)
    (item,) = from_events(h.recent(), lambda uri: "s.py")
    assert item == HistoryItem("s.py", LINES[9], LINES[9].replace("name, value", "key, value"))


# -- predict's rules, on an engine that answers a chosen rewrite -----------------------------------
class Scripted:
    """An EngineClient's `rewrite` that answers `answer(region)` and records the request."""

    def __init__(self, answer, stop_reason: str = "eos", malformed: bool = False, confidence: float | None = None):
        self.answer, self.stop_reason, self.malformed = answer, stop_reason, malformed
        self.confidence = confidence
        self.requests: list[EditPrompt] = []

    def rewrite(self, request, *, fmt="auto", doc_key="_default", max_new=None, speculative=True, cancel=None):
        self.requests.append(request)
        return Completion(self.answer(request.region), new_tokens=7, target_forwards=2, accepted_per_forward=3.5,
                          total_ms=1.0, speculative=speculative, stop_reason=self.stop_reason,
                          edit_format="completer", malformed=self.malformed, confidence=self.confidence)


CURRENT = SRC.replace("def add(self, name, value)", "def add(self, key, value)")
HISTORY = from_versions(SRC, CURRENT, "store.py")


def test_predict_edits_give_the_predicted_file():
    eng = Scripted(lambda region: region.replace("(self.root,\n                            name)",
                                                 "(self.root,\n                            key)"))
    ne = predict(eng, CURRENT, 9, 21, HISTORY, path="store.py", chunks=[Chunk("util.py", "def g(): ...")],
                 rename_first=False)  # the model's answer (the history is a rename: else the rule's)
    assert ne.dropped is None and ne.region == (9, 16) and ne.source == "model"
    assert [e.to_json() for e in ne.edits] == [{"start_line": 11, "start_col": 28, "end_line": 11, "end_col": 32,
                                                "text": "key"}]
    assert apply_edits(CURRENT, ne.edits) == CURRENT.replace("                            name)",
                                                             "                            key)")
    (req,) = eng.requests
    assert req.region == "".join(CURRENT.splitlines(keepends=True)[9:16]) and req.history == tuple(HISTORY)
    assert req.region[req.cursor:].startswith(", value)") and req.extra == (Chunk("util.py", "def g(): ..."),)
    assert req.before == "".join(CURRENT.splitlines(keepends=True)[:9]) and req.after.startswith("\n\ndef main")
    assert ne.to_json()["accepted_per_forward"] == 3.5 and "reason" not in ne.to_json()
    assert ne.confidence is None and "confidence" not in ne.to_json()  # an engine that scores nothing


def test_the_models_score_comes_with_its_answer():
    """The engine's score of the model's answer (confidence.score of its tokens) is the next
    edit's, in --json too: what bench/next_edit.py sets the model's answers against."""
    eng = Scripted(lambda region: region.replace("name)", "key)"), confidence=0.4213)
    ne = predict(eng, CURRENT, 9, 21, HISTORY, path="store.py", rename_first=False)
    assert ne.source == "model" and ne.confidence == 0.4213 and ne.to_json()["confidence"] == 0.4213


@pytest.mark.parametrize("answer, kw, reason", [
    (lambda r: r, {}, "no_change"),
    (lambda r: r.replace("key, value", "name, value"), {}, "undo"),
    (lambda r: r.replace("return path", "return path)"), {}, "syntax"),
    (lambda r: "", {"malformed": True}, "malformed"),
    (lambda r: r[:20], {"stop_reason": "length"}, "too_long"),
    (lambda r: r[:20], {"stop_reason": "cancelled"}, "cancelled"),
    (lambda r: "", {"stop_reason": "unsure", "confidence": 0.05}, "unsure"),  # the engine's next-edit gate
])
def test_predict_drop_rules(answer, kw, reason):
    ne = predict(Scripted(answer, **kw), CURRENT, 9, 21, HISTORY, path="store.py", rename=False)
    assert (ne.dropped, ne.edits) == (reason, [])
    assert ne.to_json()["reason"] == reason
    # the model first: the rename (name -> key in add's parameters) stands in for an answer that
    # gave nothing usable; never for one the user should not see (undo) or one cut short
    ne = predict(Scripted(answer, **kw), CURRENT, 9, 21, HISTORY, path="store.py", rename_first=False)
    if reason in ("no_change", "syntax", "malformed", "too_long", "unsure"):
        assert (ne.dropped, ne.source, ne.model_dropped) == (None, "rename", reason)
        assert apply_edits(CURRENT, ne.edits) == CURRENT.replace("                            name)",
                                                                 "                            key)")
        assert ne.to_json()["source"] == "rename" and ne.to_json()["model_reason"] == reason
    else:
        assert (ne.dropped, ne.edits, ne.source) == (reason, [], "model")


def test_the_rename_is_suggested_before_the_model_is_asked():
    """By default a rename in the last edit is answered from the syntax tree and the engine is not
    asked, whatever it would answer; an edit that is no rename goes to the model."""
    other = lambda r: r.replace("return path", "return str(path)")  # a valid answer, not the rename
    eng = Scripted(other)
    ne = predict(eng, CURRENT, 9, 21, HISTORY, path="store.py")
    assert (ne.source, ne.dropped, ne.model_dropped, eng.requests) == ("rename", None, None, [])
    assert apply_edits(CURRENT, ne.edits) == CURRENT.replace("                            name)",
                                                             "                            key)")
    assert ne.total_ms > 0 and ne.new_tokens == 0 and ne.to_json()["source"] == "rename"
    # the model first: its valid answer is shown and the rename is not
    ne = predict(Scripted(other), CURRENT, 9, 21, HISTORY, path="store.py", rename_first=False)
    assert ne.source == "model" and "str(path)" in apply_edits(CURRENT, ne.edits)
    # no rename in the last edit (a literal changed): the model is asked
    cur = CURRENT.replace("def add(self, key, value)", "def add(self, key, value=0)")
    eng = Scripted(other)
    ne = predict(eng, cur, 9, 21, from_versions(CURRENT, cur, "store.py"), path="store.py")
    assert ne.source == "model" and len(eng.requests) == 1


def test_a_crlf_file_is_shown_with_lf_and_keeps_its_line_ends():
    crlf = CURRENT.replace("\n", "\r\n")
    eng = Scripted(lambda region: region.replace("name)", "key)"))
    ne = predict(eng, crlf, 9, 21, [HistoryItem(h.path, h.old.replace("\n", "\r\n"), h.new.replace("\n", "\r\n"))
                                    for h in HISTORY], path="store.py", rename_first=False)
    (req,) = eng.requests
    assert "\r" not in req.region + req.before + req.after + "".join(h.old + h.new for h in req.history)
    assert req.region[req.cursor:].startswith(", value)")
    assert [e.to_json() for e in ne.edits] == [{"start_line": 11, "start_col": 28, "end_line": 11, "end_col": 32,
                                                "text": "key"}]
    assert apply_edits(crlf, ne.edits) == crlf.replace("name)", "key)")
    undo = predict(Scripted(lambda region: region.replace("key, value", "name, value")), crlf, 9, 21,
                   from_versions(SRC.replace("\n", "\r\n"), crlf, "store.py"), path="store.py", rename_first=False)
    assert undo.dropped == "undo"


def test_predict_without_history_on_binary_or_a_long_line():
    eng = Scripted(lambda r: r + "x\n")
    assert predict(eng, CURRENT, 9, 0, [], path="store.py").dropped == "no_history"
    assert predict(eng, "a\0b\n", 0, 0, HISTORY, path="b.bin").dropped == "binary"
    long = "x = [" + "1, " * 400_000 + "]\n"
    assert predict(eng, long, 0, 3, HISTORY, path="l.py").dropped == "too_long"
    assert eng.requests == []
    with pytest.raises(PositionError):
        predict(eng, CURRENT, 99, 0, HISTORY, path="store.py")
    # a plain-text file: no syntax rule, the edit goes through
    ne = predict(eng, "one\ntwo\n", 1, 0, [HistoryItem("t.txt", "1\n", "one\n")], path="t.txt")
    assert ne.dropped is None and apply_edits("one\ntwo\n", ne.edits) == "one\ntwo\nx\n"


# -- formats ------------------------------------------------------------------------------------
def test_format_detection():
    assert detect("auto", fim="completer").name == "completer"
    assert detect("auto", model="zed-industries/zeta").name == "zeta"
    assert detect("auto", model="sweepai/sweep-next-edit-1.5B").name == "sweep"
    assert detect("auto", fim="qwen", model="Qwen2.5-Coder-1.5B").name == "sweep"
    assert detect("auto", model="x", has_token=lambda t: t == "<|file_sep|>").name == "sweep"
    assert detect("auto", fim="starcoder", model="bigcode/starcoder2").name == "zeta"
    assert detect("sweep", fim="completer").name == "sweep"
    with pytest.raises(ValueError, match="next-edit format"):
        detect("nope")


def test_zeta_and_sweep_prompts_and_answers():
    req = EditPrompt(tuple(HISTORY), "store.py", "".join(LINES[9:12]), 11, "class Store:\n", "    x\n")
    zeta = EDIT_FORMATS["zeta"]
    text = piece_text(zeta.prompt(req))
    assert text.startswith("### Instruction:\n") and text.endswith("### Response:\n\n")
    assert 'User edited "store.py":\n\n```diff\n@@ -1 +1 @@\n-    def add(self, name, value):\n+' in text
    assert "class Store:\n<|editable_region_start|>\n    def add<|user_cursor_is_here|>(self" in text
    assert zeta.region(zeta.draft(req)) == req.region
    assert zeta.region("```store.py\n<|editable_region_start|>\nA<|user_cursor_is_here|>\n") == "A\n"
    assert zeta.region("no markers") is None
    sweep = EDIT_FORMATS["sweep"]
    pieces = sweep.prompt(req)
    assert [p.text for p in pieces if p.special] == ["<|file_sep|>"] * 4
    text = piece_text(pieces)
    assert text.endswith("<|file_sep|>updated/store.py\n")
    assert "<|file_sep|>store.py.diff\noriginal:\n    def add(self, name, value):\nupdated:\n" in text
    assert f"<|file_sep|>current/store.py\n{req.region}<|file_sep|>" in text
    assert sweep.region(sweep.draft(req)) == req.region
    with_ctx = piece_text(sweep.prompt(EditPrompt(req.history, req.path, req.region, extra=(Chunk("util.py", "def g(): ..."),))))
    assert with_ctx.startswith("<|file_sep|>util.py\ndef g(): ...\n<|file_sep|>store.py.diff\n")
    assert piece_text(EDIT_FORMATS["completer"].prompt(EditPrompt(req.history, req.path, req.region, extra=(
        Chunk("util.py", "def g(): ..."),)))) == piece_text(EDIT_FORMATS["completer"].prompt(req))  # ours shows none


# -- the engine's rewrite on the embedded pair ---------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    from completer.config import EngineConfig
    from completer.engine.engine import Engine

    e = Engine(EngineConfig(device="cpu"))
    yield e
    e.close()


def test_rewrite_ids_equal_with_and_without_speculative_edits(engine):
    for line in (9, 4, 18):
        lo, hi = editable_region(CURRENT, line, language="python")
        req = EditPrompt(tuple(HISTORY), "store.py", "".join(CURRENT.splitlines(keepends=True)[lo:hi]))
        fast = engine.rewrite(req, fmt="completer", doc_key="a", speculative=True)
        plain = engine.rewrite(req, fmt="completer", doc_key="b", speculative=False)
        again = engine.rewrite(req, fmt="completer", doc_key="a", speculative=True)  # the document's cache reused
        assert fast.token_ids == plain.token_ids == again.token_ids and fast.new_tokens > 0
        assert (fast.speculative, plain.speculative) == (True, False)
        assert plain.accepted_per_forward == 1.0 and fast.target_forwards <= plain.target_forwards
        assert fast.edit_format == "completer" and fast.text == plain.text


def test_rewrite_prompt_is_the_fine_tunes_sample(engine):
    from draft_models.edit_data import make_task, sample_ids

    tok = engine.tok
    for seed in range(4):
        t = make_task(SRC, "store.py", random.Random(seed))
        ids, start = sample_ids(t, tok, lambda s: tok.encode(s).ids if s else [])
        got = engine.edit_prompt(EditPrompt(tuple(t.history), t.path, t.region_text()), engine.edit_format())
        assert got == ids[:start]


def test_rewrite_of_what_does_not_fit_and_a_format_the_tokenizer_lacks(engine):
    from completer.client import EngineError

    got = engine.rewrite(EditPrompt(tuple(HISTORY), "store.py", "x = 1\n" * 600), fmt="completer")
    assert (got.text, got.stop_reason, got.new_tokens, got.malformed) == ("", "context", 0, True)
    got = engine.rewrite(EditPrompt(tuple(HISTORY), "store.py", "x = 1\n" * 60), fmt="completer", max_new=2000)
    assert got.prompt_tokens + got.new_tokens < engine.ctx  # bounded by the context, not by max_new
    with pytest.raises(EngineError, match="needs the token"):
        engine.rewrite(EditPrompt(tuple(HISTORY), "store.py", "x\n"), fmt="sweep")


def test_auto_does_not_ask_a_pair_never_taught_next_edits(engine):
    """A pair of our format whose config is not marked as taught next edits (finetune_edits marks
    it; draft_models/MODEL_CARD.md): "auto" answers nothing at once and predict says why; a
    marked one is asked. The engine reads the mark from the target's config."""
    from draft_models import DEFAULT_TARGET

    marked = json.loads((DEFAULT_TARGET / "config.json").read_text()).get("completer_next_edit", False)
    assert engine.edits_trained == marked
    req = EditPrompt(tuple(HISTORY), "store.py", "".join(CURRENT.splitlines(keepends=True)[8:12]))
    try:
        engine.edits_trained = False
        got = engine.rewrite(req)
        assert (got.text, got.new_tokens, got.stop_reason) == ("", 0, "untrained")
        assert predict(engine, CURRENT, 9, 4, HISTORY, path="store.py", rename=False).dropped == "untrained"
        ne = predict(engine, CURRENT, 9, 4, HISTORY, path="store.py", rename_first=False)  # the rename needs no model
        assert (ne.source, ne.model_dropped, ne.new_tokens) == ("rename", "untrained", 0)
        ne = predict(engine, CURRENT, 9, 4, HISTORY, path="store.py")  # nor is the model asked before it
        assert (ne.source, ne.model_dropped, ne.new_tokens) == ("rename", None, 0)
        engine.edits_trained = True
        assert engine.rewrite(req, max_new=4).new_tokens > 0
    finally:
        engine.edits_trained = marked


# -- the CLI ------------------------------------------------------------------------------------
def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(COMPLETER), "next-edit", *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.slow
def test_cli_json_contract(tmp_path):
    old, new = tmp_path / "old.py", tmp_path / "store.py"
    old.write_text(SRC)
    new.write_text(CURRENT)
    from draft_models import DEFAULT_TARGET

    marked = json.loads((DEFAULT_TARGET / "config.json").read_text()).get("completer_next_edit", False)
    rename = [{"start_line": 11, "start_col": 28, "end_line": 11, "end_col": 32, "text": "key"}]
    r = _run(str(new), "--line", "9", "--col", "21", "--before", str(old), "--json")
    assert r.returncode == 0, r.stderr  # the last edit renamed name -> key: carried on, the model not asked
    out = json.loads(r.stdout)
    assert (out["source"], out["new_tokens"], out["edits"], "model_reason" in out) == ("rename", 0, rename, False)
    r = _run(str(new), "--line", "9", "--col", "21", "--before", str(old), "--json", "--no-next-edit-rename-first")
    assert r.returncode == 0, r.stderr  # "auto" asks the shipped pair only if it was taught next edits
    out = json.loads(r.stdout)  # unasked, the model gives nothing; the rename stands in
    assert (out.get("model_reason") == "untrained") == (not marked), r.stdout
    if not marked:
        assert out["source"] == "rename" and out["new_tokens"] == 0 and out["edits"] == rename
    r = _run(str(new), "--line", "9", "--col", "21", "--before", str(old), "--json", "--next-edit-format", "completer",
             "--no-next-edit-rename-first")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"edits", "new_tokens", "target_forwards", "accepted_per_forward", "total_ms", "speculative"} <= set(out)
    assert out["speculative"] is True and out["new_tokens"] > 0
    assert (out["edits"] == []) == ("reason" in out)
    applied(CURRENT, [TextEdit(**e) for e in out["edits"]])  # within the file, in order, each a change
    r = _run(str(new), "--line", "9", "--col", "21", "--before", str(new), "--json", "--no-speculative")
    assert r.returncode == 0 and json.loads(r.stdout)["reason"] == "no_history"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unrelated", "missing", "binary", "position"])
def test_cli_bad_input_exits_2(tmp_path, case):
    new = tmp_path / "store.py"
    new.write_text(CURRENT)
    old = tmp_path / "old.py"
    old.write_text({"unrelated": "nothing\nin common\n", "missing": "", "binary": "", "position": SRC}[case])
    if case == "binary":
        old.write_bytes(b"\x00\x01\x02")
    if case == "missing":
        old.unlink()
    line = "99" if case == "position" else "9"
    r = _run(str(new), "--line", line, "--col", "0", "--before", str(old), "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("completer: error: ")


# -- rename propagation from the syntax tree (completer/edits/rename.py) --------------------------
@pytest.mark.parametrize("old, new, want", [
    ("    n = len(xs)\n", "    count = len(xs)\n", ("n", "count")),
    ("f(a)\n", "f(b)\n", ("a", "b")),
    ("self.item_count\n", "self.items_count\n", ("item_count", "items_count")),  # a change inside a name
    ("x = 1\n", "x = 2\n", None),  # a literal, not a name
    ("f(a, b)\n", "f(c, d)\n", None),  # two names
    ("    t = n + 1\n    g(n)\n", "    t = count + 1\n    g(count)\n", ("n", "count")),  # one rename, two places
    ("g(n, n)\n", "g(count, n2)\n", None),  # two renames
    ("g(n)\n", "g(count) + 1\n", None),  # a rename and more
    ("f(a)\n", "f(a.b)\n", None),  # not a whole name on the new side
    ("same\n", "same\n", None),
])
def test_which_edits_are_renames(old, new, want):
    from completer.edits.rename import renamed

    assert renamed(old, new) == want


PY = '''\
class Box:
    def __init__(self, size):
        self.size = size

    def grow(self, n, step=1):
        total = self.size + n  # n more
        for _ in range(n):
            total += step
        print("n", n, f(n=n), self.n)
        return total


def other(n):
    return n
'''


def _carry(text, old_line, new_line, at, path="a.py", language="python", region=None, history=()):
    from completer.edits.rename import propagate

    cur = text.replace(old_line, new_line, 1)
    a, b = region or (0, len(cur))
    got = propagate(cur, a, b, cur.index(new_line) + len(new_line) - at, [*history, HistoryItem(path, old_line, new_line)],
                    path, language)
    return cur, got


def test_a_parameter_rename_reaches_its_uses_in_its_function_only():
    cur, (region, r) = _carry(PY, "    def grow(self, n, step=1):\n", "    def grow(self, count, step=1):\n", 17)
    assert (r.old, r.new, r.role, r.sites) == ("n", "count", "name", 4)
    # the comment, the string, the keyword argument's name, the attribute and other()'s n stay
    assert region == cur.replace("self.size + n  #", "self.size + count  #").replace("range(n)", "range(count)") \
        .replace('print("n", n, f(n=n), self.n)', 'print("n", count, f(n=count), self.n)')


def test_a_parameter_rename_reaches_the_keyword_arguments_of_its_functions_calls():
    text = PY + "\n\ndef use(b):\n    b.grow(n=2, step=3)\n    other(n=2)\n    return grow(n=1)\n"
    _, (region, r) = _carry(text, "    def grow(self, n, step=1):\n", "    def grow(self, count, step=1):\n", 17)
    assert r.sites == 6  # the 4 uses in grow(), b.grow(n=...) and grow(n=...); other(n=...) and f(n=...) stay
    assert region.endswith("    b.grow(count=2, step=3)\n    other(n=2)\n    return grow(count=1)\n")
    assert 'f(n=count)' in region


def test_an_attribute_rename_reaches_the_class_and_not_the_local():
    cur, (region, r) = _carry(PY, "        self.size = size\n", "        self.capacity = size\n", 7)
    assert (r.old, r.new, r.role, r.sites) == ("size", "capacity", "member", 1)
    assert region == cur.replace("total = self.size + n", "total = self.capacity + n")


def test_a_rename_stays_in_the_region_and_skips_a_name_that_existed():
    cur = PY.replace("    def grow(self, n, step=1):\n", "    def grow(self, count, step=1):\n")
    lo = cur.index("        for _")
    _, got = _carry(PY, "    def grow(self, n, step=1):\n", "    def grow(self, count, step=1):\n", 17,
                    region=(lo, len(cur)))
    assert got[0] == cur[lo:].replace("range(n)", "range(count)").replace('"n", n, f(n=n)', '"n", count, f(n=count)') \
        and got[1].sites == 3
    # `step` was a name before the edit: n -> step points this place at another name, no rename
    assert _carry(PY, "        total = self.size + n  # n more\n", "        total = self.size + step  # n more\n",
                  12)[1] is None
    # a file of another language with no names.scm, or plain text: nothing
    assert _carry("a b a\n", "a b a\n", "c b a\n", 4, path="t.txt", language=None)[1] is None


def test_an_accepted_rename_suggestion_carries_on_below_it():
    """A long function's uses past the first region: the user renamed `n` at the def, accepted the
    suggestion for the next lines (one edit of two places), and the next region gets the rest."""
    first = HistoryItem("a.py", "    def grow(self, n, step=1):\n", "    def grow(self, count, step=1):\n")
    old = "        total = self.size + n  # n more\n        for _ in range(n):\n"
    new = "        total = self.size + count  # n more\n        for _ in range(count):\n"
    text = PY.replace(first.old, first.new)
    cur = text.replace(old, new)
    lo = cur.index("            total += step")
    _, (region, r) = _carry(text, old, new, 3, region=(lo, len(cur)), history=[first])
    assert (r.old, r.new, r.sites) == ("n", "count", 2)
    assert region == cur[lo:].replace('print("n", n, f(n=n), self.n)', 'print("n", count, f(n=count), self.n)')


def test_a_rename_typed_in_two_bursts_is_one_rename():
    first = HistoryItem("a.py", "    def grow(self, n, step=1):\n", "    def grow(self, co, step=1):\n")
    _, (_, r) = _carry(PY.replace("grow(self, n,", "grow(self, co,"), "    def grow(self, co, step=1):\n", "    def grow(self, count, step=1):\n", 17,
                            history=[first])
    assert (r.old, r.new, r.sites) == ("n", "count", 4)


def test_an_object_shorthand_keeps_its_key():
    from completer.edits.rename import propagate

    for text, want in (("function f(count) {\n  return { count, k: count };\n}\n",
                        "function f(n) {\n  return { count: n, k: n };\n}\n"),
                       ("function f(o) {\n  const { count } = o;\n  return count + 1;\n}\n",
                        "function f(o) {\n  const { count: n } = o;\n  return n + 1;\n}\n")):
        line = text.splitlines(keepends=True)[0] if "f(count)" in text else "  return count + 1;\n"
        cur = text.replace(line, line.replace("count", "n"), 1)
        at = cur.index(line.replace("count", "n")) + line.index("count") + 1
        region, _ = propagate(cur, 0, len(cur), at, [HistoryItem("a.js", line, line.replace("count", "n"))],
                              "a.js", "javascript")
        assert region == want, region


@pytest.mark.parametrize("language, path, text, old, new, want", [
    ("javascript", "a.js", ("class A {\n  constructor() { this.cnt = 0; }\n  inc() { this.cnt += 1; return this.cnt; }\n}\n"
                            "const cnt = 3;\n"), "  constructor() { this.cnt = 0; }\n", "  constructor() { this.count = 0; }\n", 2),
    ("typescript", "a.ts", "function f(v: number): number {\n  const w = v * 2;\n  return v + w + `v`.length;\n}\n",
     "function f(v: number): number {\n", "function f(value: number): number {\n", 2),
    ("go", "a.go", "package a\n\nfunc f(v int) int {\n\tw := v * 2\n\treturn v + w\n}\n", "func f(v int) int {\n",
     "func f(val int) int {\n", 2),
    ("rust", "a.rs", "fn f(v: i32) -> i32 {\n    let w = v * 2; // v\n    v + w\n}\n", "fn f(v: i32) -> i32 {\n",
     "fn f(value: i32) -> i32 {\n", 2),
])
def test_renames_in_other_languages(language, path, text, old, new, want):
    from completer.edits.rename import propagate

    cur = text.replace(old, new)
    i = cur.index(new)
    region, r = propagate(cur, 0, len(cur), i + len(new) - 1, [HistoryItem(path, old, new)], path, language)
    assert r.sites == want and region.count(r.new) == want + 1
    assert region.replace(r.new, r.old) == text.replace(new, old) or language == "javascript"
    if language == "javascript":  # the module-level `cnt` is a variable, not the member
        assert region.endswith("const cnt = 3;\n")


def test_predict_offers_the_rename_with_crlf_and_utf16_positions():
    src = 'def f(name):\r\n    s = "😀" + name\r\n    return name\r\n'
    cur = src.replace("def f(name)", "def f(key)")
    eng = Scripted(lambda r: r)
    ne = predict(eng, cur, 0, 9, from_versions(src, cur, "e.py"), path="e.py")
    assert (ne.source, ne.model_dropped, eng.requests) == ("rename", None, [])
    assert apply_edits(cur, ne.edits) == cur.replace("+ name", "+ key").replace("return name", "return key")
    doc = Document("file:///e.py", cur, "python", 1)
    assert [e["range"]["start"] for e in lsp_edits(doc, ne.edits)] == [{"line": 1, "character": 15},
                                                                      {"line": 2, "character": 11}]


def test_a_member_follows_its_receiver_and_a_method_its_calls():
    src = ('class C:\n    def f(self, req, other):\n        self.name = req.name\n        print(self.name, other.name)\n'
           '        self.load(req)\n        other.load(self.name)\n        return self.load\n')
    # data: only `self.name` (req.name and other.name are other objects' attributes)
    cur, (region, r) = _carry(src, "        self.name = req.name\n", "        self.title = req.name\n", 12)
    assert r.sites == 2 and region == cur.replace("print(self.name,", "print(self.title,") \
        .replace("other.load(self.name)", "other.load(self.title)")
    # a method renamed at a call: its other calls whatever the receiver, and `self.load` itself
    cur, (region, r) = _carry(src, "        self.load(req)\n", "        self.fetch(req)\n", 6)
    assert r.sites == 2 and region == cur.replace("other.load(", "other.fetch(").replace("return self.load", "return self.fetch")
