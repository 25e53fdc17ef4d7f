"""The syntax layer as tables: source with a cursor marker `‸` → gate decision, trigger events,
in-loop stop, post-processed text, chosen context spans."""
from __future__ import annotations

import pytest

from completer.documents import parse_snapshot
from completer.syntax import (
    Mode,
    SyntaxOptions,
    detect_triggers,
    gate,
    make_stop,
    node_kind,
    postprocess,
    select_context,
)
from completer.syntax.postprocess import REGION_CHARS

CUR = "‸"


def at(src: str, lang: str | None = "python"):
    off = src.index(CUR)
    return parse_snapshot(src.replace(CUR, ""), lang), off


E, S, M = Mode.EMPTY, Mode.SINGLE, Mode.MULTI
GATE = [
    ("python", "def f(x):‸\n", M, "after a block header"),
    ("python", "def f(x):\n    ‸\n", M, "empty line"),
    ("python", "if x:‸\n    pass\n", M, "after a block header"),
    ("python", "for a in b:‸", M, "after a block header"),
    ("python", "x = foo(a, ‸", S, "end of a line"),
    ("python", "d = {'a':‸\n", S, "end of a line"),
    ("python", "x = fo‸o\n", E, "inside an identifier"),
    ("python", "x = ‸foo\n", E, "an identifier follows the cursor"),
    ("python", "# comm‸ent\n", E, "in a comment"),
    ("python", 'def f():\n    """do‸c"""\n', E, "in a docstring"),
    ("python", 'x = "ab‸c"\n', E, "in a string"),
    ("python", 'x = "ab‸', E, "in a string"),
    ("python", "print(‸)\n", S, "closers follow on the line"),
    ("python", "x = 1‸  # c\n", S, "text follows on the line"),
    ("python", "class A:\n    def f(self):\n        return 1\n‸", M, "empty line"),
    ("javascript", "function f(a) {‸\n}\n", M, "after a block header"),
    ("javascript", "const o = {‸};\n", S, "closers follow on the line"),
    ("javascript", "// todo‸\n", E, "in a comment"),
    ("typescript", "function f(a: number): void {‸\n}\n", M, "after a block header"),
    ("tsx", "const x = <div>{‸}</div>;\n", S, "text follows on the line"),
    ("go", "func f() {\n\t‸\n}\n", M, "empty line"),
    ("go", "s := `raw‸`\n", E, "in a string"),
    ("rust", "fn f() {‸}\n", S, "closers follow on the line"),
    ("rust", 'let s = "a‸b";', E, "in a string"),
    (None, "hello wo‸rld", E, "inside an identifier"),
    (None, "hello world ‸", S, "end of a line"),
    (None, "bin\x00ary ‸", E, "binary content"),
]


@pytest.mark.parametrize("lang,src,mode,reason", GATE)
def test_gate(lang, src, mode, reason):
    d = gate(*at(src, lang))
    assert (d.mode, d.reason) == (mode, reason)


@pytest.mark.parametrize("opts,src,mode", [
    (SyntaxOptions(complete_in_comments=True), "# comm‸", S),
    (SyntaxOptions(complete_in_strings=True), 'x = "ab‸"', S),
    (SyntaxOptions(complete_in_docstrings=True), 'def f():\n    """Do.\n\n    ‸\n    """\n', M),
    (SyntaxOptions(multiline=False), "def f(x):\n    ‸\n", S),
])
def test_gate_options(opts, src, mode):
    assert gate(*at(src), opts).mode == mode


TRIGGERS = [
    ("def f(x):\n    ‸", "\n    ", ["block_start"]),
    ("x = 1\n‸", "\n", ["newline"]),
    ("def f(x):‸", ":", ["header"]),
    ("    return ‸", " ", ["return"]),
    ("x = ‸", " ", ["assign"]),
    ("a == ‸", " ", []),
    ("foo(‸", "(", ["call"]),
    ("os.‸", ".", ["member"]),
    ("os.‸", "", []),
    ("x‸", "x" * 300, []),
]


@pytest.mark.parametrize("src, kind", [
    ("x = max(w,‸", ","),
    ("x = max(w, ‸", ","),               # trailing spaces: still after the comma
    ("def f():\n    return ‸", "return"),
    ('s = "ab‸c"', "string"),
    ("import o‸", "dotted_name"),       # a leaf identifier: its named parent
])
def test_node_kind(src, kind):
    off = src.index(CUR)
    assert node_kind(parse_snapshot(src.replace(CUR, ""), "python"), off) == kind


def test_node_kind_without_a_tree():
    assert node_kind(parse_snapshot("plain words", None), 5) is None


@pytest.mark.parametrize("src,inserted,events", TRIGGERS)
def test_triggers(src, inserted, events):
    assert detect_triggers(*at(src), inserted) == events


STOPS = [  # (language, source, raw completion, kept by the in-loop stop; None = not finished)
    ("python", "print(‸)\n", "x, y)\nfoo", "x, y"),
    ("python", "x = foo(‸", "a, b)\nprint(x)", "a, b)"),
    ("python", "x = ‸", "1", None),
    ("python", "def f(x):‸\n\n\ndef g():\n    pass\n", "\n    y = x + 1\n    return y\n\n\ndef h():\n",
     "\n    y = x + 1\n    return y"),
    ("python", "class A:\n    def f(self):\n        ‸\n", "return 1\n\n    def g(self):\n", "return 1"),
    ("python", "x = [\n    ‸\n]\n", "1,\n    2,\n]\ny = 3", "1,\n    2,"),
    ("python", "‸", "import os\n\ndef f():\n    pass\n\nclass", "import os"),
    ("javascript", "function f(a) {\n  ‸\n}\n", "return a;\n}\n\nfunction", "return a;"),
    ("javascript", "function f(a) {‸", "\n  return a;\n}\nfunction g() {", "\n  return a;\n}"),
    ("go", "func f() {\n\t‸\n}\n", "x := 1\n\treturn x\n}\n", "x := 1\n\treturn x"),
]


@pytest.mark.parametrize("lang,src,raw,kept", STOPS)
def test_stop(lang, src, raw, kept):
    snap, off = at(src, lang)
    k = make_stop(snap, off, gate(snap, off).mode)(raw)
    assert (raw[:k] if k is not None else None) == kept


def test_stop_max_lines():
    snap, off = at("def f():\n    ‸\n")
    stop = make_stop(snap, off, Mode.MULTI, SyntaxOptions(max_lines=2))
    raw = "a = 1\n    b = 2\n    c = 3\n    d = 4\n"
    assert raw[:stop(raw)] == "a = 1\n    b = 2"


POST = [  # (source, raw completion, mode, post-processed text)
    ("print(‸)\n", "x, y)", S, "x, y"),
    ("print(‸)\n", "f(x)", S, "f(x)"),
    ("x = foo(‸", "a, b)) + (", S, "a, b)"),
    ("def f(x):\n    ‸\n    return y\n", "y = x\n    return y", M, "y = x"),
    ("def f(x):\n\t‸\n", "y = 1\n    if y:\n        z = 2", M, "y = 1\n\tif y:\n\t\tz = 2"),
    ("def f(x):\n  if x:\n    pass\n  ‸\n", "y = 1\n  for a in b:\n      z = 2", M,
     "y = 1\n  for a in b:\n    z = 2"),
    ("if x:\r\n    ‸\r\n", "a = 1\n    b = 2", M, "a = 1\r\n    b = 2"),
    ("x = ‸\n", "   \n  ", S, ""),
    ("def f(x):\n    ‸\n", "return x +\n", M, "return x"),
    ("def f(x):\n    ‸\n", "return (x +", M, "return"),
    # what the line already holds after the cursor is not offered again (a rename's `(path):`)
    ("def tally_words‸(path):\n    pass\n", "(path):", S, ""),
    ("def tally_words‸(path):\n    pass\n", "(path", S, ""),
    ("x = f(‸a)\n", "a, b)", S, "a, b"),
]


@pytest.mark.parametrize("src,raw,mode,out", POST)
def test_postprocess(src, raw, mode, out):
    assert postprocess(*at(src), raw, mode).text == out


def test_postprocess_never_adds_parse_errors():
    snap, off = at("def f(x):\n    ‸\n\n\ndef g():\n    return 2\n")
    p = postprocess(snap, off, "if x:\n        return [1, 2\n", Mode.MULTI)
    assert p.errors_after <= p.errors_before and p.reason in ("trimmed to parse", "adds parse errors")



def test_parse_check_on_a_one_mb_line_decides_as_on_a_small_file():
    """The parse check sees the region around the cursor: a 1 MB list literal with an error in it
    before the function changes nothing (it used to walk the list's 280 k children per candidate)."""
    small = "def f(a, b):\n    return ‸\n\n\ndef g():\n    pass\n"
    big = "data = [" + ", ".join(map(str, range(140_000))) + ",, ]\n\n\n" + small
    for raw in ("max(a, b))", "[a, b", "a + b"):
        want = postprocess(*at(small), raw, S)
        got = postprocess(*at(big), raw, S)
        assert (got.text, got.reason, got.skipped) == (want.text, want.reason, ())


def test_an_expired_deadline_skips_the_parse_check_and_says_so():
    from completer.syntax.deadline import Deadline

    snap, off = at("def f(a, b):\n    return ‸\n")
    p = postprocess(snap, off, "max(a, b))", S, deadline=Deadline(0.0))
    assert p.skipped == ("parse_check",) and p.parses == 0 and p.text == "max(a, b))"
    assert postprocess(snap, off, "max(a, b))", S).text == "max(a, b)"


def test_a_cursor_line_longer_than_the_window_still_gets_its_end():
    src = "data = [" + ", ".join(map(str, range(100_000))) + "‸]\n"
    snap, off = at(src)
    count = lambda s: (len(s) + 2) // 3
    ctx = select_context(snap, off, count, 300)
    assert 150 < count(ctx.prefix) <= 300 - count(ctx.suffix) and src[:off].endswith(ctx.prefix)
    assert ctx.prefix[0] not in "0123456789" or src[off - len(ctx.prefix) - 1] == " "  # not inside a number
    assert ctx.suffix == "]\n"


PY_FILE = """import os
from typing import List


def helper(a, b):
    return a + b


class Store:
    def __init__(self, path):
        self.path = path

    def load(self):
{body}
        data = ‸
        return data

    def save(self, data):
        pass


def after():
    return 1
"""


def _count(s: str) -> int:  # a stand-in tokenizer: 4 characters per token
    return (len(s) + 3) // 4


def _spans(src: str, budget: int, **kw):
    snap, off = at(src)
    ctx = select_context(snap, off, _count, budget, SyntaxOptions(**kw))
    text = snap.text
    return ctx, [(s.kind, text[s.start:s.end].split("\n")[0].strip()) for s in ctx.spans]


def test_context_whole_file_fits():
    ctx, spans = _spans(PY_FILE.format(body=""), 2000)
    assert [k for k, _ in spans] == ["prefix", "suffix"]
    assert ctx.prefix.startswith("import os") and ctx.suffix.endswith("return 1\n")
    assert ctx.tokens <= 2000 and ctx.saved == 0


def test_context_header_outside_window():
    body = "".join(f"        x{i} = self.path + {i}\n" for i in range(60))
    ctx, spans = _spans(PY_FILE.format(body=body), 500, grid_lines=4, header_share=0.4)
    kinds = [k for k, _ in spans]
    assert kinds[-2:] == ["prefix", "suffix"]
    assert ("import", "import os") in spans and ("import", "from typing import List") in spans
    assert ("signature", "class Store:") in spans and ("signature", "def load(self):") in spans
    assert ("sibling", "def helper(a, b):") in spans
    assert ctx.tokens <= 500
    # stable parts first: the header, then the window; the enclosing signature leads into it
    header = ctx.prefix[: ctx.prefix.index("        x")]
    assert header.index("import os") < header.index("class Store:") < header.index("    def load(self):")
    assert header.rstrip().endswith("def load(self):")
    assert ctx.prefix.endswith("        data = ")


def test_context_window_start_is_stable_while_typing():
    body = "".join(f"        x{i} = self.path + {i}\n" for i in range(60))
    src = PY_FILE.format(body=body)
    starts = set()
    for typed in ["", "s", "se", "sel", "self", "self.", "self.lo", "self.load("]:
        ctx, _ = _spans(src.replace(CUR, typed + CUR), 300)
        starts.add(ctx.prefix[:200])
    assert len(starts) == 1


def test_context_cuts_at_statement_boundaries():
    src = "x = [\n" + "".join(f"    {i},\n" for i in range(200)) + "]\n\ny = 1\nz = ‸\n"
    ctx, _ = _spans(src, 120, grid_lines=1)
    first = ctx.prefix.split("\n")[0]
    assert first == "y = 1"  # never starts inside the list literal…
    assert ctx.prefix.endswith("z = ")  # …unless nothing else fits, the cursor line always does


@pytest.mark.parametrize("lang,src,sig", [
    ("javascript", "import x from 'y';\nclass A {\n  m(a) {\n{body}    return ‸\n  }\n}\n", "m(a) {"),
    ("go", "package main\n\nimport \"fmt\"\n\nfunc (s *S) M(a int) int {\n{body}\treturn ‸\n}\n", "func (s *S) M(a int) int {"),
    ("rust", "use std::io;\n\nimpl S {\n    fn m(&self) -> i32 {\n{body}        ‸\n    }\n}\n", "fn m(&self) -> i32 {"),
])
def test_context_other_languages(lang, src, sig):
    body = "".join(f"    let_{i} = {i};\n" for i in range(80))
    snap, off = at(src.replace("{body}", body), lang)
    ctx = select_context(snap, off, _count, 250)
    header = ctx.prefix[: ctx.prefix.index("let_")]
    assert sig in header and ctx.tokens <= 250


@pytest.mark.parametrize("lang,src,sibling", [
    ("python", "def helper(a, b):\n    return a + b\n\n\ndef main():\n{body}    return ‸\n",
     "def helper(a, b):\n    ..."),
    ("javascript", "function helper(a, b) {\n  return a + b;\n}\n\nfunction main() {\n{body}  return ‸\n}\n",
     "function helper(a, b) { /* ... */ }"),
    ("typescript", "function helper(a: number): number {\n  return a;\n}\n\nfunction main(): void {\n{body}  ‸\n}\n",
     "function helper(a: number): number { /* ... */ }"),
    ("go", "package main\n\nfunc helper(a int) int {\n\treturn a\n}\n\nfunc main() {\n{body}\t‸\n}\n",
     "func helper(a int) int { /* ... */ }"),
    ("rust", "fn helper(a: i32) -> i32 {\n    a\n}\n\nfn main() {\n{body}    ‸\n}\n",
     "fn helper(a: i32) -> i32 { /* ... */ }"),
])
def test_context_elides_a_sibling_body_in_each_language(lang, src, sibling):
    body = "".join(f"    v{i} = {i};\n" for i in range(80))
    snap, off = at(src.replace("{body}", body), lang)
    ctx = select_context(snap, off, _count, 250)
    assert [s.kind for s in ctx.spans].count("sibling") == 1
    assert sibling in ctx.prefix and "{ {" not in ctx.prefix


def test_parse_check_in_a_large_class_sees_the_whole_file():
    """A cursor deep in a long class of documented methods (past the old 16 KB region): a
    candidate that breaks the file is trimmed or dropped. A region parsed on its own started
    inside a docstring, held 172 errors already (every string inverted) and let this one through,
    as it did on rich/console.py in bench/holes.py."""
    doc = ('        """Add {i} to x.\n\n        Args:\n            x: a number, or "anything" that adds.\n'
           '        Returns:\n            the sum.\n        """\n')
    methods = "".join(f"    def m{i}(self, x):\n" + doc.format(i=i) + f"        return x + {i}\n\n" for i in range(300))
    src = "class Big:\n" + methods + "    def last(self, x):\n        for v in x:\n            ‸\n        return x\n"
    snap, off = at(src)
    assert len(snap.text) > 2 * REGION_CHARS + 10_000
    p = postprocess(snap, off, " if not (v, v, v)\n", Mode.MULTI)
    assert p.errors_before == 0 and p.errors_after == 0 and "if not" not in p.text
