"""Next edits past the editable region (completer/edits/follow.py, issue 39): a definition renamed,
or a Python function's parameters changed, followed to its uses in the file and in the workspace
files that import it (completer/workspace/refs.py through the index's resolution). Tables of
workspaces before → after, per kind and language: the user's change made in the definition's
file, every place the follower offers applied, each file compared with the expected one (files
not listed must stay as they were: strings, comments, namesakes, shadowing functions). Then the
chain one place at a time (the jump's edit is for the place it names), a jump into a file the
editor has not opened, places found again from a file's current text (a stale place is never
offered), and edits that need no follow-up (nothing offered)."""
from __future__ import annotations

from pathlib import Path

import pytest

from completer.edits.diff import apply_edits
from completer.edits.follow import Follower
from completer.edits.formats import HistoryItem
from completer.workspace import WorkspaceIndex


def _workspace(root: Path, files: dict[str, str]) -> WorkspaceIndex:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    index = WorkspaceIndex(root)
    index.build()
    return index


def _change(files: dict[str, str], path: str, old: str, new: str) -> tuple[str, list[HistoryItem], int, int]:
    """The user's edit: the line holding `old` in `path` becomes `new`; the cursor after it."""
    text = files[path]
    i = text.index(old)
    start = text.rfind("\n", 0, i) + 1
    end = text.find("\n", i) + 1 or len(text)
    line_old = text[start:end]
    line_new = line_old.replace(old, new, 1)
    after = text[:start] + line_new + text[end:]
    line = text.count("\n", 0, start)
    col = line_new.index(new) + len(new)
    k = 0
    while k < min(len(old), len(new)) and old[k] == new[k]:  # the cursor after the changed part
        k += 1
    col = line_new.index(new) + max(len(new) - (len(old) - k if old.startswith(new[:k]) else 0), k)
    return after, [HistoryItem(path, line_old, line_new)], line, min(col, len(line_new.rstrip("\n")))


def _follow_all(root: Path, files: dict[str, str], path: str, old: str, new: str,
                language: str | None = None) -> dict[str, str]:
    """Every file after the user's change and every place offered applied, one at a time as an
    editor does: the region's edits, then the jump, then the next answer at the jump's place.
    As the language server asks (only the importers' statements that hold the names are parsed,
    from the index's statement starts), and the same with whole parses."""
    index = _workspace(root, files)
    got = _follow_chain(index, files, path, old, new, language, index.statements)
    assert got == _follow_chain(index, files, path, old, new, language, None)
    return got


def _follow_chain(index, files, path, old, new, language, statements) -> dict[str, str]:
    text, history, line, col = _change(files, path, old, new)
    now = dict(files)
    now[path] = text
    follower = Follower()
    where, at = path, (line, col)
    for _ in range(200):
        got = follower.answer(now[where], where, *at, history, language=language, read=now.get,
                              importers=index.importers, statements=statements, below=2)
        if got is None:
            break
        now[where] = apply_edits(now[where], got.edits)
        if got.jump is None:
            break
        target = got.jump
        assert target.digest  # computed on the text the target has now
        now[target.path] = apply_edits(now[target.path], target.edits)
        where, at = target.path, (target.line, target.col)
    else:
        raise AssertionError("the chain never ended")
    return now


PY_PKG = {
    "pkg/__init__.py": "from .core import fetch\n\n__all__ = ['fetch']\n",
    "pkg/core.py": ("def fetch(url, timeout=None):\n    return url\n\n\n"
                    "def twice(url):\n    # fetch it twice\n    a = fetch(url)\n    b = fetch(url, timeout=3)\n"
                    "    return a, b, 'fetch'\n\n\ndef shadow(fetch):\n    return fetch(1)\n\n\n"
                    "class Client:\n    def fetch(self):\n        return fetch('x')\n"),
    "app.py": "from pkg.core import fetch\n\nprint(fetch('x'))\n",
    "mod_alias.py": "import pkg.core as c\n\nc.fetch('y')\nother.fetch('z')\n",
    "dotted.py": "import pkg.core\n\npkg.core.fetch('y')\n",
    "reexport.py": "from pkg import fetch\n\nfetch(1)\n",
    "submodule.py": "from pkg import core\n\ncore.fetch(1)\n",
    "renamed_import.py": "from pkg.core import fetch as get\n\nget(1)\n",
    "star.py": "from pkg.core import *\n\nfetch(2)\n",
    "relative/__init__.py": "",
    "namesake.py": "def fetch():\n    return 'fetch'  # fetch\n\n\nfetch()\n",
}


def _expect(files: dict[str, str], changes: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    out = dict(files)
    for path, subs in changes.items():
        for a, b in subs:
            assert a in out[path], (path, a)
            out[path] = out[path].replace(a, b)
    return out


def test_python_rename_follows_every_import_form(tmp_path):
    got = _follow_all(tmp_path, PY_PKG, "pkg/core.py", "def fetch(url", "def fetch_url(url")
    want = _expect(PY_PKG, {
        "pkg/__init__.py": [("import fetch", "import fetch_url")],
        "pkg/core.py": [("def fetch(url", "def fetch_url(url"), ("a = fetch(url)", "a = fetch_url(url)"),
                        ("b = fetch(url,", "b = fetch_url(url,"), ("return fetch('x')", "return fetch_url('x')")],
        "app.py": [("fetch", "fetch_url")],
        "mod_alias.py": [("c.fetch(", "c.fetch_url(")],
        "dotted.py": [("core.fetch(", "core.fetch_url(")],
        "reexport.py": [("fetch", "fetch_url")],
        "submodule.py": [("core.fetch(", "core.fetch_url(")],
        "renamed_import.py": [("import fetch as", "import fetch_url as")],
        "star.py": [("fetch(2)", "fetch_url(2)")],
    })
    assert {k: v for k, v in got.items() if v != want[k]} == {}
    # what must stay: the comment, the string, the shadowing parameter, the method named fetch,
    # `other.fetch`, the namesake module, `__all__`'s string
    assert "# fetch it twice" in got["pkg/core.py"] and "'fetch'" in got["pkg/core.py"]
    assert "def shadow(fetch):\n    return fetch(1)" in got["pkg/core.py"] and "def fetch(self)" in got["pkg/core.py"]
    assert got["namesake.py"] == PY_PKG["namesake.py"] and "other.fetch('z')" in got["mod_alias.py"]


def test_places_far_apart_in_a_long_file_are_all_found(tmp_path):
    """A rename or a call rewrite queries only the lines that hold the name (follow.py,
    _lines_holding), several spans in a long file: uses, a shadowing parameter and keyword
    callers each thousands of bytes apart are found as in a short file."""
    pad = "".join(f"VALUE_{i} = {i}  # padding that does not name it\n" for i in range(120))  # ~5 KB
    files = {"core.py": ("def fetch(url, timeout=None):\n    return url\n\n\n" + pad +
                         "def first():\n    return fetch('a', timeout=1)\n\n\n" + pad +
                         "def shadow(fetch):\n    return fetch(2)\n\n\n" + pad +
                         "def last():\n    return fetch('b')\n"),
             "app.py": "from core import fetch\n\n" + pad + "fetch('x', timeout=2)\n"}
    got = _follow_all(tmp_path, files, "core.py", "def fetch(url", "def get(url")
    assert got["core.py"].count("get(") == 3 and "return get('a', timeout=1)" in got["core.py"]
    assert "def shadow(fetch):\n    return fetch(2)" in got["core.py"] and "return get('b')" in got["core.py"]
    assert got["app.py"].startswith("from core import get\n") and got["app.py"].endswith("get('x', timeout=2)\n")
    got = _follow_all(tmp_path / "sig", files, "core.py", "def fetch(url, timeout=None):", "def fetch(url):")
    assert "return fetch('a')\n" in got["core.py"] and got["app.py"].endswith("fetch('x')\n")
    assert "def shadow(fetch):\n    return fetch(2)" in got["core.py"]


def test_python_class_and_variable_renames(tmp_path):
    files = {"shapes.py": "class Shape:\n    pass\n\n\nLIMIT = 3\n\n\ndef make():\n    return Shape()\n",
             "use.py": "from shapes import Shape, LIMIT\n\n\nclass Square(Shape):\n    n = LIMIT\n"}
    got = _follow_all(tmp_path, files, "shapes.py", "class Shape:", "class Figure:")
    assert got["shapes.py"].endswith("return Figure()\n") and got["use.py"].startswith("from shapes import Figure, LIMIT")
    assert "class Square(Figure):" in got["use.py"]
    got = _follow_all(tmp_path / "v", files, "shapes.py", "LIMIT = 3", "MAX_SIDES = 3")
    assert "import Shape, MAX_SIDES" in got["use.py"] and "n = MAX_SIDES" in got["use.py"]


def test_python_method_rename_follows_self_and_its_class_past_the_region(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(30))
    files = {"m.py": ("class Box:\n    def size(self):\n        return 1\n\n    def area(self):\n" + body +
                      "        return self.size() * Box.size(self) + other.size()\n")}
    got = _follow_all(tmp_path, files, "m.py", "def size(self)", "def length(self)")
    assert got["m.py"].endswith("return self.length() * Box.length(self) + other.size()\n")


def test_python_parameter_rename_follows_keyword_callers_in_other_files(tmp_path):
    files = {"lib.py": "def send(data, retries=1):\n    return data * retries\n",
             "a.py": "from lib import send\n\nsend(1, retries=2)\nsend(retries=3, data=1)\nprint(retries=1)\n",
             "b.py": "import lib\n\nlib.send(2, retries=4)\n"}
    got = _follow_all(tmp_path, files, "lib.py", "retries=1):", "attempts=1):")
    assert got["lib.py"] == "def send(data, attempts=1):\n    return data * attempts\n"
    assert got["a.py"] == "from lib import send\n\nsend(1, attempts=2)\nsend(attempts=3, data=1)\nprint(retries=1)\n"
    assert got["b.py"] == "import lib\n\nlib.send(2, attempts=4)\n"


@pytest.mark.parametrize("old,new,calls", [
    # a parameter removed: positional and keyword arguments dropped, with their commas
    ("def fetch(url, timeout=None):", "def fetch(url):",
     {"app.py": "print(fetch('x'))\nfetch('y')\n", "core": ["a = fetch(url)", "b = fetch(url)"]}),
    ("def fetch(url, timeout=None):", "def fetch(timeout=None):",
     {"app.py": "print(fetch())\nfetch(timeout=5)\n", "core": ["a = fetch()", "b = fetch(timeout=3)"]}),
    # reordered: positional arguments follow their parameters, keywords where the order no longer holds
    ("def fetch(url, timeout=None):", "def fetch(timeout=None, url=None):",
     {"app.py": "print(fetch(url='x'))\nfetch(timeout=5, url='y')\n",
      "core": ["a = fetch(url=url)", "b = fetch(timeout=3, url=url)"]}),
    # renamed: keyword arguments renamed, positional ones stay
    ("def fetch(url, timeout=None):", "def fetch(url, wait=None):",
     {"app.py": "print(fetch('x'))\nfetch('y', wait=5)\n", "core": ["a = fetch(url)", "b = fetch(url, wait=3)"]}),
])
def test_python_call_sites_after_a_signature_change(tmp_path, old, new, calls):
    files = {"core.py": ("def fetch(url, timeout=None):\n    return url\n\n\n" + "".join(f"# {i}\n" for i in range(30)) +
                         "def twice(url):\n    a = fetch(url)\n    b = fetch(url, timeout=3)\n    return a, b\n"),
             "app.py": "from core import fetch\n\nprint(fetch('x'))\nfetch('y', timeout=5)\n",
             "other.py": "def fetch(a, b):\n    return fetch(1, 2)\n"}
    got = _follow_all(tmp_path, files, "core.py", old, new)
    assert got["app.py"] == "from core import fetch\n\n" + calls["app.py"]
    assert [ln.strip() for ln in got["core.py"].splitlines() if "= fetch(" in ln] == calls["core"]
    assert got["other.py"] == files["other.py"]


def test_an_added_parameter_without_default_is_a_jump_to_each_call_with_no_edit(tmp_path):
    files = {"core.py": "def fetch(url):\n    return url\n\n\n" + "# pad\n" * 30 + "fetch('a')\nfetch('b', 1)\n",
             "app.py": "from core import fetch\n\nfetch('x')\n"}
    _workspace(tmp_path, files)
    index = WorkspaceIndex(tmp_path)
    index.build()
    text, history, line, col = _change(files, "core.py", "def fetch(url):", "def fetch(url, method):")
    got = Follower().answer(text, "core.py", line, col, history, language=None, read={**files, "core.py": text}.get,
                            importers=index.importers, below=2)
    assert got.source == "signature" and got.edits == []
    # the calls that lack it, each a place to go with nothing to apply; `fetch('b', 1)` has it
    assert [(p.path, p.line, p.edits) for p in got.all] == [("core.py", 34, ()), ("app.py", 2, ())]
    assert (got.jump.path, got.jump.line) == ("core.py", 34)


JS = {
    "src/util.js": "export function parse(s) {\n  return s;\n}\n\nexport const twice = (s) => parse(parse(s));\n",
    "src/a.js": "import { parse } from './util';\n\nparse('a');\nconst o = { parse: 1 };\n",
    "src/b.js": "import * as u from './util.js';\n\nu.parse('b');\nx.parse('c');\n",
    "src/c.js": "import { parse as p } from './util';\n\np('c');\n",
    "src/index.js": "export { parse } from './util';\n",
    "src/d.js": "import { parse } from './index';\n\nparse('d');\n",
}


def test_javascript_rename_follows_named_namespace_aliased_and_reexported_imports(tmp_path):
    got = _follow_all(tmp_path, JS, "src/util.js", "function parse(s)", "function parseLine(s)")
    assert got["src/util.js"].endswith("parseLine(parseLine(s));\n")
    assert got["src/a.js"] == "import { parseLine } from './util';\n\nparseLine('a');\nconst o = { parse: 1 };\n"
    assert got["src/b.js"] == "import * as u from './util.js';\n\nu.parseLine('b');\nx.parse('c');\n"
    assert got["src/c.js"] == "import { parseLine as p } from './util';\n\np('c');\n"
    assert got["src/index.js"] == "export { parseLine } from './util';\n"
    assert got["src/d.js"] == "import { parseLine } from './index';\n\nparseLine('d');\n"


def test_typescript_rename_follows_its_importers(tmp_path):
    files = {"lib.ts": "export interface Options {\n  n: number;\n}\n\nexport function run(o: Options): number {\n  return o.n;\n}\n",
             "main.ts": "import { Options, run } from './lib';\n\nconst o: Options = { n: 1 };\nrun(o);\n"}
    got = _follow_all(tmp_path, files, "lib.ts", "interface Options", "interface Settings")
    assert got["lib.ts"].count("Settings") == 2
    assert got["main.ts"] == "import { Settings, run } from './lib';\n\nconst o: Settings = { n: 1 };\nrun(o);\n"


def test_go_rename_follows_same_package_files_and_package_imports(tmp_path):
    files = {"go.mod": "module example.com/app\n",
             "store/store.go": "package store\n\nfunc Open(p string) string {\n\treturn p\n}\n",
             "store/more.go": "package store\n\nfunc twice() string {\n\treturn Open(Open(\"x\"))\n}\n",
             "main.go": ("package main\n\nimport \"example.com/app/store\"\n\nfunc main() {\n"
                         "\tstore.Open(\"y\")\n\tother.Open(\"z\")\n}\n")}
    got = _follow_all(tmp_path, files, "store/store.go", "func Open(", "func Connect(")
    assert "return Connect(Connect(\"x\"))" in got["store/more.go"]
    assert "\tstore.Connect(\"y\")\n\tother.Open(\"z\")" in got["main.go"]


def test_rust_rename_follows_use_declarations(tmp_path):
    files = {"Cargo.toml": "[package]\nname = \"x\"\n",
             "src/lib.rs": "pub mod util;\n",
             "src/util.rs": "pub fn parse(s: &str) -> usize {\n    s.len()\n}\n",
             "src/main.rs": "use crate::util::parse;\n\nfn main() {\n    parse(\"a\");\n}\n"}
    got = _follow_all(tmp_path, files, "src/util.rs", "fn parse(", "fn parse_len(")
    assert got["src/main.rs"] == "use crate::util::parse_len;\n\nfn main() {\n    parse_len(\"a\");\n}\n"


def test_the_chain_one_place_at_a_time_and_a_jump_into_a_closed_file(tmp_path):
    """The first answer: the region's edits (none here: the uses are far below) and a jump to the
    next place; each jump carries the edit for the place it names, in the target's coordinates;
    a file the editor has not opened is read from disk."""
    files = {"core.py": "def fetch():\n    pass\n" + "# pad\n" * 40 + "fetch()\n",
             "app.py": "# app\nfrom core import fetch\n\nfetch()\n"}
    index = _workspace(tmp_path, files)
    text, history, line, col = _change(files, "core.py", "def fetch(", "def load(")
    disk = lambda p: (tmp_path / p).read_text()  # app.py: never opened
    follower = Follower()
    first = follower.answer(text, "core.py", line, col, history, language=None,
                            read=lambda p: text if p == "core.py" else disk(p), importers=index.importers, below=2)
    assert first.edits == [] and (first.jump.path, first.jump.line, first.jump.col) == ("core.py", 42, 0)
    assert [e.text for e in first.jump.edits] == ["load"] and first.left == 3
    text = apply_edits(text, first.jump.edits)
    second = follower.answer(text, "core.py", 42, 0, history, language=None,
                             read=lambda p: text if p == "core.py" else disk(p), importers=index.importers, below=2)
    assert second.edits == [] and (second.jump.path, second.jump.line) == ("app.py", 1) and second.left == 2
    # the file changed on disk before the user got there: what is offered is for its text now
    (tmp_path / "app.py").write_text("# app\n# moved\nfrom core import fetch\n\nfetch()\n")
    third = follower.answer(disk("app.py"), "app.py", 1, 0, history, language=None,
                            read=lambda p: text if p == "core.py" else disk(p), importers=index.importers, below=5)
    assert apply_edits(disk("app.py"), third.edits) == "# app\n# moved\nfrom core import load\n\nload()\n"
    assert third.jump is None


def test_importers_are_parsed_only_where_they_hold_the_name_while_their_text_is_the_indexed_one(tmp_path, monkeypatch):
    """An importer whose text is the one the index read is parsed only in the top-level statements
    that hold the name (documents.parse_ranges): a string with code-like lines at column 0 and a
    class between them change nothing. Once the file changed since it was indexed, it is parsed
    whole (the index's statement starts are for the old text) and the places are still right."""
    from completer.edits import follow

    helper = ('"""Docs.\n"""\nfrom core import fetch\n\nUSAGE = """\nfetch = 1\ndef fetch():\n"""\n\n\n'
              "class Client:\n    def get(self):\n        return fetch(1)\n\n\n"
              + "".join(f"def unrelated_{i}(x):\n    return x * {i}\n\n\n" for i in range(40))
              + "def last():\n    return fetch(2)\n")
    files = {"core.py": "def fetch(x):\n    return x\n", "helper.py": helper}
    index = _workspace(tmp_path, files)
    text, history, line, col = _change(files, "core.py", "def fetch(", "def load(")
    parsed: list[int] = []
    real = follow.parse_ranges
    monkeypatch.setattr(follow, "parse_ranges", lambda src, *a: parsed.append(len(src)) or real(src, *a))
    want = helper.replace("import fetch", "import load").replace("fetch(1)", "load(1)").replace("fetch(2)", "load(2)")

    def everything(disk: dict[str, str]) -> str:
        got = Follower().answer(text, "core.py", line, col, history, language=None,
                                read=lambda p: text if p == "core.py" else disk[p], importers=index.importers,
                                statements=index.statements, below=2)
        return apply_edits(disk["helper.py"], [e for p in got.all if p.path == "helper.py" for e in p.edits])

    assert everything(files) == want and parsed == [len(helper)]
    parsed.clear()
    moved = {**files, "helper.py": "# a line the index has not seen\n" + helper}  # unsaved, or not re-indexed yet
    assert index.statements("helper.py", moved["helper.py"]) is None
    assert everything(moved) == "# a line the index has not seen\n" + want and parsed == []


def test_a_renames_importers_are_resolved_without_parsing_the_text_before_it_again(tmp_path, monkeypatch):
    """The definition's file before the rename is what its importers are resolved against: the
    index holds its outline (indexed from it, or replaced by the re-index of the renamed text),
    so the request parses nothing for it."""
    import completer.workspace.index as index_module

    files = {"core.py": "def fetch(x):\n    return x\n", "app.py": "from core import fetch\n\nfetch(1)\n"}
    index = _workspace(tmp_path, files)
    text = _change(files, "core.py", "def fetch(", "def load(")[0]
    outlined: list[str] = []
    real = index_module.outline
    monkeypatch.setattr(index_module, "outline", lambda rel, snap: outlined.append(rel) or real(rel, snap))
    index.update("core.py", files["core.py"])  # didOpen: the text indexed from disk
    assert [u.path for u in index.importers("core.py", "fetch", files["core.py"])] == ["app.py"] and outlined == []
    index.update("core.py", text)  # didChange: re-indexed; the outline before it is kept
    assert outlined == ["core.py"]
    assert [u.path for u in index.importers("core.py", "fetch", files["core.py"])] == ["app.py"]
    assert outlined == ["core.py"]
    assert index.importers("core.py", "fetch", "def fetch(y):\n    pass\n")  # another text: parsed
    assert outlined == ["core.py", "core.py"]


def test_a_place_the_user_changed_is_not_offered(tmp_path):
    files = {"core.py": "def fetch():\n    pass\n" + "# pad\n" * 40 + "fetch()\nfetch()\n"}
    index = _workspace(tmp_path, files)
    text, history, line, col = _change(files, "core.py", "def fetch(", "def load(")
    follower = Follower()
    got = follower.answer(text, "core.py", line, col, history, language=None, read={}.get,
                          importers=index.importers, below=2)
    assert got.left == 2
    text = text.replace("fetch()\nfetch()", "fetch2()\nfetch()")  # the user made the first one something else
    got = follower.answer(text, "core.py", line, col, history, language=None, read={}.get,
                          importers=index.importers, below=2)
    assert got.left == 1 and (got.jump.line, got.jump.edits[0].start_col) == (43, 0)


@pytest.mark.parametrize("path,text,old,new", [
    ("m.py", "def f():\n    x = 1\n    return x\n\n\nf()\n", "x = 1", "x = 2"),                   # a literal changed
    ("m.py", "def f():\n    return 1\n\n\nf()\n", "return 1", "return 1  # one"),             # a comment
    ("m.py", "def f():\n    return 1\n\n\nf()\n", "    return 1\n", "    print(2)\n    return 1\n"),  # a new statement
    ("m.py", "def f(a):\n    return a\n\n\nf(1)\n", "def f(a):", "def f(a, b=2):"),           # a parameter with a default
    ("m.py", "def f(a):\n    b = a\n    return b\n\n\nf(1)\n", "b = a", "c = a"),            # a local: the region's rename
    ("m.js", "function f(a) {\n  return a;\n}\nf(1);\n", "return a;", "return a + 1;"),
])
def test_typing_that_needs_no_follow_up_gets_none(tmp_path, path, text, old, new):
    index = _workspace(tmp_path, {path: text})
    after, history, line, col = _change({path: text}, path, old, new)
    assert Follower().answer(after, path, line, col, history, language=None, read={}.get,
                             importers=index.importers) is None


def test_a_rename_of_another_name_is_left_to_the_region_rule_and_the_plan_kept(tmp_path):
    files = {"core.py": "def fetch():\n    pass\n" + "# pad\n" * 40 + "fetch()\n\n\ndef g():\n    a = 1\n    return a\n"}
    index = _workspace(tmp_path, files)
    text, history, line, col = _change(files, "core.py", "def fetch(", "def load(")
    follower = Follower()
    plan = follower.answer(text, "core.py", line, col, history, language=None, read={}.get,
                           importers=index.importers, below=2)
    assert plan is not None and plan.left == 1
    text2, h2, l2, c2 = _change({"core.py": text}, "core.py", "    a = 1", "    b = 1")  # a local: no definition
    assert follower.answer(text2, "core.py", l2, c2, history + h2, language=None, read={}.get,
                           importers=index.importers, below=2) is None
    assert follower.change is not None and (follower.change.old, follower.change.new) == ("fetch", "load")
    follower.drop()  # a jump dismissed
    assert follower.answer(text, "core.py", 44, 0, history[:0], language=None, read={}.get,
                           importers=index.importers) is None


def test_predict_names_the_next_place_in_the_file_for_the_cli_and_the_websocket():
    """predict() (the CLI's and `completer serve`'s next edit) on one file, no workspace and no
    state: the definition's change in the history gives the region's edits and the jump past it."""
    from completer.edits.predict import from_versions, predict

    before = "def fetch(url):\n    return fetch(url)\n" + "# pad\n" * 40 + "fetch('a')\n"
    after = before.replace("def fetch(", "def fetch_all(", 1)
    got = predict(None, after, 0, 13, from_versions(before, after, "m.py"), path="m.py", below=2)
    assert got.source == "rename" and [(e.start_line, e.text) for e in got.edits] == [(1, "fetch_all")]
    assert got.to_json()["jump"] == {"start_line": 42, "start_col": 0, "end_line": 42, "end_col": 5,
                                     "edits": [{"start_line": 42, "start_col": 0, "end_line": 42, "end_col": 5,
                                                "text": "fetch_all"}]}
    assert predict(None, after, 0, 13, from_versions(before, after, "m.py"), path="m.py", below=2,
                   jumps=False).jump is None


def test_a_generator_argument_removed_with_its_parameter(tmp_path):
    files = {"m.py": "def first(values, n=1):\n    return values\n\n\n" + "# pad\n" * 30 +
             "first(x for x in y)\nfirst(a, n=2), first(b)\n"}
    got = _follow_all(tmp_path, files, "m.py", "def first(values, n=1):", "def first(n=1):")
    assert got["m.py"].endswith("first()\nfirst(n=2), first()\n")


IMPORT_PKG = {
    "pkg/__init__.py": "from .net import Session as Session, fetch as fetch\n",
    "pkg/a.py": "x = 1\n",
    "pkg/z.py": "y = 1\n",
    "pkg/net.py": "def fetch(url):\n    return url\n\n\nclass Session:\n    pass\n",
    "pkg/other.py": "def helper():\n    pass\n",
    "pkg/dup_a.py": "def twin():\n    pass\n",
    "pkg/dup_b.py": "def twin():\n    pass\n",
}


def _import_answer(tmp_path, files, path, old, new):
    index = _workspace(tmp_path, files)
    text, history, line, col = _change(files, path, old, new)
    got = Follower().answer(text, path, line, col, history, language=None, read={**files, path: text}.get,
                            importers=index.importers, providers=index.providers, below=2)
    return text, got


@pytest.mark.parametrize("path,before,old,new,after", [
    # a method of that name binds an attribute, not the module's name
    ("app.py", "class A:\n    def fetch(self):\n        return 1\n\n\nx = 1\n", "x = 1", "x = fetch",
     "from pkg.net import fetch\n\n\nclass A:\n    def fetch(self):\n        return 1\n\n\nx = fetch\n"),
    # a default value is a use, not a binding; re-exported by the package the file imports from
    ("app.py", "from pkg import Session\n\n\ndef f(x=1):\n    pass\n", "def f(x=1):", "def f(x=fetch):",
     "from pkg import Session, fetch\n\n\ndef f(x=fetch):\n    pass\n"),
    # a new import line after the file's imports, absolute where the file imports absolutely, in a
    # block of its own below the standard library's
    ("app.py", "import os\n\n\ndef main():\n    return os.sep\n", "return os.sep", "return fetch(os.sep)",
     "import os\n\nfrom pkg.net import fetch\n\n\ndef main():\n    return fetch(os.sep)\n"),
    # in isort's order among the imports of its own package
    ("app.py", "import os\n\nfrom pkg.a import x\nfrom pkg.z import y\n\nx = 1\n", "x = 1", "x = helper",
     "import os\n\nfrom pkg.a import x\nfrom pkg.other import helper\nfrom pkg.z import y\n\nx = helper\n"),
    # added to the `from` line that already imports from that module
    ("app.py", "from pkg.net import Session\n\nx = 1\n", "x = 1", "x = fetch(1)",
     "from pkg.net import Session, fetch\n\nx = fetch(1)\n"),
    # relative where the file imports its own package relatively
    ("pkg/sub/use.py", "from ..other import helper\n\nhelper()\n", "helper()", "helper(fetch)",
     "from ..net import fetch\nfrom ..other import helper\n\nhelper(fetch)\n"),  # in isort's order
    # after the module docstring, with no import yet
    ("app.py", '"""Doc."""\n\nx = 1\n', "x = 1", "x = Session()",
     '"""Doc."""\nfrom pkg.net import Session\n\nx = Session()\n'),
])
def test_the_import_a_new_name_needs(tmp_path, path, before, old, new, after):
    files = {**IMPORT_PKG, path: before, **({"pkg/sub/__init__.py": ""} if path.startswith("pkg/sub") else {})}
    text, got = _import_answer(tmp_path, files, path, old, new)
    assert got is not None and got.source == "import"
    edits = got.edits + [e for p in ([got.jump] if got.jump else []) for e in p.edits]
    assert apply_edits(text, edits) == after


@pytest.mark.parametrize("before,old,new", [
    ("x = 1\n", "x = 1", "x = twin()"),                                           # defined in two modules: no guess
    ("x = 1\n", "x = 1", "x = len([])"),                                          # a builtin
    ("def fetch():\n    pass\n\n\nx = 1\n", "x = 1", "x = fetch()"),              # bound in the file
    ("from pkg import net\n\nx = 1\n", "x = 1", "x = net.fetch()"),               # an attribute, not a name
    ("x = 1\n", "x = 1", "x = fetc"),                                             # half typed: nothing defines it
    ("def f(fetch):\n    return 1\n", "return 1", "return fetch"),                # a parameter
    ("try:\n    pass\nexcept E as fetch:\n    x = 1\n", "x = 1", "x = fetch"),  # an `as` target
])
def test_no_import_where_none_is_needed_or_it_is_ambiguous(tmp_path, before, old, new):
    _, got = _import_answer(tmp_path, {**IMPORT_PKG, "app.py": before}, "app.py", old, new)
    assert got is None


def test_a_name_two_packages_define_is_imported_from_the_files_own_package(tmp_path):
    """`helper` defined in pkg/other.py and in another package: a file of pkg gets pkg's (in its
    import style); a file of neither package gets nothing (no guess)."""
    files = {**IMPORT_PKG, "lib2/__init__.py": "", "lib2/util.py": "def helper():\n    pass\n",
             "pkg/use.py": "from .a import x\n\nx = 1\n", "app.py": "x = 1\n"}
    text, got = _import_answer(tmp_path, files, "pkg/use.py", "x = 1", "x = helper()")
    assert got is not None and got.source == "import"
    edits = got.edits + [e for p in ([got.jump] if got.jump else []) for e in p.edits]
    assert apply_edits(text, edits) == "from .a import x\nfrom .other import helper\n\nx = helper()\n"
    _, got = _import_answer(tmp_path / "top", files, "app.py", "x = 1", "x = helper()")
    assert got is None


@pytest.mark.parametrize("path,before,after", [
    ("pkg/use.py", "from .a import x\n\nx = 1\n", "from . import other\nfrom .a import x\n\nx = other.helper()\n"),
    ("app.py", "x = 1\n", "from pkg import other\n\nx = other.helper()\n"),
])
def test_a_module_used_by_its_name_is_imported_from_its_package(tmp_path, path, before, after):
    """No definition of that name, but a submodule of a workspace package: `from pkg import m`
    (relative in a file of the package that imports relatively)."""
    text, got = _import_answer(tmp_path, {**IMPORT_PKG, path: before}, path, "x = 1", "x = other.helper()")
    assert got is not None and got.source == "import"
    edits = got.edits + [e for p in ([got.jump] if got.jump else []) for e in p.edits]
    assert apply_edits(text, edits) == after


def test_a_method_rename_follows_its_class_into_importers_and_subclasses(tmp_path):
    files = {"shapes.py": ("class Box:\n    def size(self):\n        return 1\n\n    def twice(self):\n"
                           "        return self.size() * 2\n\n\nclass Other:\n    def size(self):\n        return 2\n\n"
                           "    def use(self):\n        return self.size()\n"),
             "use.py": ("from shapes import Box\n\n\nclass Big(Box):\n    def more(self):\n        return self.size() + 1\n\n\n"
                        "def f(x):\n    return Box.size(x) + x.size()\n"),
             "mod.py": "import shapes\n\nshapes.Box.size(None)\n"}
    got = _follow_all(tmp_path, files, "shapes.py", "def size(self):", "def length(self):")  # Box's
    assert "return self.length() * 2" in got["shapes.py"] and "def use(self):\n        return self.size()" in got["shapes.py"]
    assert "return self.length() + 1" in got["use.py"] and "return Box.length(x) + x.size()" in got["use.py"]
    assert got["mod.py"] == "import shapes\n\nshapes.Box.length(None)\n"


def test_a_parameter_removed_from_a_header_over_several_lines(tmp_path):
    """The language server's event for a deleted line holds the line after it (whole lines)."""
    before = "def fetch(\n    url,\n    timeout=None,\n):\n    return url\n\n\n" + "# pad\n" * 30 + \
        "fetch('a', 3)\nfetch('b', timeout=4)\n"
    index = _workspace(tmp_path, {"core.py": before})
    text = before.replace("    timeout=None,\n", "", 1)
    history = [HistoryItem("core.py", "    timeout=None,\n):\n", "):\n")]
    got = Follower().answer(text, "core.py", 2, 0, history, language=None, read={"core.py": text}.get,
                            importers=index.importers, below=2)
    assert got.source == "signature"
    assert apply_edits(text, [e for p in got.all for e in p.edits]).endswith("fetch('a')\nfetch('b')\n")


def test_another_modules_namesake_in_an_import_is_left_alone(tmp_path):
    files = {"core.py": ("def fetch():\n    pass\n\n\ndef g():\n    from util import fetch as f\n    return f() or fetch()\n\n\n"
                         "def h():\n    from util import fetch\n    return fetch()\n"),
             "util.py": "def fetch():\n    pass\n",
             "app.py": "from util import fetch\nfrom core import fetch as cf\n\nfetch()\ncf()\n"}
    got = _follow_all(tmp_path, files, "core.py", "def fetch(", "def load(")
    assert got["core.py"] == files["core.py"].replace("def fetch(", "def load(").replace("or fetch()", "or load()")
    assert got["app.py"] == "from util import fetch\nfrom core import load as cf\n\nfetch()\ncf()\n"


def test_the_same_name_imported_twice_in_a_file_from_two_paths_to_it(tmp_path):
    files = {"pkg/__init__.py": "from .core import fetch\n",
             "pkg/core.py": "def fetch():\n    pass\n",
             "pkg/use.py": "from . import fetch\n\n\ndef f():\n    from pkg import fetch\n    return fetch()\n\n\nfetch()\n"}
    got = _follow_all(tmp_path, files, "pkg/core.py", "def fetch(", "def load(")
    assert got["pkg/use.py"] == files["pkg/use.py"].replace("fetch", "load")
