"""Rename propagation from the syntax tree: when the user's last edit renamed one name (X → Y
in one place), the other places that name X in the same scope are renamed too. What an editor's
"rename usages" offers after an in-place rename, as a next edit: it needs no model, takes
milliseconds, and fills in where the model gives nothing (the shipped pair was not taught next
edits; a model that answers "no change" or something that does not parse). predict() calls it.

Which places: the names the language's `names.scm` query captures with the role of the renamed
one (`@name` a variable, parameter, function or type; `@member` a name after a dot; `@label`, a
keyword argument's name, binds nothing and is not renamed itself), inside the innermost
`@scope.function` (for a name) or `@scope.class` (for a member) around the renamed place, and
inside the editable region (a JavaScript object's shorthand `{ x }` becomes `{ x: y }`, its
key kept); a parameter renamed also renames the keyword arguments that name it at its
function's calls in the region (`def f(n)` → `def f(count)`: `f(n=1)` → `f(count=1)`). Strings
and comments are not names, so they stay.

Not a rename (nothing proposed): an edit that replaced two different names, or changed more
than names, or text that is not a whole name on either side; a Y that the file already used before the edit (the user pointed
this place at another existing name, e.g. `f(a)` → `f(b)`, rather than renamed X). Torch-free."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from tree_sitter import Node

from ..documents import Snapshot, snapshot_around
from ..syntax.lang import captures
from .formats import HistoryItem

REACH = 64 * 1024  # the text parsed around the cursor (chars each side), as the syntax check's
_TOKEN = re.compile(r"\w+|\W")  # a word, or one other character
_NAME = re.compile(r"[^\W\d]\w*")
MAX_TOKENS = 4000  # an edit event larger than this (a paste) is not read as a rename
ROLES = ("label", "member", "name")  # a node captured twice takes the first of these


@dataclass(frozen=True)
class Rename:
    old: str
    new: str
    role: str    # "name" or "member"
    sites: int   # places renamed in the region


def renamed(old: str, new: str) -> tuple[str, str] | None:
    """(X, Y) when `new` is `old` with whole names X replaced by the name Y, in one place or more
    (an accepted rename suggestion is one edit of several places: the next one carries it on),
    and nothing else changed; else None."""
    if old == new:
        return None
    a, b = _TOKEN.findall(old), _TOKEN.findall(new)
    if len(a) + len(b) > MAX_TOKENS:
        return None
    pairs = set()
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if tag != "replace" or i2 - i1 != 1 or j2 - j1 != 1:
            return None
        pairs.add((a[i1], b[j1]))
    if len(pairs) != 1:
        return None
    x, y = pairs.pop()
    if not (_NAME.fullmatch(x) and _NAME.fullmatch(y)):
        return None
    return x, y


def last_rename(history: Sequence[HistoryItem], path: str) -> tuple[str, str] | None:
    """(X, Y) when the last history item, an edit of `path`, renamed X to Y (typed in one burst
    or two: X -> "co", then "co" -> "count"), else None."""
    if not history or history[-1].path != path:
        return None
    old, new = history[-1].old, history[-1].new
    for h in reversed(history[:-1]):
        if h.path != path or h.new != old:
            break
        old = h.old
    return renamed(old, new)


def propagate(text: str, a: int, b: int, cursor: int, history: Sequence[HistoryItem], path: str,
              language: str | None, tree=None) -> tuple[str, Rename] | None:
    """text[a:b] (the editable region) with the last history item's rename carried to its other
    places, and what was done; None when the last edit is not a rename of a name, the language
    has no `names.scm`, or the region holds no other place. `tree`: the text's parse, when the
    caller has one (else the text around the cursor is parsed: ~40 ms for 100 KB)."""
    if language is None:
        return None
    got = last_rename(history, path)
    if got is None:
        return None
    x, y = got
    snap, start = (Snapshot(text, language, tree), 0) if tree is not None else \
        snapshot_around(text, language, cursor, REACH)
    lo, hi = snap.byte_at(max(a - start, 0)), snap.byte_at(max(min(b - start, len(snap.text)), 0))
    byte_cursor = snap.byte_at(max(0, min(cursor - start, len(snap.text))))
    # from the renamed place (a Y just before the cursor) on; scopes: those that overlap
    caps = captures(snap, "names", min(lo, max(0, byte_cursor - len(y.encode()))), max(hi, byte_cursor + 1))
    if not caps:
        return None
    role_of = roles(caps)
    src = snap.source
    named = [(k, r) for k, (r, _) in role_of.items() if src[k[0]:k[1]].decode("utf-8", "replace") in (x, y)]
    ys = [k for k, r in named if src[k[0]:k[1]] == y.encode() and r != "label"]
    if not ys:
        return None
    site = min(ys, key=lambda k: (abs(k[1] - byte_cursor), k[0]))  # the renamed place: the Y nearest the cursor
    role, node = role_of[site]
    recv, called = receiver(node, src), _called(node)
    scope = _scope(caps.get("scope.function" if role == "name" else "scope.class", ()), site)
    inside = (lambda k: scope[0] <= k[0] and k[1] <= scope[1]) if scope else (lambda k: True)
    word = re.compile(rf"(?<!\w){re.escape(y)}(?!\w)")
    introduced = sum(len(word.findall(h.new)) - len(word.findall(h.old)) for h in history if h.path == path)
    # Y in the scope with the renamed place's role (a class named Lines does not stop a member
    # renamed to `Lines`)
    where = scope or (0, len(src))
    in_scope = roles(captures(snap, "names", *where)) if (lo, hi) != where else role_of
    seen = sum(1 for k, (r, _) in in_scope.items() if r == role and where[0] <= k[0] and k[1] <= where[1]
               and src[k[0]:k[1]] == y.encode())
    if seen > max(introduced, 1):
        return None  # Y was there before: not a new name
    sites = sorted(k for k, r in named if r == role and inside(k) and src[k[0]:k[1]] == x.encode()
                   and lo <= k[0] and k[1] <= hi and (role != "member" or receiver(role_of[k][1], src) == recv
                                                      or called and _called(role_of[k][1])))
    fn = _function_of_parameter(caps.get("scope.function", ()), site, src) if role == "name" else None
    if fn:  # a parameter renamed: the keyword arguments that name it at its function's calls
        sites = sorted(sites + [k for k, (r, n) in role_of.items() if r == "label" and src[k[0]:k[1]] == x.encode()
                                and lo <= k[0] and k[1] <= hi and callee(n, src) == fn])
    if not sites:
        return None
    out, last = [], lo
    for s, e in sites:  # an object's shorthand (`{ count }`) keeps its key: `{ count: n }`
        short = role_of[(s, e)][1].type.startswith("shorthand_property_identifier")
        out += [src[last:s], f"{x}: {y}".encode() if short else y.encode()]
        last = e
    out.append(src[last:hi])
    head = text[a:start] if a < start else ""  # a region starting before the parsed window (a huge file)
    return head + b"".join(out).decode("utf-8") + text[start + len(snap.text):b], Rename(x, y, role, len(sites))


def roles(caps: dict) -> dict[tuple[int, int], tuple[str, Node]]:
    """Each captured name's byte range: its role (a node captured twice: the first of ROLES) and node."""
    out: dict[tuple[int, int], tuple[str, Node]] = {}
    for role in reversed(ROLES):  # later writes win: label over member over name
        for n in caps.get(role, ()):
            out[(n.start_byte, n.end_byte)] = role, n
    return out


def receiver(node: Node, src: bytes) -> bytes | None:
    """The text before the dot of a member (`self` in `self.x`, `a.b` in `a.b.x`): a member is
    renamed only where its receiver is written the same (`self.name` renamed leaves
    `request.name`, another object's, alone) or, a method renamed at a call, at the other calls
    of a method of that name; None for a member with none (a declaration)."""
    parent = node.parent
    first = parent.named_children[0] if parent is not None and parent.named_children else None
    if first is None or first.start_byte >= node.start_byte:
        return None
    return src[first.start_byte:first.end_byte]


def _called(node: Node) -> bool:
    """Whether the member is called: `x.m(...)`, the member expression the call's function."""
    parent = node.parent
    call = parent.parent if parent is not None else None
    return call is not None and call.type in ("call", "call_expression") and call.named_children \
        and call.named_children[0] == parent


def _function_of_parameter(nodes, site: tuple[int, int], src: bytes) -> bytes | None:
    """The name of the function whose parameter list holds `site`, else None."""
    for n in nodes:
        params, name = n.child_by_field_name("parameters"), n.child_by_field_name("name")
        if params is not None and name is not None and params.start_byte <= site[0] and site[1] <= params.end_byte:
            return src[name.start_byte:name.end_byte]
    return None


def callee(label: Node, src: bytes) -> bytes | None:
    """The called name (`f` in `f(x=1)` and `a.f(x=1)`) of the call a keyword argument's name is in."""
    call = label
    for _ in range(3):  # name -> keyword argument -> argument list -> call
        call = call.parent
        if call is None:
            return None
    fn = call.child_by_field_name("function") if call.type in ("call", "call_expression") else None
    if fn is not None and fn.type == "attribute":
        fn = fn.child_by_field_name("attribute")
    return src[fn.start_byte:fn.end_byte] if fn is not None and fn.type == "identifier" else None


def _scope(nodes, site: tuple[int, int]) -> tuple[int, int] | None:
    """The byte range of the innermost of `nodes` around `site`, or of the one around that when
    `site` is the node's own name (a function renamed where it is defined: its callers are outside)."""
    around = sorted((n for n in nodes if n.start_byte <= site[0] and site[1] <= n.end_byte),
                    key=lambda n: (n.start_byte, -n.end_byte))
    while around:
        n = around.pop()
        name = n.child_by_field_name("name")
        if name is None or (name.start_byte, name.end_byte) != site:
            return n.start_byte, n.end_byte
    return None
