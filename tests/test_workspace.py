"""The workspace index and cross-file retrieval on small workspaces written here, one per
language and import form: outlines as tables, resolution through each import form and
re-exports, the deleted and renamed file, .gitignore and what the walk skips, symlink loops,
import cycles, a name defined in 50 files, the memory bound, the background builder, the budget
and determinism."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from completer.config import SCOPES, WorkspaceOptions, json_schema
from completer.documents import parse_snapshot
from completer.workspace import WorkspaceIndex, find_root
from completer.workspace.outline import outline

CUR = "‸"


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root


def index(root: Path, files: dict[str, str] | None = None, **opts) -> WorkspaceIndex:
    write(root, files or {})
    ix = WorkspaceIndex(root, WorkspaceOptions(**opts))
    ix.build()
    return ix


def at(ix: WorkspaceIndex, rel: str, budget: int = 1000):
    """Retrieve at the cursor marker of file `rel` (the marker is removed from the text)."""
    text = (ix.root / rel).read_text(encoding="utf-8")
    off = text.index(CUR)
    text = text.replace(CUR, "")
    return ix.retrieve(rel, text, off, budget)


def shown(snips) -> list[tuple[str, str]]:
    """(path, first line) of each snippet."""
    return [(s.path, s.text.split("\n")[0].strip()) for s in snips]


# -- outlines ------------------------------------------------------------------------------------------
OUTLINES = [
    ("python", ('@dataclass\nclass A(B):\n    """Doc.\n\n    more"""\n    x: int = 1\n    def __init__(self, a):\n'
     '        def inner(): pass\n    def _p(self): ...\ndef f(a, b=2) -> int:\n    """F."""\n    y = 1\nC = 3\n'),
     [("A", "class", -1, "@dataclass\nclass A(B):", "Doc."), ("x", "field", 0, "    x: int = 1", ""),
      ("__init__", "method", 0, "    def __init__(self, a):", ""), ("_p", "method", 0, "    def _p(self):", ""),
      ("f", "function", -1, "def f(a, b=2) -> int:", "F."), ("C", "variable", -1, "C = 3", "")]),
    ("javascript", ("/** Adds. */\nexport function add(a, b) { return a + b; }\n"
     "export const f = (a) => { const g = () => 1; };\nclass K extends B {\n  constructor(a) { }\n  m(x) { }\n}\n"),
     [("add", "function", -1, "export function add(a, b) {", "Adds."), ("f", "function", -1, "export const f = (a) => {", ""),
      ("K", "class", -1, "class K extends B {", ""), ("constructor", "method", 2, "  constructor(a) {", ""),
      ("m", "method", 2, "  m(x) {", "")]),
    ("typescript", ("export interface I {\n  x: number;\n  m(a: string): void;\n}\nexport type T = { a: number };\n"
     "export enum E { A }\n"),
     [("I", "interface", -1, "export interface I {", ""), ("x", "field", 0, "  x: number", ""),
      ("m", "field", 0, "  m(a: string): void", ""), ("T", "type", -1, "export type T = { a: number };", ""),
      ("E", "enum", -1, "export enum E {", "")]),
    ("go", ("package foo\n\n// Add adds.\nfunc Add(a, b int) int { return a + b }\n"
     "func (s *Server) Serve(x int) error { return nil }\ntype Server struct {\n\tAddr string\n}\nconst K = 1\n"),
     [("Add", "function", -1, "func Add(a, b int) int {", "Add adds."),
      ("Serve", "method", -1, "func (s *Server) Serve(x int) error {", ""),
      ("Server", "struct", -1, "type Server struct {", ""), ("Addr", "field", 2, "\tAddr string", ""),
      ("K", "variable", -1, "const K = 1", "")]),
    ("rust", ("/// Adds.\npub fn add(a: i32) -> i32 { a }\npub struct S {\n    pub a: i32,\n}\n"
     "impl S {\n    pub fn new() -> Self { S { a: 1 } }\n}\npub trait T { fn t(&self); }\n"),
     [("add", "function", -1, "pub fn add(a: i32) -> i32 {", "Adds."), ("S", "struct", -1, "pub struct S {", ""),
      ("a", "field", 1, "    pub a: i32", ""), ("S", "impl", -1, "impl S {", ""),
      ("new", "method", 3, "    pub fn new() -> Self {", ""), ("T", "trait", -1, "pub trait T {", ""),
      ("t", "field", 5, "fn t(&self);", "")]),
]


@pytest.mark.parametrize("lang,src,want", OUTLINES, ids=[o[0] for o in OUTLINES])
def test_outline(lang, src, want):
    o = outline("f", parse_snapshot(src, lang))
    got = [(d.name, d.kind, d.parent, d.signature, d.doc) for d in o.definitions]
    assert got == want


IMPORTS = [
    ("python", "import os, a.b as m\nfrom .x import f, g as h\nfrom . import *\n",
     [("os", "", "os"), ("a.b", "", "m"), (".x", "f", "f"), (".x", "g", "h"), (".", "*", "")]),
    ("javascript", ("import d, {a, b as c} from './m';\nimport * as ns from './n';\nexport {x} from './o';\n"
     "export * from './p';\nconst {u} = require('./s');\nconst t = require('./t');\n"),
     [("./m", "default", "d"), ("./m", "a", "a"), ("./m", "b", "c"), ("./n", "", "ns"), ("./o", "x", "x"),
      ("./p", "*", ""), ("./s", "u", "u"), ("./t", "", "t")]),
    ("go", 'package foo\nimport (\n  "fmt"\n  m "example.com/mod/m"\n)\n',
     [("fmt", "", "fmt"), ("example.com/mod/m", "", "m")]),
    ("rust", "use crate::a::{b, c::d as e, *};\nuse super::x;\nmod m;\n",
     [("crate::a", "b", "b"), ("crate::a::c", "d", "e"), ("crate::a", "*", ""), ("super", "x", "x"), ("self", "m", "m")]),
]


@pytest.mark.parametrize("lang,src,want", IMPORTS, ids=[i[0] for i in IMPORTS])
def test_imports(lang, src, want):
    o = outline("f", parse_snapshot(src, lang))
    assert [(i.source, i.name, i.alias) for i in o.imports] == want


# -- resolution per language and import form ---------------------------------------------------------------
PY = {
    "pkg/__init__.py": "from .models import Client\nfrom .util import *\n",
    "pkg/models.py": 'class Client:\n    """An HTTP client."""\n    def __init__(self, url: str):\n        self.url = url\n'
                     '    def get(self, path):\n        return 1\n    def _private(self):\n        pass\n',
    "pkg/util.py": 'def join_url(base, path):\n    """Join two parts."""\n    return base + path\n',
    "pkg/sub/__init__.py": "",
    "pkg/sub/deep.py": "def deep_fn(x):\n    return x\n",
}


@pytest.mark.parametrize("code,want", [
    ("from .models import Client\nc = Client(‸", ("pkg/models.py", "class Client:")),
    ("import pkg.util as u\nu.join_url(‸", ("pkg/util.py", "def join_url(base, path):")),
    ("from pkg import Client\nClient(‸", ("pkg/models.py", "class Client:")),          # __init__ re-export
    ("from pkg import join_url\njoin_url(‸", ("pkg/util.py", "def join_url(base, path):")),  # star re-export
    ("import pkg\npkg.Client(‸", ("pkg/models.py", "class Client:")),
    ("from .sub import deep\ndeep.deep_fn(‸", ("pkg/sub/deep.py", "def deep_fn(x):")),     # a submodule
    ("import pkg.sub.deep\npkg.sub.deep.deep_fn(‸", ("pkg/sub/deep.py", "def deep_fn(x):")),
    ("from .models import Client\nClient('u').get(‸", ("pkg/models.py", "class Client:")),
], ids=["from-relative", "import-as", "init-reexport", "star-reexport", "package-attr", "submodule",
        "dotted-import", "method-fallback"])
def test_python_resolution(tmp_path, code, want):
    ix = index(tmp_path, {**PY, "pkg/main.py": code})
    snips = at(ix, "pkg/main.py")
    assert shown(snips)[0] == want


def test_python_rendering_elides_bodies(tmp_path):
    ix = index(tmp_path, {**PY, "pkg/main.py": "from .models import Client\nClient(‸"})
    text = at(ix, "pkg/main.py")[0].text
    assert text == ('class Client:\n    """An HTTP client."""\n    def __init__(self, url: str):\n        ...\n'
                    '    def get(self, path):\n        ...')


JS = {
    "src/math.js": "/** Adds. */\nexport function add(a, b) {\n  return a + b;\n}\n"
                   "export default function mul(a, b) {\n  return a * b;\n}\n",
    "src/index.js": "export { add } from './math';\nexport * from './shapes';\n",
    "src/shapes.ts": "export class Circle {\n  constructor(r: number) { this.r = r; }\n  area(): number { return 1; }\n}\n"
                     "export interface Shape {\n  area(): number;\n}\n",
    "src/old.js": "const helper = (x) => {\n  return x;\n};\nmodule.exports = { helper };\n",
}


@pytest.mark.parametrize("code,want", [
    ("import { add } from './math';\nadd(‸", ("src/math.js", "// Adds.")),
    ("import * as m from './math';\nm.add(‸", ("src/math.js", "// Adds.")),
    ("import mul from './math';\nmul(‸", ("src/math.js", "export default function mul(a, b) { /* ... */ }")),
    ("import { add } from './index';\nadd(‸", ("src/math.js", "// Adds.")),       # export {…} from
    ("import { Circle } from './index';\nnew Circle(‸", ("src/shapes.ts", "export class Circle {")),  # export *
    ("import { Circle } from './shapes.js';\nnew Circle(‸", ("src/shapes.ts", "export class Circle {")),
    ("const { helper } = require('./old');\nhelper(‸", ("src/old.js", "const helper = (x) => { /* ... */ }")),
], ids=["named", "namespace", "default", "reexport", "star-reexport", "ts-js-extension", "require"])
def test_js_resolution(tmp_path, code, want):
    ix = index(tmp_path, {**JS, "src/app.ts": code})
    assert shown(at(ix, "src/app.ts"))[0] == want


GO = {
    "go.mod": "module example.com/app\n\ngo 1.22\n",
    "util/strings.go": "package util\n\n// Reverse reverses s.\nfunc Reverse(s string) string {\n\treturn s\n}\n",
    "server.go": "package main\n\ntype Server struct {\n\tAddr string\n}\n\n"
                 "func (s *Server) Start(port int) error {\n\treturn nil\n}\n\nfunc NewServer(addr string) *Server {\n"
                 "\treturn &Server{Addr: addr}\n}\n",
    "other/x.go": "package other\n\nfunc NewServer() {}\n",
}


@pytest.mark.parametrize("code,want", [
    ("package main\n\nfunc main() {\n\ts := NewServer(‸", ("server.go", "func NewServer(addr string) *Server { /* ... */ }")),
    ('package main\n\nimport "example.com/app/util"\n\nfunc main() {\n\tutil.Reverse(‸',
     ("util/strings.go", "// Reverse reverses s.")),
    ("package main\n\nfunc main() {\n\tvar s Server\n\ts.Start(‸",
     ("server.go", "func (s *Server) Start(port int) error { /* ... */ }")),
], ids=["same-package", "module-import", "method"])
def test_go_resolution(tmp_path, code, want):
    ix = index(tmp_path, {**GO, "main.go": code})
    assert shown(at(ix, "main.go"))[0] == want


RS = {
    "Cargo.toml": '[package]\nname = "app"\n',
    "src/net/mod.rs": "pub mod client;\n",
    "src/net/client.rs": "pub struct Client {\n    pub url: String,\n}\n\nimpl Client {\n"
                         "    pub fn new(url: &str) -> Self {\n        Client { url: url.into() }\n    }\n}\n",
    "src/util.rs": "/// Doubles x.\npub fn double(x: i32) -> i32 {\n    x * 2\n}\n",
}


@pytest.mark.parametrize("code,want", [
    ("use crate::net::client::Client;\nfn main() {\n    let c = Client::new(‸",
     ("src/net/client.rs", "impl Client {")),
    ("mod util;\nfn main() {\n    util::double(‸", ("src/util.rs", "// Doubles x.")),
    ("use crate::util::double;\nfn main() {\n    double(‸", ("src/util.rs", "// Doubles x.")),
    ("fn main() {\n    crate::util::double(‸", ("src/util.rs", "// Doubles x.")),
], ids=["use-crate-method", "mod", "use-fn", "crate-path"])
def test_rust_resolution(tmp_path, code, want):
    ix = index(tmp_path, {**RS, "src/main.rs": code})
    assert shown(at(ix, "src/main.rs"))[0] == want


# -- the index stays correct under change --------------------------------------------------------------------
def test_deleted_and_renamed_file(tmp_path):
    ix = index(tmp_path, {**PY, "pkg/main.py": "from .util import join_url\njoin_url(‸"})
    assert shown(at(ix, "pkg/main.py"))[0][0] == "pkg/util.py"
    (tmp_path / "pkg/util.py").rename(tmp_path / "pkg/helpers.py")
    ix.remove(tmp_path / "pkg/util.py")
    ix.update(tmp_path / "pkg/helpers.py")
    assert all(s.path != "pkg/util.py" for s in at(ix, "pkg/main.py"))
    write(tmp_path, {"pkg/main.py": "from .helpers import join_url\njoin_url(‸"})
    assert shown(at(ix, "pkg/main.py"))[0][0] == "pkg/helpers.py"


def test_live_text_beats_the_disk(tmp_path):
    ix = index(tmp_path, {**PY, "pkg/main.py": "from .util import join_url\njoin_url(‸"})
    ix.update("pkg/util.py", "def join_url(a, b, c):\n    pass\n")  # the editor's unsaved text
    ix.update("pkg/util.py")  # a watched-file event for the same path: the disk's older text
    assert "def join_url(a, b, c):" in at(ix, "pkg/main.py")[0].text
    (tmp_path / "pkg/util.py").write_text("def join_url(x):\n    pass\n")
    ix.closed("pkg/util.py")  # didClose: back to the disk
    assert "def join_url(x):" in at(ix, "pkg/main.py")[0].text


def test_gitignore_vendored_binary_huge(tmp_path):
    ix = index(tmp_path, {
        ".gitignore": "gen/\n*.tmp.py\n/top.py\n!keep.tmp.py\n",
        "a.py": "def a(): pass\n", "gen/g.py": "def g(): pass\n", "x.tmp.py": "def x(): pass\n",
        "keep.tmp.py": "def keep(): pass\n", "top.py": "def top(): pass\n", "sub/top.py": "def subtop(): pass\n",
        "sub/.gitignore": "local.py\n", "sub/local.py": "def local(): pass\n",
        "node_modules/lib/index.js": "export function lib() {}\n", "vendor/v.go": "package v\nfunc V() {}\n",
        "huge.py": "x = 1\n" * 200_000, "bin.py": "def b(): pass\n\x00\x01",
    }, index_max_file_kb=64)
    (tmp_path / "latin1.py").write_bytes(b"s = '\xe9'\n")
    ix.update(tmp_path / "latin1.py")
    assert sorted(ix._outlines) == ["a.py", "keep.tmp.py", "sub/top.py"]


def test_symlink_loop_and_unreadable_files(tmp_path):
    write(tmp_path, {"a/m.py": "def m(): pass\n"})
    os.symlink(tmp_path / "a", tmp_path / "a" / "loop")        # a directory that contains itself
    os.symlink(tmp_path, tmp_path / "a" / "up")                # and one back to the root
    os.symlink(tmp_path / "missing.py", tmp_path / "dangling.py")
    os.symlink("/", tmp_path / "outside")                      # never leaves the root
    ix = index(tmp_path)
    assert sorted(ix._outlines) == ["a/m.py"]


def test_import_cycle(tmp_path):
    ix = index(tmp_path, {"a.py": "from b import thing\n", "b.py": "from a import thing\n",
                          "c.py": "from a import thing\nthing(‸"})
    assert at(ix, "c.py") == []


def test_a_name_defined_in_50_files(tmp_path):
    files = {f"p{i}/mod.py": "def run(x):\n    pass\n" for i in range(50)}
    files["p7/__init__.py"] = ""
    files["main.py"] = "from p7.mod import run\nrun(‸"
    ix = index(tmp_path, files)
    assert shown(at(ix, "main.py")) == [("p7/mod.py", "def run(x):")]
    # an attribute call no import explains: too ambiguous to guess among 50 files
    write(tmp_path, {"main.py": "def f(o):\n    o.run(‸"})
    ix.update("main.py")
    assert at(ix, "main.py") == []


def test_memory_bound(tmp_path):
    files = {f"m{i:03}.py": "".join(f"def f{i}_{j}(a, b, c):\n    pass\n" for j in range(40)) for i in range(200)}
    ix = index(tmp_path, files, index_memory_mb=1)
    st = ix.stats()
    assert st["full"] and 0 < st["files"] < 200
    assert st["bytes"] <= 2**20
    ix.update("m199.py", files["m199.py"])  # an open document is indexed even at the bound
    assert "m199.py" in ix._outlines and ix.stats()["bytes"] <= 2**20


def test_background_builder(tmp_path):
    write(tmp_path, {**PY, **{f"gen{i}.py": f"def g{i}(): pass\n" for i in range(300)},
                     "pkg/main.py": "from .util import join_url\njoin_url(‸"})
    events = []
    ix = WorkspaceIndex(tmp_path, on_progress=lambda kind, n, msg: events.append(kind))
    ix.start()
    ix.update("pkg/util.py", "def join_url(live):\n    pass\n", recent=True)
    at(ix, "pkg/main.py")  # answers with what is indexed so far
    assert ix.wait_idle(60)
    assert events[0] == "begin" and events[-1] == "end" and "report" in events
    assert ix.stats()["files"] == 306
    assert "def join_url(live):" in at(ix, "pkg/main.py")[0].text
    ix.close()


# -- budget, files, similar snippets, determinism ----------------------------------------------------------
def test_budget_and_max_files(tmp_path):
    files = {f"m{i}.py": f"class C{i}:\n" + "".join(f"    def m{j}(self, a, b):\n        pass\n" for j in range(30))
             for i in range(6)}
    files["main.py"] = "".join(f"from m{i} import C{i}\n" for i in range(6)) + "x = C0(C1(), C2(), C3(), C4(), C5(‸"
    ix = index(tmp_path, files, cross_file_max_files=3)
    for budget in (40, 200, 2000):
        snips = at(ix, "main.py", budget)
        assert sum(s.tokens for s in snips) <= budget
        assert len({s.path for s in snips}) <= 3
    assert at(ix, "main.py", 0) == []
    assert shown(at(ix, "main.py", 40))[0] == ("m5.py", "class C5:")  # the short form fits a small budget
    assert index(tmp_path, cross_file=False).retrieve("main.py", "C0(", 3, 1000) == []


def test_similar_snippets_skip_what_the_prompt_holds(tmp_path):
    shared = "".join(f"    total_{k} = compute_total(items_{k}, rate_{k})\n" for k in range(12))
    other = "def report(items, rate):\n" + "".join(f"    total_{k} = format_line(items_{k}, rate_{k}, {k})\n"
                                                   for k in range(12))
    ix = index(tmp_path, {"a.py": "def copy():\n" + shared, "b.py": other,
                          "main.py": "def f(items, rate):\n" + shared + "    line = format_line(items, rate‸"})
    ix.update("a.py", (tmp_path / "a.py").read_text(), recent=True)
    ix.update("b.py", (tmp_path / "b.py").read_text(), recent=True)
    snips = at(ix, "main.py")
    assert [s.path for s in snips if s.kind == "similar"] == ["b.py"]  # a.py repeats the prompt's own lines


def test_deterministic(tmp_path):
    ws = {**PY, "pkg/main.py": "from . import util\nfrom .models import Client\n"
          "def f(c: Client):\n    c.get(util.join_url(‸"}
    a = index(tmp_path / "a", ws)
    b = index(tmp_path / "b", ws)
    for ix in (a, b):
        for p in ("pkg/util.py", "pkg/models.py"):
            ix.update(p, (ix.root / p).read_text(), recent=True)
    got = [s.as_dict() for s in at(a, "pkg/main.py")]
    assert got == [s.as_dict() for s in at(b, "pkg/main.py")] == [s.as_dict() for s in at(a, "pkg/main.py")]
    assert [(d["path"], d["kind"]) for d in got][:2] == [("pkg/util.py", "definition"), ("pkg/models.py", "definition")]


def test_find_root(tmp_path):
    write(tmp_path, {"proj/pyproject.toml": "", "proj/src/pkg/m.py": "", "loose/x.py": ""})
    assert find_root(tmp_path / "proj/src/pkg/m.py") == (tmp_path / "proj").resolve()
    assert find_root(tmp_path / "loose/x.py") in ((tmp_path / "loose").resolve(),
                                                  *[p for p in (tmp_path / "loose").resolve().parents])


def test_options_in_the_schema():
    assert SCOPES["workspace"] is WorkspaceOptions
    props = json_schema(["workspace"])["properties"]
    assert set(props) == {"cross_file", "cross_file_share", "cross_file_max_files", "index_memory_mb",
                          "index_max_file_kb"}


def test_a_document_nobody_indexed_and_one_outside(tmp_path):
    ix = index(tmp_path, PY)
    text = "# é\nfrom .util import join_url\njoin_url("  # a new, unsaved file; bytes ≠ chars before the cursor
    assert shown(ix.retrieve(tmp_path / "pkg/new.py", text, len(text), 500)) == [
        ("pkg/util.py", "def join_url(base, path):")]
    outside = tmp_path.parent / "elsewhere.py"
    assert ix.retrieve(outside, "join_url(", 9, 500) == []  # not in the workspace: nothing to resolve through


def test_a_file_that_changes_while_it_is_read(tmp_path, monkeypatch):
    import completer.workspace.files as files_module

    write(tmp_path, {"m.py": "def old(): pass\n"})
    real = files_module._read_fd
    calls = []

    def racing(fd, n):
        data = real(fd, n)
        if not calls:  # a writer saves while the first read is under way
            (tmp_path / "m.py").write_text("def new(): pass\n")
            os.utime(tmp_path / "m.py", ns=(1, 1))
        calls.append(data)
        return data

    monkeypatch.setattr(files_module, "_read_fd", racing)
    ix = index(tmp_path)
    assert [d.name for d in ix._outlines["m.py"].definitions] == ["new"] and len(calls) == 2


def test_names_after_a_long_docstring(tmp_path):
    doc = "".join(f"    line {i}: don't (stop) here\n" for i in range(120))
    ix = index(tmp_path, {**PY, "pkg/main.py": f'from .util import join_url\ndef f(a):\n    """Doc.\n{doc}    """\n'
                          "    return join_url(‸"})
    assert shown(at(ix, "pkg/main.py"))[0] == ("pkg/util.py", "def join_url(base, path):")
