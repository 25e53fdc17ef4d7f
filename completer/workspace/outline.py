"""One file's outline for the workspace index: its named top-level and class-level definitions
(name, kind, signature, first docstring line, line range) and what its imports bind, read from
the `symbols.scm` and `bindings.scm` queries of its language. An outline keeps no file text:
what the index holds per file is a few hundred bytes per definition."""
from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field

from tree_sitter import Node, QueryCursor

from ..documents import Snapshot
from ..syntax.context import _signature  # the one rule for "a definition's header, body left out"
from ..syntax.lang import query

CONTAINERS = frozenset({"class", "struct", "interface", "trait", "enum", "impl"})
MAX_LINE = 200  # a field's or variable's line is cut here: a long literal says nothing about its use
MAX_DEFINITIONS = 2000  # per file: a generated table of constants is not worth more
QUERY_SPAN = 8192  # bytes one query call covers (see _matches)


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    kind: str        # function | method | class | struct | interface | trait | enum | impl | type | variable | field
    signature: str   # the header with the body left out (a field or variable: its first line), indentation kept
    doc: str         # first line of its docstring or doc comment, or ""
    start_line: int  # 0-based, inclusive; decorators and doc comments included
    end_line: int
    parent: int      # index of the enclosing container in Outline.definitions, -1 at top level
    owner: str       # the type a method belongs to by name (Go receivers), else ""


@dataclass(frozen=True, slots=True)
class Import:
    source: str    # the module as written: ".m", "pkg.m", "./m", "crate::a", "example.com/x/y"
    name: str      # the name taken from it; "" = the module itself, "*" = every name it exports
    alias: str     # the local name bound (dotted for Python's `import a.b`); "" for a star
    export: bool = False  # JS/TS `export ... from`: re-exported to importers of this file


@dataclass(frozen=True)
class Outline:
    path: str      # relative to the workspace root, '/'-separated
    language: str
    definitions: tuple[Definition, ...]
    imports: tuple[Import, ...]
    package: str = ""   # Go: the package clause
    stamp: int = 0      # hash of the text it was read from (an unchanged update is a no-op)
    top: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)  # name → top-level indices
    # byte offsets where the top-level statements that begin a line start, and for a Python class
    # among them (by its start) where the lines of its body's statements start (documents.parse_ranges)
    starts: array = field(default_factory=lambda: array("I"), compare=False)
    bodies: dict[int, array] = field(default_factory=dict, compare=False)

    @property
    def cost(self) -> int:
        """Estimated bytes held (CPython object overheads included), for the index's memory bound."""
        d = sum(len(x.signature) + len(x.doc) + len(x.name) + 240 for x in self.definitions)
        return 600 + len(self.path) + d + sum(len(i.source) + len(i.name) + len(i.alias) + 160 for i in self.imports) \
            + 4 * len(self.starts) + sum(100 + 4 * len(m) for m in self.bodies.values())

    def members(self, i: int) -> list[int]:
        return [j for j, d in enumerate(self.definitions) if d.parent == i]


def outline(path: str, snap: Snapshot) -> Outline:
    """The outline of a parsed file (no tree: an empty outline)."""
    if snap.tree is None or snap.language is None:
        return Outline(path, snap.language or "", (), (), stamp=hash(snap.text))
    defs = _definitions(snap)
    top: dict[str, list[int]] = {}
    for i, d in enumerate(defs):
        if d.parent < 0:
            top.setdefault(d.name, []).append(i)
    imports, package = _imports(snap)
    tops = [n for n in snap.tree.root_node.children if n.start_point[1] == 0]
    bodies = _class_bodies(snap, tops) if snap.language == "python" else {}
    return Outline(path, snap.language, tuple(defs), tuple(imports), package, hash(snap.text),
                   {k: tuple(v) for k, v in top.items()}, array("I", (n.start_byte for n in tops)), bodies)


def _class_bodies(snap: Snapshot, tops: list[Node]) -> dict[int, array]:
    """Top-level classes whose body starts on a line of its own, by start byte: where the lines
    of their body's statements start (a rename's importer parses the class's header and the
    statements that hold the name, not the whole class)."""
    out = {}
    for n in tops:
        c = n.child_by_field_name("definition") if n.type == "decorated_definition" else n
        body = c.child_by_field_name("body") if c is not None and c.type == "class_definition" else None
        if body is None or body.start_point[0] <= c.start_point[0]:
            continue
        # a comment is no statement: it goes with the statement before it (a class with only a
        # comment for a body would not parse as one)
        lines = sorted({snap.source.rfind(b"\n", 0, m.start_byte) + 1 for m in body.children if m.type != "comment"})
        if len(lines) > 1:
            out[n.start_byte] = array("I", lines)
    return out


def _text(snap: Snapshot, n: Node) -> str:
    return snap.source[n.start_byte:n.end_byte].decode("utf-8", "replace")


def _matches(snap: Snapshot, name: str) -> list[tuple[int, dict[str, list[Node]]]]:
    """Matches of query `name` over the file, QUERY_SPAN bytes per call: a call holds the GIL
    (30 ms for a 100 KB file here), between calls the language server's thread can run."""
    q = query(snap.language, name)
    if q is None:
        return []
    out, seen = [], set()
    root = snap.tree.root_node
    for lo, hi in _spans(root, QUERY_SPAN):
        qc = QueryCursor(q)
        qc.set_byte_range(lo, hi)
        for pattern, caps in qc.matches(root):
            key = (pattern, tuple(n.id for ns in caps.values() for n in ns))
            if key not in seen:  # a node across two spans is matched in both
                seen.add(key)
                out.append((pattern, caps))
    return out


def _spans(node: Node, limit: int) -> list[tuple[int, int]]:
    """Contiguous byte ranges covering `node`, cut at child boundaries, each at most `limit`
    bytes unless one leaf is larger."""
    out, lo = [], node.start_byte
    for c in node.children:
        if c.end_byte - lo <= limit:
            continue
        if c.start_byte > lo:
            out.append((lo, c.start_byte))
            lo = c.start_byte
        if c.end_byte - c.start_byte > limit and c.child_count:
            out += _spans(c, limit)
            lo = c.end_byte
    if node.end_byte > lo:
        out.append((lo, node.end_byte))
    return out


# -- definitions ----------------------------------------------------------------------------------
def _definitions(snap: Snapshot) -> list[Definition]:
    found: dict[int, tuple[str, Node, Node, Node | None, Node | None]] = {}  # node id → (kind, node, name, body, receiver)
    rank: dict[int, int] = {}
    for pattern, caps in _matches(snap, "symbols"):
        kind = next((k.split(".", 1)[1] for k in caps if k.startswith("definition.")), None)
        if kind is None:
            continue
        node = caps["definition." + kind][0]
        if rank.get(node.id, pattern + 1) > pattern:  # the first pattern that names a node decides its kind
            rank[node.id] = pattern
            found[node.id] = (kind, node, caps["name"][0], (caps.get("body") or [None])[0],
                              (caps.get("receiver") or [None])[0])
    fn_ids = {i for i, v in found.items() if v[0] == "function"}
    items = []
    for kind, node, name, body, receiver in found.values():
        parent, p = None, node.parent
        while p is not None:
            if p.id in fn_ids:
                break  # inside a function body: local, not part of the file's outline
            if parent is None and p.id in found and found[p.id][0] in CONTAINERS:
                parent = p.id
            p = p.parent
        if p is None and (kind != "field" or parent is not None):  # else a type literal's member
            items.append((node.start_byte, kind, node, name, body, receiver, parent))
    items.sort(key=lambda t: t[0])
    items = items[:MAX_DEFINITIONS]
    index = {t[2].id: i for i, t in enumerate(items)}
    out = []
    for _, kind, node, name, body, receiver, parent in items:
        pi = index.get(parent, -1)
        if kind == "function" and (pi >= 0 or receiver is not None):
            kind = "method"
        start = _leading(snap, node)
        out.append(Definition(_text(snap, name), kind, _header(snap, node, body), _doc(snap, start, body),
                              start.start_point.row, node.end_point.row, pi,
                              _text(snap, receiver) if receiver is not None else ""))
    return out


def _leading(snap: Snapshot, node: Node) -> Node:
    """The node a definition's lines start at: its decorators (Python) or the doc comments right
    above it, so that a snippet carries them."""
    if node.parent is not None and node.parent.type in ("decorated_definition", "export_statement"):
        node = node.parent
    first = node
    prev = node.prev_sibling
    while prev is not None and "comment" in prev.type and prev.end_point.row >= first.start_point.row - 1:
        first = prev
        prev = prev.prev_sibling
    return first


def _header(snap: Snapshot, node: Node, body: Node | None) -> str:
    lead = node.parent if node.parent is not None and node.parent.type in ("decorated_definition",
                                                                           "export_statement") else node
    if body is None or body.start_byte <= node.start_byte:  # a field, a variable: its first line
        src = snap.source
        ls = src.rfind(b"\n", 0, lead.start_byte) + 1
        indent = src[ls:lead.start_byte].decode("utf-8", "replace")
        line = (indent if not indent.strip() else "") + _text(snap, lead).split("\n", 1)[0].rstrip()
        return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " …"
    sig = _signature(snap, node, body)
    if lead is not node:  # decorators, `export`: from the outer node's start up to the definition
        indent = sig[: len(sig) - len(sig.lstrip())]
        sig = indent + _text(snap, lead)[: node.start_byte - lead.start_byte] + sig.lstrip()
    return sig


_STRING_QUOTES = re.compile(r'[rRbBuUfF]{0,2}("""|\'\'\'|"|\')')


def _doc(snap: Snapshot, start: Node, body: Node | None) -> str:
    """First line of a Python docstring, else of the doc comments above the definition."""
    if snap.language == "python":
        first = body.named_children[0] if body is not None and body.named_children else None
        if first is not None and first.type == "expression_statement" and first.named_children \
                and first.named_children[0].type == "string":
            return _first_line(_string_body(_text(snap, first.named_children[0])))
        return ""
    if "comment" in start.type:
        return _first_line(_text(snap, start).lstrip("/*!# ").strip())
    return ""


def _string_body(literal: str) -> str:
    """A string literal's text without its prefix letters and quotes (stripping the letters
    r, b, u from both ends as characters cut "Return ..." to "eturn ...")."""
    m = _STRING_QUOTES.match(literal)
    body = literal[m.end():] if m else literal
    q = m.group(1) if m else ""
    return body[: -len(q)] if q and body.endswith(q) else body


def _first_line(s: str) -> str:
    line = s.strip().split("\n", 1)[0].strip().rstrip("*/").strip()
    return line[:MAX_LINE]


# -- imports ----------------------------------------------------------------------------------------
def _imports(snap: Snapshot) -> tuple[list[Import], str]:
    out: list[Import] = []
    package = ""
    for _, caps in _matches(snap, "bindings"):
        def get(k: str, caps=caps) -> str:
            return _text(snap, caps[k][0]) if k in caps else ""
        if "package" in caps:
            package = get("package")
        elif "tree" in caps:
            out += _use_tree(snap, caps["tree"][0], [])
        elif "module" in caps:  # Rust `mod name;`: a child module
            out.append(Import("self", get("module"), get("module")))
        elif snap.language == "python":
            out.append(_python(get("source"), get("name"), get("alias"), "star" in caps))
        elif snap.language == "go":
            src = get("source")
            out.append(Import(src, "", get("alias") or src.rsplit("/", 1)[-1]))
        else:
            if "star" in caps:
                name, alias = "*", ""
            elif "name" in caps:
                name, alias = get("name"), get("alias") or get("name")
            else:  # `import d from`: the default export; `import * as ns`, require(): the module
                clause = caps["alias"][0].parent
                name, alias = ("default" if clause is not None and clause.type == "import_clause" else ""), get("alias")
            out.append(Import(get("source"), name, alias, "export" in caps))
    return out, package


def _python(source: str, name: str, alias: str, star: bool) -> Import:
    if star:
        return Import(source, "*", "")
    if not name:  # `import a.b` binds the chain a.b; `import a.b as m` binds m to a.b
        return Import(source, "", alias or source)
    return Import(source, name, alias or name)


def _use_tree(snap: Snapshot, n: Node, prefix: list[str]) -> list[Import]:
    """Flatten a Rust use tree: `crate::a::{b, c::d as e, *}` → (crate::a, b), (crate::a::c, d → e), (crate::a, *)."""
    t = n.type
    if t == "use_as_clause":
        path = _path(snap, n.child_by_field_name("path"))
        alias = n.child_by_field_name("alias")
        full = prefix + path
        return [Import("::".join(full[:-1]), full[-1], _text(snap, alias) if alias else full[-1])] if full else []
    if t == "use_wildcard":
        base = prefix + (_path(snap, n.named_children[0]) if n.named_children else [])
        return [Import("::".join(base), "*", "")]
    if t == "scoped_use_list":
        p = n.child_by_field_name("path")
        lst = n.child_by_field_name("list")
        base = prefix + (_path(snap, p) if p is not None else [])
        return _use_tree(snap, lst, base) if lst is not None else []
    if t == "use_list":
        return [i for c in n.named_children for i in _use_tree(snap, c, prefix)]
    full = prefix + _path(snap, n)
    if not full:
        return []
    if full[-1] == "self":  # `use a::b::{self}` binds b
        full = full[:-1]
    return [Import("::".join(full[:-1]), full[-1], full[-1])] if full else []


def _path(snap: Snapshot, n: Node | None) -> list[str]:
    if n is None:
        return []
    if n.type == "scoped_identifier":
        return _path(snap, n.child_by_field_name("path")) + _path(snap, n.child_by_field_name("name"))
    return [_text(snap, n)]
