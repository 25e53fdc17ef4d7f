"""A definition from the index as the prompt shows it: signatures with bodies left out. A
function: its signature and first docstring line; a class (struct, interface, trait, impl): its
header, fields and member signatures (the short form: header and constructor only); a method:
its class's header and the method."""
from __future__ import annotations

from .outline import CONTAINERS, Definition, Outline

CONSTRUCTORS = frozenset({"__init__", "constructor", "new", "__new__", "__post_init__"})
MAX_MEMBERS = 40  # a class with hundreds of members shows its first ones


FORMS = ("full", "short", "header")  # tried in this order until one fits the budget


def render(o: Outline, i: int, form: str = "full") -> tuple[str, int, int]:
    """(text, first line, last line) of definition i of outline o. A container's `short` form
    keeps its constructor and first fields, its `header` form none of its members."""
    d = o.definitions[i]
    if d.kind in CONTAINERS:
        # private members are called from inside the class, not from the file at the cursor
        members = [o.definitions[j] for j in o.members(i) if not _private(o.definitions[j].name)]
        if o.language == "go":  # methods declared beside the type
            members += [m for m in o.definitions if m.owner == d.name]
        if form == "short":
            members = [m for m in members if m.name in CONSTRUCTORS or m.kind == "field"][:8]
        elif form == "header":
            members = []
        lines = [_own(o, d, elide=False)] + [_own(o, m, elide=True) for m in members[:MAX_MEMBERS]]
        if _braces(o) and d.signature.rstrip().endswith("{"):
            lines.append(_indent(d.signature) + "}")
        return "\n".join(lines), d.start_line, d.end_line
    if d.parent >= 0:
        c = o.definitions[d.parent]
        close = [_indent(c.signature) + "}"] if _braces(o) and c.signature.rstrip().endswith("{") else []
        text = "\n".join([_own(o, c, elide=False), _own(o, d, elide=True), *close])
        return text, c.start_line, d.end_line
    return _own(o, d, elide=True), d.start_line, d.end_line


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _braces(o: Outline) -> bool:
    return o.language != "python"


def _indent(s: str) -> str:
    first = s.split("\n", 1)[0]
    return first[: len(first) - len(first.lstrip())]


def _own(o: Outline, d: Definition, elide: bool) -> str:
    """One definition's header; `elide`: with its body replaced by a marker."""
    sig = d.signature
    if d.kind in ("field", "variable", "type"):
        return sig
    ind = _indent(sig.split("\n")[-1])
    if o.language == "python":
        doc = f'\n{ind}    """{d.doc}"""' if d.doc else ""
        return sig + doc + (f"\n{ind}    ..." if elide else "")
    doc = f"{ind}// {d.doc}\n" if d.doc else ""
    if not elide or not sig.rstrip().endswith("{"):
        return doc + sig
    return doc + sig + " /* ... */ }"
