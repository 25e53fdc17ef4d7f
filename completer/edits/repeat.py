"""The same edit again (issue 39 §2): the user made the same token-level change at two places of
a file — `foo(a, b)` → `foo(a, b, timeout=t)`, then `foo(x, y)` → `foo(x, y, timeout=t)` — and
the other places where it applies get it, one jump at a time (follow.py offers them). From the
syntax tree, no model; any language with a grammar (the node types are read off the tree, not
named per language), measured on Python.

A Rule is read off the file's last two edits (two lines, or an edit typed in two bursts taken as
one): each as tokens, the text removed (D) and inserted (I) between the common token prefix and
suffix of its line before and after; the smallest syntax node around the change (in the text as
it is now: the change undone gives its text before); and what both edits agree on — the same D
and I, the same node type, for an argument list the same callee as written (`foo`, `self.log`),
and the tokens on each side of the change inside that node that both share (the context). The
change sits at the node's end where the text after it was the same in both (`)`: before the
closing parenthesis), at its start likewise, else at the one place in the node the context and D
occur. A place is another node of that type and callee holding the context and D there and not
the change yet (an insertion it already has); an inserted `, x` right after an opening bracket
loses its comma, and goes before a trailing comma.

Quiet: two edits that differ, a rule with no word to pin it (no callee, and no word in the
context or D: a `,` added before every `)`), a place whose edit adds parse errors, no other
place. A rename (rename.py and follow.py own those) is not a rule. Torch-free."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tree_sitter import Node

from ..documents import Snapshot, parse_from, parse_snapshot
from ..syntax.postprocess import error_count
from .formats import HistoryItem

_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
_WORD = re.compile(r"\w")
_NAME = re.compile(r"[^\W\d]\w*")
_KEYWORD = re.compile(r"(?<![\w.])([^\W\d]\w*)\s*=(?!=)")  # `name=` in an inserted argument
MAX_LINE = 2000       # an edited line longer than this (a minified file) is not read
MAX_PLACES = 256      # places offered at most (jinja2's compiler calls self.write 112 times)
CALLS = ("call", "call_expression", "new_expression")  # a node with the callee an argument list belongs to
OPEN, CLOSE = "([{", ")]}"


@dataclass(frozen=True)
class Rule:
    """The change both edits made, as it reads inside its node."""
    node_type: str
    key: str       # an argument list's callee as written, else ""
    left: str      # the context before the change both edits share inside the node
    removed: str   # D
    inserted: str  # I
    right: str     # the context after it
    at_start: bool  # the left context is the node's whole text before the change, in both edits
    at_end: bool    # the right context is the rest of the node, in both


def _lines(history: Sequence[HistoryItem], path: str) -> list[tuple[str, str]]:
    """The file's last edits as changed lines (old, new), newest last: an item of several lines
    split into its lines where it kept their count, an edit typed in two bursts (the second
    starts from the first's text) as one; stops at an edit of another file."""
    out: list[tuple[str, str]] = []
    for h in reversed(history):
        if h.path != path or len(out) >= 2:
            break
        a, b = h.old.splitlines(), h.new.splitlines()
        if len(a) != len(b):
            break
        pairs = [(x, y) for x, y in zip(a, b) if x != y]
        for x, y in reversed(pairs):
            if out and out[0][0] == y:  # the same place, in two bursts
                out[0] = (x, out[0][1])
            elif len(out) < 2:
                out.insert(0, (x, y))
    return out


def _change(old: str, new: str) -> tuple[int, str, str] | None:
    """(where in `new` the change starts, D, I) at token boundaries, or None for no change."""
    if old == new or len(old) > MAX_LINE or len(new) > MAX_LINE:
        return None
    a, b = _TOKEN.findall(old), _TOKEN.findall(new)
    p = 0
    while p < len(a) and p < len(b) and a[p] == b[p]:
        p += 1
    s = 0
    while s < len(a) - p and s < len(b) - p and a[-1 - s] == b[-1 - s]:
        s += 1
    at, d, ins = len("".join(b[:p])), "".join(a[p:len(a) - s]), "".join(b[p:len(b) - s])
    if bool(d) != bool(ins) and (d or ins).endswith(", ") and b[p - 2:p] == [",", " "]:
        # `a, b, c` → `a, c` reads as `b, ` taken out after `a, `: the same as `, b` after `a`
        return at - 2, d and ", " + d[:-2], ins and ", " + ins[:-2]
    return at, d, ins


def _core(x: str) -> str:
    """An argument's text without the comma that separates it (`, x=1`, `x=1, `, `x=1`)."""
    x = x.strip()
    return x.removeprefix(",").removesuffix(",").strip()


def _key(n: Node, src: bytes) -> str:
    """The callee of an argument list as written (`foo`, `self.log.warn`), else ""."""
    p = n.parent
    if p is None or p.type not in CALLS:
        return ""
    f = p.child_by_field_name("function") or p.child_by_field_name("constructor")
    if f is None or f.end_byte > n.start_byte:
        return ""
    return src[f.start_byte:f.end_byte].decode("utf-8", "replace")


def _around(snap: Snapshot, a: int, b: int) -> Node | None:
    """The smallest named node holding bytes a..b that is more than them (the change's node); a
    point (text taken out) strictly inside, not at an edge of the next token."""
    n = snap.tree.root_node.named_descendant_for_byte_range(a, b)
    while n is not None and (n.start_byte > a or n.end_byte < b or (n.start_byte, n.end_byte) == (a, b)
                             or a == b and not n.start_byte < a < n.end_byte):
        n = n.parent
    return n if n is not None and n.parent is not None else None  # the whole file is no node to repeat in


def _common(a: str, b: str, from_end: bool) -> str:
    ta, tb = _TOKEN.findall(a), _TOKEN.findall(b)
    if from_end:
        ta, tb = ta[::-1], tb[::-1]
    k = 0
    while k < len(ta) and k < len(tb) and ta[k] == tb[k]:
        k += 1
    got = ta[:k]
    return "".join(got[::-1] if from_end else got)


def _site(snap: Snapshot, text: str, line: str, change: tuple[int, str, str], cursor: int,
          avoid: int | None = None) -> tuple[Node, str, int, int] | None:
    """The edited line's change in `text` (the occurrence of the line nearest `cursor`, other than
    the one at `avoid`): its node, the node's text before the change, where the change is in it,
    where the line starts."""
    best, i = None, text.find(line)
    while i >= 0:
        ok = (i == 0 or text[i - 1] == "\n") and (i + len(line) == len(text) or text[i + len(line)] in "\r\n")
        if ok and i != avoid and (best is None or abs(i - cursor) < abs(best - cursor)):
            best = i
        i = text.find(line, i + 1)
    if best is None:
        return None
    at, d, ins = change
    a, b = snap.byte_at(best + at), snap.byte_at(best + at + len(ins))
    node = _around(snap, a, b)
    if node is None:
        return None
    s, e = snap.char_at(node.start_byte), snap.char_at(node.end_byte)
    now = text[s:e]
    rel = best + at - s
    return node, now[:rel] + d + now[rel + len(ins):], rel, best


def detect(text: str, path: str, cursor: int, history: Sequence[HistoryItem], language: str | None,
           tree=None) -> tuple[Rule, int, int] | None:
    """The rule the file's last two edits agree on, and where they are (char offsets of their
    lines), or None."""
    if language is None:
        return None
    edits = _lines(history, path)
    if len(edits) < 2:
        return None
    (o1, n1), (o2, n2) = edits
    c1, c2 = _change(o1, n1), _change(o2, n2)
    if c1 is None or c2 is None:
        return None
    # one argument taken out at both, first or alone in one of them (`f(x=1)` → `f()`, `g(a, x=1)` → `g(a)`)
    dropped = not c1[2] and not c2[2] and _core(c1[1]) == _core(c2[1]) and _NAME.search(_core(c1[1]))
    if c1[1:] != c2[1:] and not dropped:
        return None
    _, d, ins = c2
    snap = Snapshot(text, language, tree) if tree is not None else parse_snapshot(text, language)
    if snap.tree is None:
        return None
    last = _site(snap, text, n2, c2, cursor)
    if last is None:
        return None
    first = _site(snap, text, n1, c1, cursor, avoid=last[3])  # two identical lines: not the same one
    if first is None or first[0].start_byte == last[0].start_byte:
        return None
    (na, ta, ra, _), (nb, tb, rb, _) = first, last
    if na.type != nb.type or _key(na, snap.source) != _key(nb, snap.source):
        return None
    if c1[1:] != c2[1:]:  # the argument out wherever it stands (_apply)
        return Rule(nb.type, _key(nb, snap.source), "", ", " + _core(d), "", "", False, False), \
            snap.char_at(na.start_byte), snap.char_at(nb.start_byte)
    la, lb, rgt_a, rgt_b = ta[:ra], tb[:rb], ta[ra + len(d):], tb[rb + len(d):]
    rule = _anchor(Rule(nb.type, _key(nb, snap.source), _common(la, lb, True), d, ins,
                        _common(rgt_a, rgt_b, False), la == lb, rgt_a == rgt_b))
    if not (_WORD.search(rule.key) or _WORD.search(rule.left + d + rule.right)):
        return None  # nothing pins it: every node of the type would do
    return rule, snap.char_at(na.start_byte), snap.char_at(nb.start_byte)


def _anchor(rule: Rule) -> Rule:
    """The side the change is anchored on. Two edits alike on both sides (`Timeout(timeout)` twice)
    say nothing of which side matters: the shorter one holds it (`)`: the end of the arguments).
    An insertion at an end is anchored there alone (an argument added last follows whatever came
    before it); a replacement keeps, of the other side, its own argument's text (`retries=` of
    `f(a, retries=3)`)."""
    left, right, at_start, at_end = rule.left, rule.right, rule.at_start, rule.at_end
    if at_start and at_end:
        at_start, at_end = len(left) < len(right), len(right) <= len(left)
    if at_end:
        cut = max(left.rfind(","), *(left.rfind(c) for c in OPEN)) + 1
        left = "" if not rule.removed else left[cut:].lstrip()
    elif at_start:
        cuts = [k for k in (right.find(","), *(right.find(c) for c in CLOSE)) if k >= 0]
        right = "" if not rule.removed else right[:min(cuts, default=len(right))].rstrip()
    return Rule(rule.node_type, rule.key, left, rule.removed, rule.inserted, right, at_start, at_end)


def sites(rule: Rule, snap: Snapshot) -> list[tuple[int, int, str]]:
    """The places the rule still applies to in the file (byte spans → text), in file order; each
    one's edit checked not to add parse errors."""
    src, text = snap.source, snap.text
    anchor = (rule.key or rule.left + rule.removed + rule.right).encode()
    found: dict[int, Node] = {}
    i = src.find(anchor)
    while i >= 0 and len(found) < MAX_PLACES * 4:
        for n in _nodes_near(snap, i, i + len(anchor), rule):
            found.setdefault(n.start_byte, n)
        i = src.find(anchor, i + 1)
    out = []
    for _, n in sorted(found.items()):
        s, e = snap.char_at(n.start_byte), snap.char_at(n.end_byte)
        items = [c for c in n.named_children if c.type != "comment"]
        got = _apply(rule, text[s:e], snap.char_at(items[-1].end_byte) - s if items else None)
        if got is not None:
            a, b, t = got
            out.append((snap.byte_at(s + a), snap.byte_at(s + b), t))
        if len(out) >= MAX_PLACES:
            break
    if not out or not _adds_errors(snap, out):
        return out
    return [x for x in out if not _adds_errors(snap, [x])]


def _nodes_near(snap: Snapshot, a: int, b: int, rule: Rule) -> list[Node]:
    """Nodes of the rule's type around bytes a..b (the anchor's occurrence): the one holding it,
    or, for a callee, the argument list of the call it names."""
    n = snap.tree.root_node.descendant_for_byte_range(a, b)
    out = []
    for _ in range(6):
        if n is None:
            break
        if rule.key:
            out += [c for c in n.children if c.type == rule.node_type and _key(c, snap.source) == rule.key]
            if out:
                break
        elif n.type == rule.node_type and n.start_byte <= a and b <= n.end_byte:
            out.append(n)
            break
        n = n.parent
    return out


def _apply(rule: Rule, t: str, last: int | None = None) -> tuple[int, int, str] | None:
    """The edit (chars in the node's text `t`: start, end, text) the rule makes there, or None.
    `last`: where the node's last child that is not a comment ends (an argument added last goes
    there, not after a comment that follows it)."""
    d, ins = rule.removed, rule.inserted
    p = _anchored(rule, t)
    if p is None and _WORD.search(d):  # elsewhere in the node: where its context and D occur once
        p = _once(t, rule.left + d, len(rule.left))
    core = _core(d)
    if not ins and _NAME.search(core) and (d.startswith(",") or d.rstrip().endswith(",") or _argument(t, p, d)):
        # a whole argument, wherever it stands, over lines or not, with the comma it needs gone
        return _taken_out(t, core, None if p is None else p + d.index(core))
    if p is None:
        return None
    if ins.strip(", ") and _WORD.search(ins) and ins.strip(", ") in t:
        return None  # it has the change already (one of the user's own edits, or written before)
    if any(re.search(rf"(?<![\w.]){re.escape(k)}\s*=(?!=)", t) for k in _KEYWORD.findall(ins)):
        return None  # a keyword argument it passes already (`foo(x, timeout=3)`)
    if not d and ins.startswith(","):
        head = t[:p].rstrip()
        if head.endswith(tuple(OPEN)):
            return p, p, ins[1:].lstrip()  # `foo()` → `foo(timeout=t)`
        if last is not None and last <= p:  # after the last argument, not after a comment or on the `)` line
            comma = t[last:p].lstrip()[:1] == ","
            p = t.index(",", last) if comma else last  # a trailing comma stays last: `b,\n)` → `b, timeout=t,\n)`
    if not d and ins.rstrip().endswith(",") and t[p:].lstrip()[:1] in tuple(CLOSE):
        return p, p, ins.rstrip()[:-1].rstrip()  # `foo()` → `foo(ctx)`
    return p, p + len(d), ins


def _argument(t: str, p: int | None, d: str) -> bool:
    """Whether t[p:p + len(d)] is one whole argument (separators or brackets on both sides)."""
    return p is not None and t[:p].rstrip()[-1:] in tuple(OPEN + ",") and \
        t[p + len(d):].lstrip()[:1] in tuple(CLOSE + ",")


def _taken_out(t: str, core: str, k: int | None = None) -> tuple[int, int, str] | None:
    """The span that takes argument `core` (at `k`, else where it occurs once) out of the node's
    text `t` with its comma: the comma before it, or (the first) the comma after it and the space
    up to the next one, or (alone) itself."""
    k = _once(t, core, 0) if k is None else k
    if k is None:
        return None
    e = k + len(core)
    head, tail = t[:k].rstrip(), t[e:].lstrip()
    if head.endswith(","):
        return len(head) - 1, e, ""
    if not head.endswith(tuple(OPEN)):
        return None
    if tail.startswith(","):
        rest = t[e:].lstrip()[1:]
        return k, len(t) - len(rest.lstrip()), ""  # `f(flag=1, x)` → `f(x)`
    return (k, e, "") if tail[:1] in tuple(CLOSE) else None  # `f(flag=1)` → `f()`


def _anchored(rule: Rule, t: str) -> int | None:
    """Where the change goes in `t` with both contexts: at the node's end (or start) where the
    user's two edits were, else at the one place they occur."""
    pat = rule.left + rule.removed + rule.right
    if rule.at_end:
        p = len(t) - len(rule.right) - len(rule.removed)
        ok = t.endswith(pat) and (not rule.at_start or p == len(rule.left))
        return p if ok else None
    if rule.at_start:
        return len(rule.left) if t.startswith(pat) else None
    return _once(t, pat, len(rule.left))


def _once(t: str, pat: str, skip: int) -> int | None:
    """`skip` past the one occurrence of `pat` in `t` at token boundaries, or None."""
    k = t.find(pat)
    if k < 0 or t.find(pat, k + 1) >= 0 or not _bounded(t, k, k + len(pat)):
        return None
    return k + skip


def _bounded(t: str, a: int, b: int) -> bool:
    """Whether t[a:b] starts and ends at token boundaries (no word cut in two)."""
    return not (0 < a and _WORD.match(t[a - 1]) and _WORD.match(t[a])) and \
        not (b < len(t) and 0 < b and _WORD.match(t[b - 1]) and _WORD.match(t[b]))


def _adds_errors(snap: Snapshot, edits: list[tuple[int, int, str]]) -> bool:
    """Whether the file with these edits (byte spans, disjoint, in order) parses with more errors
    than it does (parsed again from its tree, around the edits)."""
    src = snap.source
    for a, b, t in reversed(edits):
        src = src[:a] + t.encode() + src[b:]
    return error_count(parse_from(src, snap.language, (snap.source, snap.tree))) > error_count(snap.tree)
