"""Next edits past the editable region (issue 39): a definition renamed, or its parameters changed,
is followed to its uses further down the file and in the workspace files that import it, from the
syntax tree and the workspace index — no model. The answer is the edits inside the region (shown
in place, as before) and a **jump**: the next place outside it, in this file or another, open or
closed, with the edit that place needs.

What is followed (the language's `defines.scm`: `@def.function`, `@def.class`, `@def.variable`
at top level, `@def.method`, `@def.parameter`):

- a rename X → Y at a definition: every name X that resolves to it — in this file (not where a
  function rebinds X: a parameter or an assignment), in files that import it under X (`from m
  import X`, a star import, Go's same-package files: each bare X; `from m import X as b`: the
  import only), as `m.X` where `m` is a module that holds it (`import pkg.m as m`, re-exports
  through a package's `__init__`), as resolved by completer/workspace (refs.py). A method: its
  uses through its class (here and in the files importing it) and through `self`/`cls` in the
  class and the classes deriving from it by name (no types: another object's `obj.X` is not
  known to be it). A parameter: its uses in the function and the keyword arguments that
  name it at the function's calls, here and in importers. Strings, comments and namesakes with
  another binding are not names of it.
- a Python function's parameters removed, renamed or reordered at its `def`: each call (here and
  in importers) has its arguments moved to match, positional and keyword; a parameter added
  without a default: a jump to each call, with no edit (no guess at the value). Calls with
  `*args`/`**kwargs` are left as they are.

State: one Plan (the latest change followed). Places are found again from each file's current
text at every request (a place the user edited, a file changed on disk, the editor's unsaved
text: what is offered is always for the text as it is), so a stale place is never offered; a
signature plan remembers the calls it rewrote (a reordered call reads like one still to
reorder). A plan ends when nothing is left, when the user dismisses a jump, or when a new
change replaces it. Torch-free."""
from __future__ import annotations

import bisect
import builtins
import hashlib
import keyword
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from tree_sitter import Node

from ..documents import Snapshot, encode, language_for, line_starts, parse_ranges, parse_snapshot
from ..syntax.lang import captures, query
from .diff import TextEdit, apply_edits
from .formats import HistoryItem
from .region import RegionError, editable_region
from .rename import callee, last_rename, receiver, renamed, roles
from .repeat import Rule
from .repeat import detect as detect_repeat
from .repeat import sites as repeat_sites

Read = Callable[[str], "str | None"]  # a workspace path → its text now (the editor's, else the disk's)
Importers = Callable[[str, str, str], list]  # (path, name, text before) → completer.workspace.refs.Use list
Providers = Callable[[str, str], list]  # (path, name) → [(file, module)] defining the name (the index's)
Statements = Callable[[str, str], "tuple | None"]  # (path, text) → where its statements start (the index's, parse_ranges)
NEAR_BYTES = 200  # without the edit's lines in the text: the renamed definition is this close to the cursor
MAX_EDITS = 16   # history items searched for the renamed definition
MAX_FILES = 200
MEMO = 1024      # files' places remembered (see Follower._places)  # importing files a plan follows (a name imported by every file of a monorepo)
SCOPES = ("function_definition", "lambda", "function_declaration", "function_expression", "arrow_function",
          "method_definition", "method_declaration", "func_literal", "function_item", "closure_expression")
BINDERS = {"assignment": "left", "variable_declarator": "name", "short_var_declaration": "left",
           "let_declaration": "pattern", "for_statement": "left", "for_in_clause": "left",
           "as_pattern_target": None, "lambda_parameters": None}  # a function (or comprehension) binding X shadows it
_WORD = re.compile(r"[^\W\d]\w*")
COMPREHENSIONS = ("list_comprehension", "set_comprehension", "dictionary_comprehension", "generator_expression")
IMPORTS = ("import_from_statement", "import_statement", "export_statement", "use_declaration", "import_declaration")


@dataclass(frozen=True)
class Param:
    name: str
    default: bool
    kind: str  # positional | keyword (after `*`) | args (`*args`) | kwargs (`**kw`)


@dataclass(frozen=True)
class Change:
    """What the user changed at a definition."""
    kind: str       # "rename" | "signature"
    language: str
    origin: str     # the definition's file
    role: str       # function | class | variable | method | parameter
    old: str        # rename: X; signature: the function's name
    new: str        # rename: Y; signature: the function's name
    owner: str = ""  # a method's class, a parameter's function
    before: tuple[Param, ...] = ()
    after: tuple[Param, ...] = ()
    uses: tuple = ()  # completer.workspace.refs.Use: the importing files
    rule: Rule | None = None  # kind "repeat": the edit the user made twice (repeat.py)


@dataclass(frozen=True)
class Place:
    """One place to edit: the sites on one line (a rename), or one call. `edits` empty: a place
    to go to with nothing to apply (a call that needs an argument the user must write)."""
    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    edits: tuple[TextEdit, ...]
    digest: str  # sha256 of the file's text the place was computed on


@dataclass
class Answer:
    edits: list[TextEdit]   # in the current file, inside its editable region
    jump: Place | None      # the next place outside it
    source: str             # "rename" | "signature" | "import" | "repeat" (the Change's kind)
    left: int               # places still to go, the jump's included
    total_ms: float = 0.0
    all: list[Place] = field(default_factory=list)    # every place left: the region's, then `later`
    later: list[Place] = field(default_factory=list)  # the places past the region, the jump first


@lru_cache(maxsize=16)  # a file's text is digested for the memo's key, then for its places
def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- detecting a change --------------------------------------------------------------------------
def detect(text: str, path: str, cursor: int, history: Sequence[HistoryItem], language: str | None,
           importers: Importers | None = None, providers: Providers | None = None, tree=None) -> Change | None:
    """The change the user's last edit made at a definition near `cursor` (char offset), or None.
    `tree`: the text's parse when the caller has one."""
    lang = language_for(language, path)
    if lang is None:
        return None
    got = last_rename(history, path)
    if query(lang, "defines") is None:
        return _repeated(text, path, cursor, history, lang, tree) if got is None else None
    if got is not None:
        # the edits of this file that renamed X to Y, newest first (the definition's, then the
        # uses accepted after it, in the language server's history; in file order in a history
        # made of two versions): the renamed definition is in one of their lines
        for h in [h for h in reversed(history) if h.path == path and renamed(h.old, h.new) == got][:MAX_EDITS] or [None]:
            at = _undo_at(text, h, cursor) if h is not None else None
            span = (at, at + len(h.new)) if at is not None else (cursor - NEAR_BYTES, cursor + NEAR_BYTES)
            if found := _renamed_definition(text, path, span, lang, *got, importers, tree):
                return found
    if lang == "python" and history and history[-1].path == path:
        found = _signature(text, path, cursor, history[-1], importers, tree) or (
            _needs_import(text, path, cursor, history[-1], providers, tree) if providers is not None else None)
        if found is not None:
            return found
    return _repeated(text, path, cursor, history, lang, tree) if got is None else None  # a rename is rename.py's


def _repeated(text: str, path: str, cursor: int, history: Sequence[HistoryItem], lang: str, tree) -> Change | None:
    """The same edit made twice by the file's last two edits (repeat.py), as a Change."""
    got = detect_repeat(text, path, cursor, history, lang, tree)
    return None if got is None else Change("repeat", lang, path, "repeat", got[0].removed, got[0].inserted,
                                           rule=got[0])


# -- the import a new name needs ------------------------------------------------------------------
PARAMS = ("parameters", "lambda_parameters", "default_parameter", "typed_parameter", "typed_default_parameter",
          "list_splat_pattern", "dictionary_splat_pattern")


def _needs_import(text: str, path: str, cursor: int, last: HistoryItem, providers: Providers,
                  tree=None) -> Change | None:
    """A name the last edit brought in that nothing in the file binds, not a builtin, and that
    exactly one workspace module defines at top level: the import it needs, in the file's style
    (a relative import where the file uses them for its own package; added to an existing `from
    <module> import` line)."""
    words = set(_WORD.findall(last.new)) - set(_WORD.findall(last.old))
    words = {w for w in words if not keyword.iskeyword(w) and not hasattr(builtins, w)}
    at = _undo_at(text, last, cursor)
    if not words or at is None:
        return None
    snap = _parsed(text, "python", tree)
    if snap.tree is None:
        return None
    lo, hi = snap.byte_at(at), snap.byte_at(at + len(last.new))
    used = [n for k, (r, n) in roles(captures(snap, "names", lo, hi)).items()
            if r == "name" and lo <= k[0] and k[1] <= hi and _text(snap, n) in words and not _binding(n)]
    for n in sorted(used, key=lambda n: abs(snap.char_at(n.end_byte) - cursor)):
        name = _text(snap, n)
        if _bound(snap, name):
            continue
        found = providers(path, name)
        if len(found) == 1:
            return Change("import", "python", path, "import", name, _import_source(snap, path, *found[0]))
        if len(found) > 1 and len({f for f, _ in found if not f.endswith("__init__.py")}) == 1:
            # one definition and packages re-exporting it: the module this file already imports from
            sources = Counter(_text(snap, c) for c in captures(snap, "bindings", 0, len(snap.source)).get("source", ()))
            styled = sorted((f, m) for f, m in found if _import_source(snap, path, f, m) in sources
                            and _import_source(snap, path, f, m).strip("."))  # `from . import` takes submodules
            defining = next((f, m) for f, m in found if not f.endswith("__init__.py"))
            best = max(styled, key=lambda fm: (sources[_import_source(snap, path, *fm)], fm == defining)) \
                if styled else defining
            return Change("import", "python", path, "import", name, _import_source(snap, path, *best))
        own = [(f, m) for f, m in found if not f.endswith("__init__.py") and path.startswith(_package_dir(f, m) + "/")]
        if len(own) == 1:  # defined in several packages, once in the file's own: that one
            return Change("import", "python", path, "import", name, _import_source(snap, path, *own[0]))
    return None


def _package_dir(path: str, module: str) -> str:
    """The directory of the top package of `module` (dotted), the file at `path`: `src/pkg` for
    `src/pkg/sub/m.py` as `pkg.sub.m` ("" where the module's name is not the file's path)."""
    parts = path.rsplit(".", 1)[0].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    k = len(module.split("."))
    return "/".join(parts[:len(parts) - k + 1]) if module and parts[len(parts) - k:] == module.split(".") else ""


def _binding(n: Node) -> bool:
    """Whether identifier `n` binds its name (a definition, parameter, assignment target, import,
    `as` target, `global`), rather than uses it."""
    p = n.parent
    if p is None:
        return False
    if p.type in ("pattern_list", "tuple_pattern", "list_pattern", "expression_list") and p.parent is not None \
            and p.parent.type in BINDERS:
        n, p = p, p.parent
    if p.type in BINDERS and (BINDERS[p.type] is None or p.child_by_field_name(BINDERS[p.type]) == n):
        return True
    if p.type in ("function_definition", "class_definition") and p.child_by_field_name("name") == n:
        up = p.parent.parent if p.parent is not None and p.parent.type == "decorated_definition" else p.parent
        return not (up is not None and up.type == "block" and up.parent is not None
                    and up.parent.type == "class_definition")  # a method binds an attribute, not the name
    if p.type == "named_expression" and p.child_by_field_name("name") == n:
        return True
    if p.type in ("default_parameter", "typed_default_parameter"):
        return p.child_by_field_name("name") == n  # not its default value
    return p.type in PARAMS or p.type in ("global_statement", "nonlocal_statement") or \
        _enclosing(n, ("import_statement", "import_from_statement", "future_import_statement")) is not None


def _bound(snap: Snapshot, name: str) -> bool:
    """Whether anything in the file binds `name`."""
    return any(_text(snap, n) == name and _binding(n)
               for n in captures(snap, "names", 0, len(snap.source)).get("name", ()))


def _import_source(snap: Snapshot, path: str, target: str, module: str) -> str:
    """The module as this file's imports would write it: relative (`.m`, `..pkg.m`) where the
    target is in the file's own top package and the file imports relatively — or imports
    nothing of that package by its absolute name — else `module`."""
    sources = [_text(snap, s) for s in captures(snap, "bindings", 0, len(snap.source)).get("source", ())]
    top = module.split(".")[0]
    mine, theirs = path.split("/")[:-1], target.rsplit(".", 1)[0].split("/")
    if not mine or not theirs or mine[0] != theirs[0] or top not in mine:
        return module
    relative = any(x.startswith(".") for x in sources) or not any(x == top or x.startswith(top + ".") for x in sources)
    if not relative:
        return module
    k = 0
    while k < len(mine) and k < len(theirs) - 1 and mine[k] == theirs[k]:
        k += 1
    rest = [t for t in theirs[k:] if t != "__init__"]
    return "." * (len(mine) - k + 1) + ".".join(rest)


def _section(module: str) -> str:
    """The block of imports a module goes in: the package's own relative ones, else by top package
    (a workspace module's import is not sorted in among the standard library's)."""
    return "." if module.startswith(".") else module.split(".")[0]


def _sort_key(module: str, name: str = "") -> tuple:
    """isort's order of `from` imports: `from . import` first, then by module, then by name."""
    return module.lstrip(".") != "", module.lower(), name.lower()


def _import_places(ch: Change, snap: Snapshot, text: str) -> list[Place]:
    """The import the name needs, as the file writes its imports: added to the `from <source>
    import a, b` statement when the file groups names (it has a statement with several), else a
    line of its own — after the last line importing from the same module, else after the last
    `from` import whose module sorts before it (isort's order), else after the imports (after
    the docstring, at the top)."""
    if _bound(snap, ch.old):
        return []
    root, starts = snap.tree.root_node, line_starts(text)
    imports = [c for c in root.named_children if c.type in ("import_statement", "import_from_statement",
                                                            "future_import_statement")]
    froms = [(c, _text(snap, c.child_by_field_name("module_name")), c.children_by_field_name("name"))
             for c in imports if c.type == "import_from_statement" and c.child_by_field_name("module_name") is not None]
    grouped = any(len(names) > 1 for _, _, names in froms)
    same = [(c, names) for c, mod, names in froms if mod == ch.new and names]
    if same and (grouped or len(same) == 1 and len(froms) == 1):
        end = snap.char_at(same[-1][1][-1].end_byte)
        line = _line(starts, end)
        e = TextEdit(line, end - starts[line], line, end - starts[line], f", {ch.old}")
        return [Place(ch.origin, line, e.start_col, line, e.start_col, (e,), digest(text))]
    mine = _sort_key(ch.new, ch.old)
    peers = [(c, _sort_key(mod, _text(snap, names[0]) if names else "")) for c, mod, names in froms
             if (mod == ch.new if same else _section(mod) == _section(ch.new))]
    later = [c for c, k in peers if k > mine]
    section = ""  # a block of imports of its own: a blank line above it
    if later:  # before the first that sorts after it
        line = _line(starts, snap.char_at(later[0].start_byte))
    elif peers or imports:
        line = _line(starts, snap.char_at((peers[-1][0] if peers else imports[-1]).end_byte)) + 1
        section = "" if peers else "\n"
    else:
        first = root.named_children[0] if root.named_children else None
        doc = first is not None and first.type == "expression_statement" and first.named_children \
            and first.named_children[0].type == "string"
        line = _line(starts, snap.char_at(first.end_byte)) + 1 if doc else 0
    new = f"{section}from {ch.new} import {ch.old}\n"
    if not imports and line < len(starts):  # the first import: the blank lines PEP 8 wants below it
        below = text[starts[line]:starts[line + 1] if line + 1 < len(starts) else len(text)]
        new += "\n\n" if below.startswith(("def ", "class ", "async def ", "@")) else "\n" if below.strip() else ""
    if line < len(starts):
        e = TextEdit(line, 0, line, 0, new)
    else:  # after the last line, which has no line end
        line = len(starts) - 1
        end = len(text) - starts[line]
        e = TextEdit(line, end, line, end, "\n" + new.rstrip("\n"))
    return [Place(ch.origin, e.start_line, e.start_col, e.start_line, e.start_col, (e,), digest(text))]


def _renamed_definition(text: str, path: str, span: tuple[int, int], lang: str, x: str, y: str,
                        importers: Importers | None, tree=None) -> Change | None:
    """The definition named Y inside `span` (chars: the last edit's lines), as a Change."""
    snap = _parsed(text, lang, tree)
    if snap.tree is None:
        return None
    lo, hi = snap.byte_at(max(span[0], 0)), snap.byte_at(min(span[1], len(text)))
    defs = captures(snap, "defines", lo, hi)
    yb = y.encode()
    inside = [(n.start_byte, cap.removeprefix("def."), n) for cap, nodes in defs.items() for n in nodes
              if snap.source[n.start_byte:n.end_byte] == yb and lo <= n.start_byte and n.end_byte <= hi]
    if not inside:
        return None
    _, role, node = min(inside, key=lambda t: t[0])
    owner = ""
    if role in ("method", "parameter"):
        fn = _enclosing(node, ("class_definition", "class_declaration", "impl_item") if role == "method" else SCOPES)
        name = None if fn is None else (fn.child_by_field_name("name") or fn.child_by_field_name("type"))
        if name is None:
            return None
        owner = _text(snap, name)
    a, b = snap.char_at(node.start_byte), snap.char_at(node.end_byte)
    before = text[:a] + x + text[b:]
    uses: tuple = ()
    if importers is not None and role in ("function", "class", "variable"):
        uses = tuple(importers(path, x, before))[:MAX_FILES]
    elif importers is not None and role in ("parameter", "method") and owner:  # the function's, the class's
        uses = tuple(importers(path, owner, text))[:MAX_FILES]
    return Change("rename", lang, path, role, x, y, owner, uses=uses)


def _signature(text: str, path: str, cursor: int, last: HistoryItem, importers: Importers | None,
               tree=None) -> Change | None:
    """A Python function's parameter list changed by the last edit (its lines undone give the text before)."""
    at = _undo_at(text, last, cursor)
    if at is None:
        return None
    head = text.rfind("def ", 0, at + len(last.new))
    seg = text[head:at] if head >= 0 else ""
    if head < 0 or ("\n" in seg and seg.count("(") <= seg.count(")")):
        return None  # not inside a function's header: no parse (this runs at every request)
    before_text = text[:at] + last.old + text[at + len(last.new):]
    now, was = _parsed(text, "python", tree), parse_snapshot(before_text, "python")
    if now.tree is None or was.tree is None:
        return None
    fn = _enclosing(now.tree.root_node.descendant_for_byte_range(now.byte_at(cursor), now.byte_at(cursor)),
                    ("function_definition",))
    if fn is None or fn.child_by_field_name("body") is None:
        return None
    body = fn.child_by_field_name("body")
    if now.char_at(body.start_byte) <= cursor:  # an edit inside the body, not the header
        return None
    name = _text(now, fn.child_by_field_name("name"))
    old_fn = _enclosing(was.tree.root_node.descendant_for_byte_range(was.byte_at(min(cursor, len(was.text))),
                                                                     was.byte_at(min(cursor, len(was.text)))),
                        ("function_definition",))
    if old_fn is None or _text(was, old_fn.child_by_field_name("name")) != name:
        return None
    after, before = _params(now, fn), _params(was, old_fn)
    if after == before or None in (after, before):
        return None
    method = fn.parent is not None and fn.parent.type == "block" and _enclosing(fn, ("class_definition",)) is not None \
        and _enclosing(fn, ("class_definition",)) == _enclosing(fn.parent, ("class_definition", "function_definition"))
    role = "method" if method else "function"
    if method and not _static(fn):
        after, before = after[1:], before[1:]
    owner = ""
    if method:
        cls = _enclosing(fn, ("class_definition",))
        owner = _text(now, cls.child_by_field_name("name"))
    top = fn.parent is not None and (fn.parent.type == "module" or fn.parent.type == "decorated_definition"
                                     and fn.parent.parent is not None and fn.parent.parent.type == "module")
    uses = tuple(importers(path, name, text))[:MAX_FILES] if importers is not None and top else ()
    return Change("signature", "python", path, role, name, name, owner, before, after, uses)


def _undo_at(text: str, last: HistoryItem, cursor: int) -> int | None:
    """Where the last edit's new text stands in `text` (the occurrence nearest the cursor)."""
    if not last.new:
        return None
    best, i = None, text.find(last.new)
    while i >= 0:
        if best is None or abs(i - cursor) < abs(best - cursor):
            best = i
        i = text.find(last.new, i + 1)
    return best


def _static(fn: Node) -> bool:
    p = fn.parent
    return p is not None and p.type == "decorated_definition" and any(
        c.type == "decorator" and c.text.decode("utf-8", "replace").strip() in ("@staticmethod",) for c in p.children)


def _params(snap: Snapshot, fn: Node) -> tuple[Param, ...] | None:
    ps = fn.child_by_field_name("parameters")
    if ps is None:
        return None
    out, kind = [], "positional"
    for c in ps.named_children:
        t = c.type
        if t == "typed_parameter":
            c, t = c.named_children[0], c.named_children[0].type
        if t == "identifier":
            out.append(Param(_text(snap, c), False, kind))
        elif t in ("default_parameter", "typed_default_parameter"):
            out.append(Param(_text(snap, c.child_by_field_name("name")), True, kind))
        elif t == "list_splat_pattern":
            out.append(Param(_text(snap, c).lstrip("*"), False, "args"))
            kind = "keyword"
        elif t == "dictionary_splat_pattern":
            out.append(Param(_text(snap, c).lstrip("*"), False, "kwargs"))
        elif t == "keyword_separator":
            kind = "keyword"
        elif t == "comment":
            continue
    return tuple(out)


# -- the plan -------------------------------------------------------------------------------------
class Follower:
    """The change being followed (one per workspace) and the places it still needs. Used from
    one thread at a time (the language server's next-edit thread); `drop` from any."""

    def __init__(self) -> None:
        self.change: Change | None = None
        self.done: dict[str, set[str]] = {}  # a signature plan: calls rewritten, per file (their new text)
        self.dismissed: Change | None = None
        self._memo: dict[tuple, list[Place]] = {}  # (change, path, text digest, done) → its places
        self._lock = threading.Lock()

    def drop(self) -> None:
        """The user dismissed a jump: the change is not followed, nor detected again from the same edit."""
        with self._lock:
            self.dismissed, self.change, self.done = self.change, None, {}

    def answer(self, text: str, path: str, line: int, col: int, history: Sequence[HistoryItem], *,
               language: str | None, read: Read, importers: Importers | None = None,
               providers: Providers | None = None, statements: Statements | None = None, above: int = 3,
               below: int = 20, max_lines: int = 40, tree=None) -> Answer | None:
        """The edits inside the editable region around (line, col) of `text`, the file at `path`
        (region.py, with `above`, `below`, `max_lines`) and the jump to the next place outside
        it, for the change the last edit made at a definition or the one being followed; None
        when there is none (the caller predicts as before). `read(path)` gives another file's
        text now; `importers(path, name, text)` the files that import a definition (the index's);
        `statements(path, text)` where the statements of another file's text start (the index's,
        when it indexed that text: only those holding the name are parsed)."""
        t0 = time.perf_counter()
        try:
            region = editable_region(text, line, above=above, below=below, max_lines=max_lines,
                                     language=language_for(language, path), tree=tree)
        except RegionError:
            region = (line, line + 1)
        cursor = _offset(text, line, col)
        got = detect(text, path, cursor, history, language, importers, providers, tree)
        with self._lock:
            if got is not None and got == self.dismissed:
                got = None
            if got is not None and got != self.change:
                self.change, self.done = got, {}
            ch = self.change
        if ch is None:
            return None
        last = last_rename(history, path) if history else None
        if got is None and last is not None and (ch.kind != "rename" or last != (ch.old, ch.new)):
            return None  # a rename of something else: the region's own rename (rename.py) answers it
        here = self._places(ch, path, text, tree)
        lo, hi = region
        inside = [p for p in here if lo <= p.line < hi and p.edits]
        order = [p for p in here if p.line >= hi or (p.line >= lo and not p.edits)] + [p for p in here if p.line < lo]
        rest: list[Place] = []
        for other in _files(ch, path):
            t = read(other)
            if t is not None:
                rest += self._places(ch, other, t, units=statements(other, t) if statements else None)
        todo = order + rest
        if not inside and not todo:
            with self._lock:
                self.change, self.done = None, {}
            return None
        if ch.kind == "signature":
            for p in inside + todo[:1]:
                self._remember(p, text if p.path == path else read(p.path))
        return Answer([e for p in inside for e in p.edits], todo[0] if todo else None, ch.kind,
                      len(inside) + len(todo), (time.perf_counter() - t0) * 1e3, inside + todo, todo)

    def _places(self, ch: Change, path: str, text: str, tree=None, units: tuple | None = None) -> list[Place]:
        """places(), remembered per file text while the change is followed: each request reads
        every file the change reaches, and most have not changed since the last one (a parse
        each: ~5 ms for 30 KB). `tree`: the caller's parse of `text`, if it has one."""
        done = frozenset(self.done.get(path, ()))
        key = (ch, path, digest(text), done)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = places(ch, path, text, done, tree, units)
            while len(self._memo) > MEMO:
                self._memo.pop(next(iter(self._memo)))
        return got

    def _remember(self, p: Place, text: str | None) -> None:
        """A call this plan rewrites: its lines as they will read (one line: the rewrite joins none)."""
        if text is None or not p.edits:
            return
        after = apply_edits(text, p.edits)
        starts = line_starts(after)
        grown = sum(e.text.count("\n") - (e.end_line - e.start_line) for e in p.edits)
        self.done.setdefault(p.path, set()).add(_lines(after, starts, p.line, p.end_line + grown))


def _files(ch: Change, path: str) -> list[str]:
    """The other files of the plan: the definition's own first when the user is elsewhere."""
    out = [] if ch.origin == path else [ch.origin]
    return out + sorted({u.path for u in ch.uses} - {path, ch.origin})


def places(ch: Change, path: str, text: str, done: set[str] = frozenset(), tree=None,
           units: tuple | None = None) -> list[Place]:
    """The places of `path` (its `text`, parsed as `tree` when the caller has it) the change
    still needs, in file order. `units`: (starts, bodies) of `text`'s statements, as
    documents.parse_ranges takes them (an importer indexed as it is: only the statements
    holding its names are parsed)."""
    uses = [u for u in ch.uses if u.path == path]
    if path != ch.origin and not uses:
        return []
    lang = language_for(None, path) or ch.language
    if tree is None and units and path != ch.origin and ch.kind in ("rename", "signature"):
        src = encode(text)
        # every name a place holds: the definition's, and each local name it is imported as
        spans = _lines_holding(src, {ch.old.encode()} | {u.alias.encode() for u in uses if u.alias})
        if not spans:
            return []
        starts, bodies = units
        snap = Snapshot(text, lang, parse_ranges(src, lang, starts, spans, bodies))
    else:
        snap = _parsed(text, lang, tree)
    if snap.tree is None:
        return []
    if ch.kind == "import":
        return _import_places(ch, snap, text) if path == ch.origin else []
    if ch.kind == "repeat":
        return _group(path, snap, text, repeat_sites(ch.rule, snap)) if path == ch.origin else []
    if ch.kind == "rename":
        sites = _rename_sites(ch, snap, path, uses)
        return _group(path, snap, text, [(s, e, ch.new if not short else f"{ch.old}: {ch.new}") for s, e, short in sites])
    return _call_places(ch, snap, text, path, uses, done)


def _rename_sites(ch: Change, snap: Snapshot, path: str, uses: list) -> list[tuple[int, int, bool]]:
    src, x = snap.source, ch.old.encode()
    spans = _lines_holding(src, {x})
    role_of = roles(_captures_in(snap, "names", spans))
    mine = [(k, r, n) for k, (r, n) in role_of.items() if src[k[0]:k[1]] == x]
    out: list[tuple[int, int, bool]] = []
    origin = path == ch.origin

    sources = {u.source for u in uses}

    def bare(import_only: bool) -> None:
        shadow = _shadowing(snap, mine, sources, spans)
        for k, r, n in mine:
            if r != "name" or _in(k, shadow) or _namesake(n) or _module_part(n):
                continue
            if _in_import(n) and not _imports_from(n, sources, snap):
                continue  # a namesake another module gives (`from ._impl import getchar as f`)
            if import_only and not _in_import(n):
                continue
            out.append((k[0], k[1], n.type.startswith("shorthand_property_identifier")))

    def members(receivers: set[bytes]) -> None:
        out.extend((k[0], k[1], False) for k, r, n in mine if r == "member" and receiver(n, src) in receivers)

    def labels(fn: set[bytes]) -> None:
        out.extend((k[0], k[1], False) for k, r, n in mine if r == "label" and callee(n, src) in fn)

    if ch.role in ("function", "class", "variable"):
        if origin:
            bare(False)
        for u in uses:
            if u.how == "module":
                members({u.alias.encode()})
            else:
                bare(u.how == "name" and u.alias != ch.old)
    elif ch.role == "method":
        # through its class (`Box.m`, `mod.Box.m`) and, in the class and the classes that
        # derive from it here, through `self` and `cls`; another object's `.m` is not known to be it
        classes = {ch.owner} if origin else {u.alias for u in uses if u.how != "module"}
        receivers = {f"{u.alias}.{ch.owner}" for u in uses if u.how == "module"} | classes
        members({r.encode() for r in receivers})
        for k, r, n in mine:
            if r == "member" and receiver(n, src) in (b"self", b"cls") and _in_class_of(n, receivers, snap):
                out.append((k[0], k[1], False))
    elif ch.role == "parameter":
        if origin:
            fn = _function_named(snap, ch.owner, ch.new)
            if fn is not None:
                out.extend((k[0], k[1], False) for k, r, n in mine if r == "name"
                           and fn.start_byte <= k[0] and k[1] <= fn.end_byte and not _namesake(n))
            labels({ch.owner.encode()})
        for u in uses:
            labels({(u.alias if u.how == "name" else ch.owner).encode()})
    return sorted(set(out))


def _lines_holding(src: bytes, words: set[bytes], gap: int = 2048) -> list[tuple[int, int]]:
    """The byte ranges of the lines where any of `words` occurs, merged where less than `gap`
    bytes apart: what a rename or a call rewrite has to query. Querying those instead of the
    whole file made the first answer of a rename in a 1 000-file workspace ~2x faster (each
    importer is parsed and queried once; most hold the name on a few lines)."""
    hits = sorted(i for w in words if w for i in _finds(src, w))
    out: list[tuple[int, int]] = []
    for i in hits:
        lo = src.rfind(b"\n", 0, i) + 1
        hi = src.find(b"\n", i)
        hi = len(src) if hi < 0 else hi + 1
        if out and lo - out[-1][1] < gap:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _finds(src: bytes, w: bytes):
    i = src.find(w)
    while i >= 0:
        yield i
        i = src.find(w, i + 1)


def _captures_in(snap: Snapshot, name: str, spans: list[tuple[int, int]]) -> dict[str, list[Node]]:
    """captures() of query `name` over each of `spans`, merged (each node once, in document order)."""
    if len(spans) == 1:
        return captures(snap, name, *spans[0])
    out: dict[str, dict[tuple[int, int], Node]] = {}
    for lo, hi in spans:
        for k, nodes in captures(snap, name, lo, hi).items():
            got = out.setdefault(k, {})
            for n in nodes:
                got.setdefault((n.start_byte, n.end_byte), n)
    return {k: [v[r] for r in sorted(v)] for k, v in out.items()}


def _in_class_of(n: Node, names: set[str], snap: Snapshot) -> bool:
    """Whether `n` is inside a class named one of `names` or deriving from one (its bases as written)."""
    c = _enclosing(n, ("class_definition", "class_declaration"))
    while c is not None:
        name = c.child_by_field_name("name")
        bases = c.child_by_field_name("superclasses")
        if (name is not None and _text(snap, name) in names) or (
                bases is not None and any(_text(snap, b) in names for b in bases.named_children)):
            return True
        c = _enclosing(c.parent, ("class_definition", "class_declaration"))
    return False


def _in(k: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(a <= k[0] and k[1] <= b for a, b in spans)


def _shadowing(snap: Snapshot, mine: list, sources: set[str] = frozenset(),
               spans: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """Functions that bind the name themselves (a parameter, an assignment, an import of it from
    a module other than `sources`): their uses are not it. `spans`: byte ranges holding every
    node of `mine` (where parameters are looked for; the whole file when None)."""
    where = [(0, len(snap.source))] if spans is None else spans  # [] (no occurrence): nothing to query
    params = {(n.start_byte, n.end_byte) for n in _captures_in(snap, "defines", where).get("def.parameter", ())}
    out = []
    for k, r, n in mine:
        if r != "name":
            continue
        if _in_import(n) and not _aliased(n) and not _imports_from(n, sources, snap):
            fn = _enclosing(n, SCOPES)  # `from other import X` inside a function
            if fn is not None:
                out.append((fn.start_byte, fn.end_byte))
            continue
        p = n.parent
        if p is not None and p.type in ("pattern_list", "expression_list", "tuple_pattern", "list_pattern") \
                and p.parent is not None and p.parent.type in BINDERS:
            n, p = p, p.parent  # `for name, X in ...`: the pattern is the binder's field
        binds = k in params or (p is not None and p.type in BINDERS
                                and (BINDERS[p.type] is None or p.child_by_field_name(BINDERS[p.type]) == n))
        fn = _enclosing(n, SCOPES + COMPREHENSIONS if p is not None and p.type == "for_in_clause" else SCOPES) \
            if binds else None
        if fn is not None:
            out.append((fn.start_byte, fn.end_byte))
    return out


def _namesake(n: Node) -> bool:
    """The name of a definition inside a function or class (a method or local function of that name)."""
    p = n.parent
    if p is None or p.child_by_field_name("name") != n or p.type not in (
            "function_definition", "class_definition", "function_declaration", "class_declaration", "method_definition"):
        return False
    up = p.parent.parent if p.parent is not None and p.parent.type == "decorated_definition" else p.parent
    return up is not None and up.type not in ("module", "program", "export_statement")


def _module_part(n: Node) -> bool:
    """A part of a module's name in an import (`import x`, `from x.y import z`): not a binding of X."""
    p = n.parent
    while p is not None and p.type in ("dotted_name", "aliased_import"):
        if p.parent is not None and p.parent.type == "import_from_statement":
            return p.parent.child_by_field_name("module_name") == p
        if p.parent is not None and p.parent.type == "import_statement":
            return True
        p = p.parent
    return False


def _aliased(n: Node) -> bool:
    """An imported name bound under another name (`import X as y`, `{ X as y }`)."""
    p = n.parent
    while p is not None and p.type == "dotted_name":
        p = p.parent
    return p is not None and p.type in ("aliased_import", "import_specifier", "export_specifier") \
        and p.child_by_field_name("alias") is not None


def _in_import(n: Node) -> bool:
    """The imported name of an import statement (not its alias)."""
    p = n.parent
    if p is not None and p.type in ("aliased_import", "import_specifier", "export_specifier") \
            and p.child_by_field_name("alias") == n:
        return False
    stmt = _enclosing(n, IMPORTS)
    return stmt is not None and (stmt.type != "export_statement" or stmt.child_by_field_name("source") is not None)


def _imports_from(n: Node, sources: set[str], snap: Snapshot) -> bool:
    """Whether the import statement holding `n` imports from one of `sources` (the modules the
    index resolved to the definition; a statement whose module is not read here counts)."""
    stmt = _enclosing(n, IMPORTS)
    mod = stmt.child_by_field_name("module_name") or stmt.child_by_field_name("source") if stmt is not None else None
    if mod is None:
        return bool(sources)
    return _text(snap, mod).strip("'\"`") in sources


def _function_named(snap: Snapshot, name: str, param: str) -> Node | None:
    """The function `name` that has a parameter `param`."""
    for n in captures(snap, "defines", 0, len(snap.source)).get("def.parameter", ()):
        if _text(snap, n) != param:
            continue
        fn = _enclosing(n, SCOPES)
        nm = fn.child_by_field_name("name") if fn is not None else None
        if nm is not None and _text(snap, nm) == name:
            return fn
    return None


# -- calls -----------------------------------------------------------------------------------------
def _call_places(ch: Change, snap: Snapshot, text: str, path: str, uses: list, done: set[str]) -> list[Place]:
    src = snap.source
    name = ch.old.encode()
    bare = {name} if path == ch.origin else {u.alias.encode() if u.how == "name" else name
                                             for u in uses if u.how in ("name", "star")}
    mods = {u.alias.encode() for u in uses if u.how == "module"}
    if path == ch.origin and ch.role == "method":
        bare, mods = set(), {b"self", b"cls", ch.owner.encode()}
    out: list[tuple[int, int, str, Node]] = []
    words = bare | {name}
    spans = _lines_holding(src, words)
    role_of = roles(_captures_in(snap, "names", spans))
    shadow = _shadowing(snap, [(k, r, n) for k, (r, n) in role_of.items() if src[k[0]:k[1]] in bare],
                        {u.source for u in uses}, spans)
    for k, (r, n) in role_of.items():
        if src[k[0]:k[1]] not in words or (r == "name" and _in(k, shadow)):
            continue
        fn = n if r == "name" else n.parent
        call = fn.parent if fn is not None else None
        if call is None or call.type != "call" or call.child_by_field_name("function") != fn:
            continue
        if r == "name" and src[k[0]:k[1]] not in bare:
            continue
        if r == "member" and (src[k[0]:k[1]] != name or receiver(n, src) not in mods):
            continue
        args = call.child_by_field_name("arguments")
        if args is None or args.type not in ("argument_list", "generator_expression"):
            continue
        got = _rewrite(ch, snap, args)
        if got is None:
            continue
        out.append((*got, args))
    places = []
    starts = line_starts(text)
    d = digest(text)
    for spans, needs, args in out:
        a, b = snap.char_at(args.start_byte), snap.char_at(args.end_byte)
        la, lb = _line(starts, a), _line(starts, b)
        if (not spans and not needs) or _lines(text, starts, la, lb) in done:
            continue  # nothing to do, or a call this plan rewrote (a reordered one reads like one to reorder)
        edits = tuple(_edit(starts, snap, s, e, t) for s, e, t in spans)
        places.append(Place(path, la, a - starts[la], lb, b - starts[lb], edits, d))
    return places


def _rewrite(ch: Change, snap: Snapshot, args: Node) -> tuple[list[tuple[int, int, str]], bool] | None:
    """The argument list's edits (byte spans → text) for the new signature, and whether the call
    still needs an argument the user must write; None: a call left alone (splats, or it already
    fits the new signature)."""
    # `f(x for x in y)`: the generator is the one argument, its parentheses the call's
    items = [args] if args.type == "generator_expression" else [c for c in args.named_children if c.type != "comment"]
    if any(c.type in ("list_splat", "dictionary_splat", "parenthesized_list_splat") for c in items):
        return None
    pos = [c for c in items if c.type != "keyword_argument"]
    kws = {_text(snap, c.child_by_field_name("name")): c for c in items if c.type == "keyword_argument"}
    before, after = ch.before, ch.after
    renames = _renamed_params(before, after)
    if not _fits(before, len(pos), set(kws)):
        return None  # rewritten already (or never a call of the old signature)
    b_pos = [p for p in before if p.kind == "positional"]
    if len(pos) > len(b_pos) and not any(p.kind == "args" for p in before):
        return None
    bound = {b_pos[i].name: (c, False) for i, c in enumerate(pos) if i < len(b_pos)}
    bound.update({k: (c, True) for k, c in kws.items()})
    new_of = {p.name: renames.get(p.name, p.name) for p in before}
    after_names = {p.name for p in after}
    needs = any(not p.default and p.kind in ("positional", "keyword") and p.name not in new_of.values()
                and p.name not in kws for p in after)
    removed = {o for o, n in new_of.items() if n not in after_names}
    spans: list[tuple[int, int, str]] = []
    if not _reordered(before, after, renames):
        gone = [i for i, c in enumerate(items) if any(c is v[0] for o, v in bound.items() if o in removed)]
        spans += _deletions(snap, args, items, gone)
        for o, (c, kw) in bound.items():
            if kw and o in renames and o not in removed:
                nm = c.child_by_field_name("name")
                spans.append((nm.start_byte, nm.end_byte, renames[o]))
    else:
        parts, positional = [], True
        for p in after:
            old = next((o for o, n in new_of.items() if n == p.name), p.name)
            if old not in bound:
                positional = False
                continue
            c, kw = bound[old]
            value = c.child_by_field_name("value") if kw else c
            if positional and not kw and p.kind == "positional":
                parts.append(_text(snap, value))
            else:
                positional = False
                parts.append(f"{p.name}={_text(snap, value)}")
        parts += [_text(snap, c) for k, c in kws.items() if k not in new_of]
        spans.append((args.start_byte + 1, args.end_byte - 1, ", ".join(parts)))
    return sorted(spans), needs


def _fits(after: tuple[Param, ...], n_pos: int, kws: set[str]) -> bool:
    """Whether a call with n_pos positional arguments and keywords `kws` binds to `after`."""
    a_pos = [p for p in after if p.kind == "positional"]
    if n_pos > len(a_pos) and not any(p.kind == "args" for p in after):
        return False
    names = {p.name for p in after if p.kind in ("positional", "keyword")}
    if kws - names and not any(p.kind == "kwargs" for p in after):
        return False
    given = {p.name for p in a_pos[:n_pos]} | kws
    return all(p.default or p.name in given for p in after if p.kind in ("positional", "keyword"))


def _renamed_params(before: tuple[Param, ...], after: tuple[Param, ...]) -> dict[str, str]:
    """Parameters renamed in place: same count, same kinds, one name each changed where both
    names are new to the other side."""
    if len(before) != len(after):
        return {}
    bn, an = {p.name for p in before}, {p.name for p in after}
    return {b.name: a.name for b, a in zip(before, after)
            if b.name != a.name and b.kind == a.kind and b.name not in an and a.name not in bn}


def _reordered(before: tuple[Param, ...], after: tuple[Param, ...], renames: dict[str, str]) -> bool:
    a_order = [p.name for p in after if p.kind == "positional"]
    kept = [renames.get(p.name, p.name) for p in before if p.kind == "positional" and renames.get(p.name, p.name) in a_order]
    return kept != [n for n in a_order if n in kept]


def _deletions(snap: Snapshot, args: Node, items: list[Node], gone: list[int]) -> list[tuple[int, int, str]]:
    """Byte spans that remove the arguments `gone` (indices into items) with their commas."""
    if not gone:
        return []
    if len(gone) == len(items):
        return [(args.start_byte + 1, args.end_byte - 1, "")]
    out = []
    runs: list[tuple[int, int]] = []
    for g in gone:
        if runs and runs[-1][1] == g - 1:
            runs[-1] = (runs[-1][0], g)
        else:
            runs.append((g, g))
    for a, b in runs:
        if b + 1 < len(items):
            out.append((items[a].start_byte, items[b + 1].start_byte, ""))
        else:
            out.append((items[a - 1].end_byte, items[b].end_byte, ""))
    return out


# -- helpers ---------------------------------------------------------------------------------------
def _group(path: str, snap: Snapshot, text: str, sites: list[tuple[int, int, str]]) -> list[Place]:
    """Sites (byte spans → text) as places, one per line."""
    starts, d = line_starts(text), digest(text)
    by_line: dict[int, list[TextEdit]] = {}
    for s, e, t in sites:
        edit = _edit(starts, snap, s, e, t)
        by_line.setdefault(edit.start_line, []).append(edit)
    return [Place(path, es[0].start_line, es[0].start_col, es[-1].end_line, es[-1].end_col, tuple(es), d)
            for _, es in sorted(by_line.items())]


def _lines(text: str, starts: list[int], a: int, b: int) -> str:
    """Lines a..b (inclusive) of text, stripped."""
    end = starts[b + 1] if b + 1 < len(starts) else len(text)
    return text[starts[a]:end].strip()


def _edit(starts: list[int], snap: Snapshot, s: int, e: int, t: str) -> TextEdit:
    a, b = snap.char_at(s), snap.char_at(e)
    la, lb = _line(starts, a), _line(starts, b)
    return TextEdit(la, a - starts[la], lb, b - starts[lb], t)


def _line(starts: list[int], offset: int) -> int:
    return max(bisect.bisect_right(starts, offset) - 1, 0)


def _offset(text: str, line: int, col: int) -> int:
    starts = line_starts(text)
    return starts[min(line, len(starts) - 1)] + col


def _parsed(text: str, language: str, tree) -> Snapshot:
    """The caller's parse of `text` when it has one, else a parse."""
    return Snapshot(text, language, tree) if tree is not None else parse_snapshot(text, language)


def _enclosing(n: Node | None, types: Sequence[str]) -> Node | None:
    while n is not None and n.type not in types:
        n = n.parent
    return n


def _text(snap: Snapshot, n: Node) -> str:
    return snap.source[n.start_byte:n.end_byte].decode("utf-8", "replace")


