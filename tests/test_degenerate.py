"""The degenerate stop as tables — junk that must be cut (and where), real code that must not be —
then end to end on the embedded pair: a continuation that turns into a repeated run is stopped
inside the decode loop, a few tokens in, and nothing of it is shown."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.embedded import degenerate_place

from completer.config import SyntaxOptions
from completer.documents import parse_snapshot
from completer.syntax import gate, make_stop
from completer.syntax.degenerate import find

ROOT = Path(__file__).resolve().parent.parent
CUR = "‸"

# (completion so far, cursor line before the cursor, line above, kind, text kept)
JUNK = [
    (" # The not not not not not", "", "", "run", ""),
    ("x = 1\n    # The test_name is not not not the", "", "", "words", "x = 1"),
    ("_R_R_R_R_R_C_C_C", "x = ", "", "run", ""),
    (" if not (name, name, name, name, name, name, name", "", "", "run", ""),
    ("self._check(self._name, self.name, self.name, self.name, self.name, ", "", "", "run", ""),
    ("\n        #  # the test the same the same the same the", "", "", "run", ""),
    ("x = 1\n        y = f(self, self, self, self, self, self, self", "", "", "run", "x = 1"),
    (" #  #  #  #  #  #  #  the", "", "", "run", ""),
    ("b'" + "\\x00" * 16, "", "", "run", ""),
    ("'" + "a" * 12, "", "", "run", ""),
    ("[" + "0, " * 16, "", "", "run", ""),
    ("\n        self.check(self.name)\n        self.check(self.name)\n        self.check(self.name)\n", "", "",
     "lines", "\n        self.check(self.name)"),
    ('\n        """\n        """\n        """\n', "", "", "lines", '\n        """'),
    ("\n    a = f()\n    b = g()\n    a = f()\n    b = g()\n", "", "", "lines", "\n    a = f()\n    b = g()"),
    ("\n\n\n\n\n\ndef f", "", "", "blank", ""),
    ("x = 1\n\n\n\n\ny = 2", "", "", "blank", "x = 1"),
    ("self.name)\n        self.check_file(self.name, self.name)\n", "        self.check_file(self.name, ", "",
     "echo", "self.name)"),
    ("        return self._name\n", "", "        return self._name", "echo", ""),
]

# (completion so far, cursor line before the cursor, line above): real code, never cut
REAL = [
    ("'-' * 40)", "print(", ""),
    ('"-" * 40)\n# ----------------------------------------\n', "print(", ""),
    ("foo(bar(baz(qux(1))))))", "x = ", ""),
    ("[0, 0, 0, 0, 0, 0, 0, 0]", "zeros = ", ""),
    ("self.a = a\n        self.b = b\n        self.c = c\n", "        ", "def __init__(self, a, b, c):"),
    ("b'\\x00\\x00\\x00\\x00' + data", "header = ", ""),
    ("'%s %s %s %s' % args", "line = ", ""),
    ("'YYYY-MM-DD'", "fmt = ", ""),
    ("'\\t\\t\\t\\t'", "indent = ", ""),
    ("(m, m, m, m, m, m, m)", "tr = self.loop._make_subprocess_transport", ""),
    ("(None, None, None, None, ('127.0.0.1', 0))", "sock.getaddrinfo.return_value = [", ""),
    ("pass\n\n\ndef g():\n    return 1\n", "    ", "def f():"),
    ("gc.collect()\n        gc.collect()\n", "        ", "# not leaking"),
    ("1\n        j += 1\n", "        i += ", ""),  # the cursor line completed, then a different line
    ("x = [[1, 2], [3, 4]]", "", ""),
    ("'test test'", "h = make_header('Subject', ", ""),
    ("return not not_found", "    ", ""),
    ("#\n# Copyright\n#\n", "", ""),
]


@pytest.mark.parametrize("text,head,prev,kind,kept", JUNK)
def test_junk_is_cut(text, head, prev, kind, kept):
    d = find(text, head, prev)
    assert d is not None and d.kind == kind and text[:d.keep] == kept


@pytest.mark.parametrize("text,head,prev", REAL)
def test_real_code_is_kept(text, head, prev):
    for n in range(1, len(text) + 1):  # as the decode loop sees it, a token at a time
        assert find(text[:n], head, prev) is None, text[:n]


def test_a_run_the_document_already_has_is_its_own():
    text = "b'" + "\\x00" * 20 + "'"
    assert find(text) is not None
    assert find(text, seen="MAGIC = " + text + "\n") is None


def at(src: str, **opts):
    snap = parse_snapshot(src.replace(CUR, ""), "python")
    off = src.index(CUR)
    return make_stop(snap, off, gate(snap, off).mode, SyntaxOptions(**opts))


def test_stop_composes_syntax_and_degenerate():
    stop = at("def f(x):\n    return x\n\n\ndef g(y):\n    ‸\n")
    assert stop.reason is None and stop("if y:") is None
    assert stop("if y:\n        return not not not x\n") == len("if y:")
    assert stop.reason == "degenerate" and stop.degenerate.kind == "words"
    assert stop("if y:\n        pass\n\n\ndef h") == len("if y:\n        pass") and stop.reason == "degenerate"
    syntax = at("def f(x):\n    return x\n\n\ndef g(y):\n    ‸\n")
    assert syntax("return y\n\n\ndef h") == len("return y") and syntax.reason == "syntax"
    # junk past the syntax stop is never judged: the syntax stop keeps less
    line = at("x = foo(a, ‸\n")
    assert line("b)\n_R_R_R_R_R") == len("b)") and line.reason == "syntax"


def test_the_option_turns_it_off():
    stop = at("def g(y):\n    ‸\n", stop_degenerate=False)
    assert stop("if y:\n        return not not not x\n") is None and stop.reason is None


@pytest.mark.slow
def test_embedded_pair_degenerate_continuation_is_stopped_and_not_shown():
    from completer.pipeline import CompletionOptions, complete_at, make_engine

    eng = make_engine(None, max_new_tokens=64, device="cpu", min_confidence=0.0)  # the stop, not the gate
    text, off = degenerate_place()
    before = complete_at(eng, text, off, language="python", doc_key="b",
                         options=CompletionOptions(64, SyntaxOptions(stop_degenerate=False)))
    after = complete_at(eng, text, off, language="python", doc_key="a", options=CompletionOptions(64))
    assert find(before.text) is not None  # the junk, shown
    assert after.stop_reason == "degenerate" and after.text == ""
    # the rule fires on the 15th greedy token; the loop stops at the end of the verify step that
    # holds it, up to max_draft_len tokens later — how many depends on the adaptive draft length,
    # which the engine times on this machine (18 was seen while another process held a core)
    assert after.new_tokens < before.new_tokens and after.new_tokens <= 64 // 4 + eng.cfg.max_draft_len
    # the stop only ends the greedy decode early: the tokens it paid for are the same
    assert before.token_ids[:len(after.token_ids)] == after.token_ids
