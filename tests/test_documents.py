"""Documents: UTF-16/UTF-8/UTF-32 positions, line splicing under random edits (\\n, \\r\\n, \\r,
astral characters), and the incrementally re-parsed tree against a fresh parse."""
from __future__ import annotations

import random

import pytest
from tree_sitter import Parser

from completer.documents import (
    MAX_PARSE_BYTES,
    Document,
    Documents,
    PositionError,
    language_for,
    line_starts,
    parse_ranges,
    parse_snapshot,
    parser_count,
    snapshot_around,
    ts_language,
)


@pytest.mark.parametrize("encoding,pos", [("utf-16", (1, 3)), ("utf-8", (1, 6)), ("utf-32", (1, 2))])
def test_positions_by_encoding(encoding, pos):
    d = Document("u", "ab\né😀x\n", "python", encoding=encoding)
    off = "ab\né😀".__len__()  # after the emoji
    assert d.offset_at(*pos) == off
    assert d.position_at(off) == pos


def test_position_edge_cases():
    d = Document("u", "a😀b\r\ncd\rlast", None)
    assert d.line_count() == 3 and d.line_text(0) == "a😀b"
    assert d.offset_at(0, 2) == 1  # inside the surrogate pair: never split a character
    assert d.offset_at(0, 99) == 3  # past the line end means the line end (spec)
    assert d.offset_at(2, 4) == len(d.text)
    assert d.offset_at(7, 0) == len(d.text)  # lenient for edits…
    with pytest.raises(PositionError):
        d.offset_at(7, 0, strict=True)  # …strict for requests


@pytest.mark.parametrize("text", ["ab\r\ncd\r\nef", "ab\rcd\ref", "ab\ncd\ref\r\n", "a😀\rb😀c\r\n"])
def test_one_line_column_rule_for_the_cli_and_the_language_server(text):
    from completer.pipeline import resolve_offset

    d = Document("u", text, None, encoding="utf-32")
    for line in range(d.line_count()):
        for col in range(len(d.line_text(line)) + 1):
            assert resolve_offset(text, (line, col)) == d.offset_at(line, col, strict=True)
    with pytest.raises(PositionError):
        resolve_offset(text, (0, len(d.line_text(0)) + 1))  # the CLI is exact where LSP clamps
    with pytest.raises(PositionError):
        resolve_offset(text, (d.line_count(), 0))


@pytest.mark.parametrize("text", ["ab\r\ncd\r\nef", "ab\rcd\ref", "ab\ncd\ref\r\n", "a😀\rb😀c\r\n", ""])
def test_one_offset_to_line_rule(text):
    """documents.line_of is the line a Document's position_at gives, for every offset of a
    CRLF, CR and mixed text (the pipeline's entries, the context window's grid and the edit
    history count lines with it), and counts from any line start."""
    from completer.documents import line_of, line_starts

    d = Document("u", text, None, encoding="utf-32")
    for off in range(len(text) + 1):
        if not (text[off - 1:off] == "\r" and text[off:off + 1] == "\n"):  # not inside a CRLF
            assert line_of(text, off) == d.position_at(off)[0]
    for i, s in enumerate(line_starts(text)):
        assert line_of(text, len(text), s) == len(line_starts(text)) - 1 - i


def test_line_starts_split_on_every_line_break_with_and_without_a_cr():
    """line_starts gives every offset just after a \\r\\n, a lone \\r or a \\n."""
    import random

    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice(["a", "\n", "\r", "\r\n", "é", "😀", "\n\n", "x\ny"])
                       for _ in range(rng.randrange(0, 20)))
        want = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" or (c == "\r" and text[i + 1:i + 2] != "\n")]
        assert line_starts(text) == want, repr(text)


@pytest.mark.parametrize("lang_id,path,want", [
    ("python", None, "python"), ("typescriptreact", None, "tsx"), ("plaintext", "a.rs", "rust"),
    (None, "file:///x/y.go", "go"), ("cobol", "a.cbl", None), (None, None, None)])
def test_language_for(lang_id, path, want):
    assert language_for(lang_id, path) == want


def test_random_edits_keep_lines_and_tree():
    rng = random.Random(7)
    pieces = ["x", "foo", "(", ")", ":", "\n", "\r\n", "\r", "    ", "=", "é", "😀", '"', "return ", "[1, 2]"]
    d = Document("u", "def f(x):\n    return x\n", "python")
    parser = Parser(ts_language("python"))
    for k in range(600):
        n = len(d.text)
        s = rng.randint(0, n)
        e = min(n, s + rng.choice([0, 0, 1, 3]))
        new = "".join(rng.choice(pieces) for _ in range(rng.choice([0, 1, 1, 2])))
        if n > 500:
            e, new = min(n, s + 30), ""
        old_tree = d.snapshot().tree
        d.apply(s, e, new)
        assert d.lines == line_starts(d.text), k
        if k % 100 == 0:
            fresh = parser.parse(d.text.encode("utf-8", "surrogatepass"))
            assert str(d.tree.root_node) == str(fresh.root_node), k
            assert old_tree is not d.tree  # a snapshot's tree is never edited in place


def test_plain_binary_and_huge_are_not_parsed():
    docs = Documents()
    assert docs.open("a", "hello", "plaintext").tree is None
    assert docs.open("b", "x = 1\x00", "python").tree is None
    big = docs.open("c", "x" * (MAX_PARSE_BYTES + 1), "python")
    assert big.tree is None
    big.apply(0, MAX_PARSE_BYTES, "")  # small again: parsed from then on
    assert big.tree is not None and big.snapshot().language == "python"
    docs.close("a")
    assert docs.get("a") is None and len(docs) == 2


def test_lone_surrogates_survive():
    d = Document("u", "x = '\ud800'\n", "python")
    d.apply(0, 1, "y")
    assert d.text.startswith("y = ") and d.tree is not None


def test_one_parser_per_language_not_per_document():
    parser_for_each = parser_count()
    docs = Documents()
    for i in range(50):
        docs.open(f"file:///{i}.py", "x = 1\n", "python")
        docs.open(f"file:///{i}.js", "let x = 1;\n", "javascript")
        docs.close(f"file:///{i}.py")
    assert parser_count() - parser_for_each <= 2 and len(docs) == 50


def test_open_documents_are_capped_and_only_recent_ones_keep_a_tree():
    evicted: list[str] = []
    docs = Documents(max_open=3, on_evict=evicted.append, max_parsed=2)
    for uri in "abc":
        docs.open(uri, f"{uri} = 1\n", "python")
    assert docs.parsed() == 2 and docs._docs["a"].tree is None
    a = docs.get("a")  # used again: parsed again, and "b" is now the least recently used
    assert a.tree is not None and str(a.tree.root_node) == str(parse_snapshot("a = 1\n", "python").tree.root_node)
    a.apply(0, 1, "z")
    assert a.snapshot().language == "python" and docs.parsed() == 2
    docs.open("d", "d = 1\n", "python")
    assert evicted == ["b"] and docs.uris() == ["c", "a", "d"]


def test_snapshot_around_a_large_text():
    line = "    value = compute('é✓𝄞', 1)\n"
    text = "import os\n\n\ndef f():\n" + line * 40_000 + "\n\ndef g():\n" + line * 40_000
    offset = len(text) // 2
    snap, start = snapshot_around(text, "python", offset, reach=20_000)
    assert 0 < start < offset - 20_000 and offset + 10_000 < start + len(snap.text) <= offset + 20_000
    assert text[start:start + len(snap.text)] == snap.text and text[start - 1] == "\n"
    assert snap.tree is not None
    small, zero = snapshot_around(text[:30_000], "python", 10, reach=20_000)
    assert zero == 0 and small.text == text[:30_000]
    for off in (0, 1, 4095, 4096, 4097, 12_345, len(snap.text)):  # the block table vs encoding the prefix
        b = len(snap.text[:off].encode("utf-8", "surrogatepass"))
        assert snap.byte_at(off) == b and snap.char_at(b) == off


def test_one_binary_rule_for_bytes_and_text():
    from completer.documents import is_binary

    for data in ("abc\x00def", "x" * 8000 + "\x00", "plain", "x" * 9000 + "\x00"):
        assert is_binary(data) == is_binary(data.encode()) == ("\x00" in data[:8192])


TRICKY = {
    "python": ('''import os

HELP = """
def not_code(x):
    return x
"""


@decorator(
    arg=1,
)
def f(a, b):  # a comment
    s = """
class NotAClass:
x = f(1)
"""
    return g(a) + len(s)
# a comment at column 0 between statements
class C(Base):
    def m(self):
        return f(1, 2)

    x = [
1, 2]
x = f(3, 4); y = f(5, 6)
'''),
    "javascript": "import { f } from './m';\nconst s = `\nfunction notCode() {}\n${f(1)}`;\nexport function g(a) {\n  return f(a);\n}\nclass C {\n  m() { return f(2); }\n}\nf(3); f(4);\n",
    "go": "package p\n\nimport \"x/m\"\n\nvar s = `\nfunc notCode() {}\n`\n\nfunc g(a int) int {\n\treturn m.F(a)\n}\n\ntype T struct{ A int }\n",
    "rust": "use crate::m::f;\n\nconst S: &str = r#\"\nfn not_code() {}\n\"#;\n\nfn g(a: i32) -> i32 {\n    f(a)\n}\n\nimpl T {\n    fn m(&self) -> i32 { f(2) }\n}\n",
}


def _leaves(n, lo, hi):
    """The leaves of `n` overlapping bytes [lo, hi), each with its ancestors' (type, start)."""
    if n.end_byte <= lo or hi <= n.start_byte:
        return []
    if not n.children:
        chain, p = [], n.parent
        while p is not None and p.parent is not None:  # up to the root (which spans what was parsed)
            # a class's body starts at the first of its statements that was parsed
            chain.append((p.type,) if p.type == "block" and p.parent.type == "class_definition"
                         else (p.type, p.start_byte, p.start_point))
            p = p.parent
        return [(n.type, n.start_byte, n.end_byte, n.start_point, n.end_point, tuple(chain))]
    return [x for c in n.children for x in _leaves(c, lo, hi)]


@pytest.mark.parametrize("language", sorted(TRICKY))
def test_parsing_only_the_statements_that_hold_some_spans_gives_the_whole_parse_there(language):
    """documents.parse_ranges: every token the spans touch comes out as in the whole file's parse
    — same type, offsets, and ancestors (types and starts) — with strings holding code-like lines
    at column 0, decorators and comments between statements, and Python classes of which only
    the header and some statements are parsed; and less than the whole file is parsed."""
    from completer.workspace.outline import outline

    sources = [TRICKY[language].encode()]
    if language == "python":  # and this project's own larger files
        from pathlib import Path
        root = Path(__file__).resolve().parents[1]
        sources += [(root / p).read_bytes() for p in ("completer/documents.py", "completer/edits/follow.py",
                                                       "lsp/service.py", "completer/engine/engine.py")]
    rng = random.Random(0)
    for src in sources:
        whole = parse_snapshot(src.decode(), language)
        o = outline("f", whole)
        assert len(o.starts) > 3 and (language != "python" or o.bodies)
        parts = []
        for _ in range(24):
            spans = []
            for _ in range(rng.randint(1, 3)):
                a = rng.randrange(len(src))
                spans.append((a, min(len(src), a + rng.randint(1, 200))))
            spans.sort()
            tree = parse_ranges(src, language, o.starts, spans, o.bodies)
            for lo, hi in spans:
                assert _leaves(tree.root_node, lo, hi) == _leaves(whole.tree.root_node, lo, hi)
            parts.append(sum(r.end_byte - r.start_byte for r in tree.included_ranges))
        assert 0 < min(parts) and sum(parts) < 0.8 * len(parts) * len(src)  # a part of the file, mostly
        # and the parser is left parsing whole files
        assert parse_snapshot(src.decode(), language).tree.root_node.end_byte == whole.tree.root_node.end_byte
