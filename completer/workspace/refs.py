"""Which workspace files use a definition of another file, and under which local name: what a
rename or a signature change at the definition is carried to (completer/edits/follow.py). Read
from the outlines through the Resolver's import resolution, so every import form it resolves
counts — `from m import f`, `from m import f as g`, `import pkg.m as m` + `m.f`, a package's
`__init__` re-exporting `f`, star imports; JS/TS named, namespace and `export … from`; Go package
imports and same-package files; Rust `use`.

A file that imports the definition under another name (`from m import f as g`) has its import
renamed and keeps `g`; a file that imports a name the definition is re-exported under (an
`__init__` with `from .m import f as g`, then `from pkg import g`) uses `g`: nothing to change
there. No file is opened here."""
from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .outline import Outline
from .resolve import Module, Resolver, Target


@dataclass(frozen=True)
class Use:
    path: str   # the importing file
    how: str    # "name": bound to a local name (`alias`); "module": `alias.<name>`; "star": bare, unimported
    alias: str  # the local name ("name"), the module's local name ("module"), "" for "star"
    imported: bool = True  # False: same-package use without an import (Go)
    source: str = ""       # the import's module as written ("" for Go's same package)


def importers(resolver: Resolver, outlines: Mapping[str, Outline], rel: str, name: str) -> list[Use]:
    """Files other than `rel` whose names resolve to `rel`'s top-level definition `name`, in path
    order (each (path, how, alias, source) once)."""
    o = outlines.get(rel)
    if o is None:
        return []
    targets: set[Target] = {(rel, i) for i in o.top.get(name, ())}
    if not targets:
        return []
    seen: dict[tuple[str, str, str, str], Use] = {}
    dir_names = {d.rsplit("/", 1)[-1] for d in resolver.dirs}  # once: every file's imports ask
    for path in sorted(outlines):
        if path == rel:
            continue
        f = outlines[path]
        if f.language != o.language and {f.language, o.language} - {"javascript", "typescript", "tsx"}:
            continue
        for imp in f.imports:
            if imp.name not in (name, "", "*") and not _module_like(imp.name, resolver, dir_names):
                continue
            for use in _uses(resolver, f, imp, name, targets):
                seen.setdefault((use.path, use.how, use.alias, use.source), use)
        if f.language == "go" and o.language == "go" and f.package == o.package \
                and posixpath.dirname(path) == posixpath.dirname(rel):
            seen.setdefault((path, "star", "", ""), Use(path, "star", "", imported=False))
    return list(seen.values())


def _module_like(name: str, resolver: Resolver, dir_names: set[str]) -> bool:
    """A name that may be a submodule (`from pkg import m`): a Python file or package of that name
    (`dir_names`: the last part of each of the resolver's directories)."""
    if resolver.py_modules.get(name) or name in dir_names:
        return True
    return "/" in name and any(d.endswith("/" + name) or d == name for d in resolver.dirs)


def _uses(resolver: Resolver, f: Outline, imp, name: str, targets: set[Target]) -> list[Use]:
    if imp.name == "*":  # as if it were `from source import name`
        hit = targets & set(_targets(resolver.binds(f, replace(imp, name=name, alias=name))))
        return [Use(f.path, "star", "", source=imp.source)] if hit else []
    out = []
    if f.language == "python" and imp.name == "" and "." in imp.alias:  # `import a.b` binds `a` too: `a.X`
        head = imp.alias.split(".")[0]
        mod = resolver.module(f, head)
        if mod is not None and targets & set(_targets(resolver.lookup(mod, name, 1))):
            out.append(Use(f.path, "module", head, source=imp.source))
    got = resolver.binds(f, imp)
    for t in got:
        if isinstance(t, Module):
            if targets & set(_targets(resolver.lookup(t, name, 1))) and imp.alias:
                out.append(Use(f.path, "module", imp.alias, source=imp.source))
        elif t in targets and imp.name == name:
            out.append(Use(f.path, "name", imp.alias or name, source=imp.source))
    return out


def _targets(items) -> list[Target]:
    return [t for t in items if not isinstance(t, Module)]


def providers(outlines: Mapping[str, Outline], rel: str, name: str, language: str) -> list[tuple[str, str]]:
    """Files other than `rel` that define `name` at top level (a function, class or variable, not
    an import of it), each with the module path an import names it by (Python: dotted from the
    top package, whose directories hold `__init__.py`), in path order."""
    out = []
    for path, o in sorted(outlines.items()):
        if path == rel or o.language != language:
            continue
        if any(o.definitions[i].kind in ("function", "class", "variable") for i in o.top.get(name, ())):
            out.append((path, python_import_name(outlines, path) if language == "python" else path))
    return out


def python_import_name(outlines: Mapping[str, Outline], path: str) -> str:
    """`src/pkg/sub/m.py` → `pkg.sub.m` (the directories above the top package are not in it)."""
    parts = path.rsplit(".", 1)[0].split("/")
    top = len(parts) - 1  # up while the directory above is a package
    while top > 0 and "/".join(parts[:top]) + "/__init__.py" in outlines:
        top -= 1
    mod = parts[top:]
    if mod and mod[-1] == "__init__":
        mod = mod[:-1]
    return ".".join(mod)
