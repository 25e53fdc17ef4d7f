"""Next-edit training data (issue 24 item 4) made from Python source: one change applied at a
site — a local or parameter renamed, a `self.` attribute renamed, a called function renamed, a
literal changed, an argument added to or removed from a call — and the answer is the editable
region with that change carried to the region's other sites (or unchanged when it has none).

The same tasks, made from files the pair never saw, are what bench/next_edit.py measures, so
`make_task` takes the region rule as an argument: training draws regions at random, the bench
uses the language server's own rule. Sites come from the syntax tree (`ast`): a keyword
argument of a call is not the local of the same name, a string is not a name.
"""
from __future__ import annotations

import ast
import random
from collections.abc import Callable
from dataclasses import dataclass

from .edit_format import HistoryItem, own_prompt

KINDS = ("rename_local", "rename_attr", "rename_call", "literal", "add_arg", "remove_arg")
# training mix: renames dominate (what users do most and what the bench's goal names)
KIND_WEIGHTS = (0.42, 0.16, 0.12, 0.10, 0.12, 0.08)
NOOP_RATE = 0.12  # samples whose region has no other site: the answer is the region unchanged

_SUFFIXES = ("_list", "_value", "_count", "_name", "_data", "_obj", "s", "2", "_new", "_tmp", "_id")
_WORDS = ("result", "value", "items", "total", "node", "entry", "text", "buf", "index", "key",
          "payload", "target", "source", "state", "config", "handler", "offset", "limit", "path")


@dataclass(frozen=True)
class Site:
    start: int  # char offsets in the file
    end: int
    line: int   # 0-based line
    new: str    # the replacement text


@dataclass(frozen=True)
class EditTask:
    kind: str
    path: str
    before: str    # the file before the user's change (the CLI's --before)
    current: str   # the file after it (the CLI's FILE)
    expected: str  # the file with the change carried to the region's other sites
    region: tuple[int, int]  # whole lines [lo, hi) of `current`, 0-based
    line: int      # the cursor: the end of the user's change
    col: int
    sites: int     # sites in the region besides the user's (0: the answer changes nothing)

    @property
    def history(self) -> list[HistoryItem]:
        a, b = self.before.splitlines(keepends=True), self.current.splitlines(keepends=True)
        return [HistoryItem(self.path, a[self.line], b[self.line])]

    def region_text(self, text: str | None = None) -> str:
        lines = (self.current if text is None else text).splitlines(keepends=True)
        return "".join(lines[self.region[0]:self.region[1]])


RegionRule = Callable[[str, int, int, tuple[int, int], random.Random], tuple[int, int]]


def random_region(text: str, line: int, col: int, scope: tuple[int, int], rng: random.Random) -> tuple[int, int]:
    """Training regions: 0–3 lines above the cursor, 4–30 below, inside the enclosing scope
    (a def or class, whole lines) most of the time."""
    lo, hi = line - rng.randint(0, 3), line + 1 + rng.randint(4, 30)
    if rng.random() < 0.75:
        lo, hi = max(lo, scope[0]), min(hi, scope[1])
    n = text.count("\n") + 1
    return max(0, lo), min(n, max(hi, line + 1))


def parse_kind_weights(spec: str) -> tuple[float, ...]:
    """`rename_local=0.5,literal=0.1,...` → one weight per KINDS entry (a kind left out: its
    KIND_WEIGHTS share); a clear ValueError for an unknown kind or a weight that is not ≥ 0."""
    weights = dict(zip(KINDS, KIND_WEIGHTS, strict=True))
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in weights:
            raise ValueError(f"kind weight {part!r}: expected KIND=WEIGHT with KIND one of {', '.join(KINDS)}")
        try:
            w = float(value)
        except ValueError:
            raise ValueError(f"kind weight {part!r}: {value!r} is not a number") from None
        if not w >= 0:
            raise ValueError(f"kind weight {part!r}: a weight is ≥ 0")
        weights[name.strip()] = w
    if not any(weights.values()):
        raise ValueError("kind weights: at least one kind needs a weight above 0")
    return tuple(weights[k] for k in KINDS)


def make_task(text: str, path: str, rng: random.Random, kind: str | None = None,
              region_rule: RegionRule = random_region, max_region_chars: int = 1400,
              noop_rate: float = NOOP_RATE, tries: int = 8,
              weights: tuple[float, ...] = KIND_WEIGHTS) -> EditTask | None:
    """One task from `text` (None when the file has no usable site of that kind); without
    `kind`, one drawn by `weights` (one per KINDS entry)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    for _ in range(tries):
        k = kind or rng.choices(KINDS, weights)[0]
        got = _GROUPS[k](tree, lines, starts, rng)
        if not got:
            continue
        sites, scope = got
        user = sites[0] if rng.random() < 0.6 else rng.choice(sites)
        current = text[:user.start] + user.new + text[user.end:]
        col = user.start - starts[user.line] + len(user.new)
        lo, hi = region_rule(current, user.line, col, scope, rng)
        if len("".join(lines[lo:hi])) > max_region_chars:
            continue
        others = [s for s in sites if s is not user and lo <= s.line < hi]
        if not others and rng.random() >= noop_rate:
            continue
        expected = _apply(current, [s for s in others], user)
        return EditTask(k, path, text, current, expected, (lo, hi), user.line, col, len(others))
    return None


def _apply(current: str, sites: list[Site], user: Site) -> str:
    """`sites` (offsets in the text before the user's change) applied to `current`."""
    shift = len(user.new) - (user.end - user.start)
    out = current
    for s in sorted(sites, key=lambda s: s.start, reverse=True):
        a, b = (s.start, s.end) if s.start < user.start else (s.start + shift, s.end + shift)
        out = out[:a] + s.new + out[b:]
    return out


# -- sites per kind: (sites, scope lines [lo, hi)) or None ------------------------------------
def _off(lines: list[str], starts: list[int], lineno: int, col_bytes: int) -> int:
    ln = lines[lineno - 1]
    return starts[lineno - 1] + len(ln.encode("utf-8")[:col_bytes].decode("utf-8", "replace"))


def _scopes(tree, kinds) -> list:
    return [n for n in ast.walk(tree) if isinstance(n, kinds) and (n.end_lineno or 0) - n.lineno < 120]


def _fresh(rng: random.Random, old: str, taken: set[str]) -> str | None:
    for _ in range(6):
        r = rng.random()
        if r < 0.45:
            new = old.rstrip("_0123456789") + rng.choice(_SUFFIXES)
        elif r < 0.8:
            new = rng.choice(_WORDS)
        else:
            parts = old.split("_")
            new = parts[0] + "".join(p.title() for p in parts[1:]) if len(parts) > 1 else old[:3] + "_" + rng.choice(_WORDS)
        if new.isidentifier() and new != old and new not in taken and not _keyword(new):
            return new
    return None


def _keyword(s: str) -> bool:
    import keyword
    return keyword.iskeyword(s) or s in ("self", "cls", "None", "True", "False")


def _rename_local(tree, lines, starts, rng):
    funcs = _scopes(tree, (ast.FunctionDef, ast.AsyncFunctionDef))
    rng.shuffle(funcs)
    for f in funcs[:6]:
        occ: dict[str, list[tuple[int, int, int]]] = {}
        stored: set[str] = set()
        for n in ast.walk(f):
            if isinstance(n, ast.arg) and n is not f:
                occ.setdefault(n.arg, []).append((n.lineno, n.col_offset, len(n.arg)))
                stored.add(n.arg)
            elif isinstance(n, ast.Name):
                occ.setdefault(n.id, []).append((n.lineno, n.col_offset, len(n.id)))
                if isinstance(n.ctx, ast.Store):
                    stored.add(n.id)
        names = [nm for nm, o in occ.items() if nm in stored and len(o) >= 2 and len(nm) >= 2 and not _keyword(nm)]
        sites = _renamed(rng, occ, names, lines, starts)
        if sites:
            return sites, (f.lineno - 1, f.end_lineno)
    return None


def _renamed(rng, occ: dict, names: list[str], lines, starts) -> list[Site] | None:
    """Every occurrence of one of `names` (drawn) renamed to a fresh name, or None."""
    if not names:
        return None
    old = rng.choice(names)
    new = _fresh(rng, old, set(occ))
    return None if new is None else _sites(lines, starts, occ[old], new)


def _rename_attr(tree, lines, starts, rng):
    classes = _scopes(tree, ast.ClassDef)
    rng.shuffle(classes)
    for c in classes[:4]:
        occ: dict[str, list[tuple[int, int, int]]] = {}
        for n in ast.walk(c):
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                    and n.end_lineno == n.lineno):
                occ.setdefault(n.attr, []).append((n.lineno, n.end_col_offset - len(n.attr.encode()), len(n.attr)))
        sites = _renamed(rng, occ, [nm for nm, o in occ.items() if len(o) >= 2 and len(nm) >= 2], lines, starts)
        if sites:
            return sites, (c.lineno - 1, c.end_lineno)
    return None


def _calls(tree, lines, starts, rng, single_line: bool = False):
    """Calls grouped by the called name (a bare name or an attribute's last part), per scope."""
    scopes = _scopes(tree, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    rng.shuffle(scopes)
    for sc in scopes[:6]:
        by: dict[str, list[ast.Call]] = {}
        for n in ast.walk(sc):
            if isinstance(n, ast.Call) and (not single_line or n.lineno == n.end_lineno):
                f = n.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name and f.end_lineno == f.lineno:
                    by.setdefault(name, []).append(n)
        groups = {k: v for k, v in by.items() if len(v) >= 2}
        if groups:
            yield sc, groups


def _rename_call(tree, lines, starts, rng):
    for sc, groups in _calls(tree, lines, starts, rng):
        old = rng.choice(sorted(groups))
        new = _fresh(rng, old, set(groups))
        if new is None:
            continue
        occ = [(c.func.end_lineno, c.func.end_col_offset - len(old.encode()), len(old)) for c in groups[old]]
        return _sites(lines, starts, occ, new), (sc.lineno - 1, sc.end_lineno)
    return None


def _literal(tree, lines, starts, rng):
    funcs = _scopes(tree, (ast.FunctionDef, ast.AsyncFunctionDef))
    rng.shuffle(funcs)
    for f in funcs[:6]:
        occ: dict[str, list[tuple[int, int, int]]] = {}
        for n in ast.walk(f):
            if isinstance(n, ast.Constant) and n.lineno == n.end_lineno and type(n.value) in (int, str):
                seg = lines[n.lineno - 1].encode()[n.col_offset:n.end_col_offset].decode("utf-8", "replace")
                if isinstance(n.value, str) and (not (2 < len(seg) < 30) or seg[0] not in "'\"" or "\\" in seg):
                    continue
                occ.setdefault(seg, []).append((n.lineno, n.col_offset, len(seg)))
        segs = [s for s, o in occ.items() if len(o) >= 2]
        if not segs:
            continue
        old = rng.choice(segs)
        if old[0] in "'\"":
            new = old[0] + rng.choice(_WORDS) + old[0]
        else:
            try:
                v = int(old, 0)
            except ValueError:
                continue
            new = str(rng.choice((v + 1, v * 2, v + 10, max(0, v - 1))))
        if new == old:
            continue
        return _sites(lines, starts, occ[old], new), (f.lineno - 1, f.end_lineno)
    return None


def _add_arg(tree, lines, starts, rng):
    for sc, groups in _calls(tree, lines, starts, rng, single_line=True):
        name = rng.choice(sorted(groups))
        calls = [c for c in groups[name] if not c.keywords or rng.random() < 0.5]
        names = sorted({n.id for n in ast.walk(sc) if isinstance(n, ast.Name)} - {name})
        arg = rng.choice(names) if names and rng.random() < 0.7 else rng.choice(_WORDS + ("None", "True", "0"))
        sites, text = [], "".join(lines)
        for c in calls:
            end = _off(lines, starts, c.end_lineno, c.end_col_offset) - 1  # the ')'
            if text[end] != ")" or text[end - 1] in ",( \t" and (c.args or c.keywords):
                continue
            sites.append(Site(end, end, c.lineno - 1, (", " if (c.args or c.keywords) else "") + arg))
        if len(sites) >= 2:
            return sites, (sc.lineno - 1, sc.end_lineno)
    return None


def _remove_arg(tree, lines, starts, rng):
    for sc, groups in _calls(tree, lines, starts, rng, single_line=True):
        name = rng.choice(sorted(groups))
        sites = []
        for c in groups[name]:
            if c.keywords or not c.args or any(isinstance(a, ast.Starred) for a in c.args):
                continue
            last = c.args[-1]
            a = (_off(lines, starts, c.args[-2].end_lineno, c.args[-2].end_col_offset) if len(c.args) > 1
                 else _off(lines, starts, c.func.end_lineno, c.func.end_col_offset) + 1)
            b = _off(lines, starts, last.end_lineno, last.end_col_offset)
            sites.append(Site(a, b, c.lineno - 1, ""))
        if len(sites) >= 2:
            return sites, (sc.lineno - 1, sc.end_lineno)
    return None


def _sites(lines, starts, occ, new) -> list[Site]:
    out = {}
    for lineno, col, n in occ:
        a = _off(lines, starts, lineno, col)
        out[a] = Site(a, a + n, lineno - 1, new)
    return sorted(out.values(), key=lambda s: s.start)


_GROUPS = {"rename_local": _rename_local, "rename_attr": _rename_attr, "rename_call": _rename_call,
           "literal": _literal, "add_arg": _add_arg, "remove_arg": _remove_arg}


# -- samples ---------------------------------------------------------------------------------
def sample_ids(task: EditTask, tok, encode) -> tuple[list[int], int]:
    """Token ids of the task in the pair's own format, and where the answer starts (loss is
    taken from there: the region rewritten and the end-of-text token). `encode(text)` gives a
    document text's ids (never a special token)."""
    return own_sample_ids(task.history, task.path, task.region_text(), task.region_text(task.expected), tok, encode)


def own_sample_ids(history, path: str, region: str, answer: str, tok, encode) -> tuple[list[int], int]:
    ids: list[int] = []
    for p in own_prompt(history, path, region):
        ids += [tok.token_to_id(p.text)] if p.special else encode(p.text)
    start = len(ids)
    ids += encode(answer) + [tok.token_to_id("<|endoftext|>")]
    return ids, start
