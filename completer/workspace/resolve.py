"""A name as written at the cursor (`f`, `m.f`, `Foo.new`, `pkg.sub.Cls`) → the definitions it
names in other files of the workspace, through the importing file's imports, per language:
Python `from .m import f`, `import pkg.m as m` + `m.f`, re-exports through a package's
`__init__` (any name it binds, star imports, submodules); JS/TS relative imports and
`export … from`; Go imports inside the module of the root's go.mod and same-package files; Rust
`use crate::…`/`self::`/`super::` and `mod name;`.

Resolution only reads outlines (no file is opened); an import cycle or a chain of re-exports
deeper than MAX_DEPTH ends that branch with nothing. A Resolver serves one request: what a module
binds to a name is looked up once (memoised; a lookup an import cycle cut short is remembered as
it ended), and at most MAX_NAME_LOOKUPS lookups are made for one name and MAX_LOOKUPS in all;
past that the name resolves to what was found (500 modules each star-importing the next 10 took
40 s of lookups for one name, under the index's lock; 260 lookups now)."""
from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .outline import CONTAINERS, Outline

MAX_DEPTH = 8       # re-export hops followed
MAX_TARGETS = 4     # definitions one name may stand for (a name defined in 50 files stays cheap)
MAX_NAME_LOOKUPS = 500  # (module, name) lookups for one name at the cursor (the fan-out above: 260)
MAX_LOOKUPS = 2000      # ... and for the whole request (cursor.py offers up to 48 names)
JS_EXTS = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts")


@dataclass(frozen=True)
class Module:
    files: tuple[str, ...]  # the files whose top-level names it exports
    dir: str = ""           # a Python package's directory (its submodules), else ""


Target = tuple[str, int]  # (path, index into that outline's definitions)


def python_module_name(path: str) -> str:
    dotted = path.rsplit(".", 1)[0].replace("/", ".")
    return dotted.removesuffix(".__init__")


class Resolver:
    """One resolution pass over a consistent view of the index."""

    def __init__(self, outlines: Mapping[str, Outline], dirs: Mapping[str, list[str]],
                 py_modules: Mapping[str, list[str]], root: Path, go_module: str = ""):
        self.outlines, self.dirs, self.py_modules = outlines, dirs, py_modules
        self.root, self.go_module = root, go_module
        self._active: set[tuple] = set()  # lookups in progress: an import cycle ends there
        self._modules: dict[tuple[str, str], Module | None] = {}
        # (module, name) → (the depth it was looked up at, what it binds): good for that depth or deeper
        self._found: dict[tuple[Module, str], tuple[int, list[Target | Module]]] = {}
        self.lookups = 0      # lookups made (not memoised) in this request
        self._name_end = 0    # `lookups` at which the name being resolved has had its share

    # -- entry point ---------------------------------------------------------------------------------
    def resolve(self, o: Outline, chain: list[str]) -> list[Target]:
        """Definitions in other files that `chain` (a dotted name as used in `o`) names."""
        self._name_end = min(self.lookups + MAX_NAME_LOOKUPS, MAX_LOOKUPS)
        best, parts = None, []
        head = chain[0]
        for imp in o.imports:
            if imp.alias == head or imp.alias.startswith(head + "."):  # cheap before the split
                a = imp.alias.split(".")
                if chain[: len(a)] == a and len(a) > len(parts):
                    best, parts = imp, a
        if best is not None:
            cur, rest = self._import(o, best, 0), chain[len(parts):]
        else:
            cur, rest = self._scope(o, chain[0]), chain[1:]
        for part in rest:
            nxt: list[Target | Module] = []
            for t in cur:
                nxt += self.lookup(t, part, 0) if isinstance(t, Module) else self._members(t, part)
            cur = nxt[:MAX_TARGETS]
            if not cur:
                break
        return [t for t in cur if not isinstance(t, Module) and t[0] != o.path][:MAX_TARGETS]

    def binds(self, o: Outline, imp) -> list[Target | Module]:
        """What import `imp` of `o` binds: definitions, or a module (`import m`, a submodule)."""
        self._name_end = min(self.lookups + MAX_NAME_LOOKUPS, MAX_LOOKUPS)
        return self._import(o, imp, 0)

    # -- modules ----------------------------------------------------------------------------------------
    def _import(self, o: Outline, imp, depth: int) -> list[Target | Module]:
        mod = self.module(o, imp.source)
        if mod is None:
            return []
        if imp.name == "":
            return [mod]
        return self.lookup(mod, imp.name, depth + 1)

    def module(self, o: Outline, source: str) -> Module | None:
        key = (o.path, source)
        if key not in self._modules:
            self._modules[key] = self._module(o, source)
        return self._modules[key]

    def _module(self, o: Outline, source: str) -> Module | None:
        lang = o.language
        if lang == "python":
            return self._py_module(o.path, source)
        if lang == "go":
            if self.go_module and (source == self.go_module or source.startswith(self.go_module + "/")):
                d = source[len(self.go_module) + 1:]
                files = tuple(f for f in self.dirs.get(d, ()) if f.endswith(".go"))
                return Module(files) if files else None
            return None
        if lang == "rust":
            return self._rust_module(o.path, source)
        return self._js_module(o.path, source)

    def _py_module(self, path: str, source: str) -> Module | None:
        if source.startswith("."):
            level = len(source) - len(source.lstrip("."))
            base = posixpath.dirname(path)
            for _ in range(level - 1):
                base = posixpath.dirname(base)
            rest = source[level:]
            return self._py_path(posixpath.join(base, *rest.split(".")) if rest else base)
        last = source.rsplit(".", 1)[-1]
        # absolute: the shallowest file whose dotted path ends with the module's (src/ layouts too)
        hits = sorted((p for p in self.py_modules.get(last, ()) if (python_module_name(p) + ".").endswith(
            "." + source + ".") or python_module_name(p) == source), key=lambda p: (p.count("/"), p))
        if hits:
            p = hits[0]
            return Module((p,), posixpath.dirname(p) if p.endswith(("__init__.py", "__init__.pyi")) else "")
        return None

    def _py_path(self, p: str) -> Module | None:
        """The module at path `p` (no suffix): p.py, or the package p/ (with or without __init__)."""
        for c in (p + ".py", p + ".pyi"):
            if c in self.outlines:
                return Module((c,))
        init = tuple(c for c in (f"{p}/__init__.py" if p else "__init__.py",) if c in self.outlines)
        if init or p in self.dirs:
            return Module(init, p)
        return None

    def _js_module(self, path: str, source: str) -> Module | None:
        if not source.startswith("."):
            return None  # a package from node_modules: not part of the workspace
        p = posixpath.normpath(posixpath.join(posixpath.dirname(path), source))
        stems = [p] + ([p[:-3]] if p.endswith((".js", ".jsx")) else [])  # TS imports './x.js' for x.ts
        for stem in stems:
            for c in [stem + e for e in JS_EXTS] + [f"{stem}/index{e}" for e in JS_EXTS[1:]]:
                if c in self.outlines:
                    return Module((c,))
        return None

    # Rust: a module path → its file, from the crate's src/ directory
    def _rust_src(self, path: str) -> str:
        d = posixpath.dirname(path)
        while True:
            if (self.root / d / "Cargo.toml").is_file():
                return posixpath.join(d, "src") if d else "src"
            if posixpath.basename(d) == "src" or not d:
                return d
            d = posixpath.dirname(d)

    def _rust_path(self, path: str) -> list[str]:
        """The module path of a file: src/a/b.rs → [a, b]; src/a/mod.rs, src/lib.rs → [a], []."""
        src = self._rust_src(path)
        rel = path[len(src) + 1:] if src else path
        parts = rel[:-3].split("/")
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        return parts

    def _rust_module(self, path: str, source: str) -> Module | None:
        parts = [p for p in source.split("::") if p]
        if not parts:
            return None
        here = self._rust_path(path)
        if parts[0] == "crate":
            mod, parts = [], parts[1:]
        elif parts[0] == "self":
            mod, parts = here, parts[1:]
        elif parts[0] == "super":
            mod = here
            while parts and parts[0] == "super":
                mod, parts = mod[:-1], parts[1:]
        else:
            mod = here  # a child module in scope (`mod name;`), else an external crate: not found
        src = self._rust_src(path)
        full = "/".join(mod + parts)
        for c in ([f"{src}/{full}.rs", f"{src}/{full}/mod.rs"] if full else [f"{src}/lib.rs", f"{src}/main.rs"]):
            c = c.lstrip("/")
            if c in self.outlines:
                return Module((c,))
        return None

    def _scope(self, o: Outline, head: str) -> list[Target | Module]:
        """A name used without an import: Go's same-package files, Rust's crate/self/super paths."""
        if o.language == "go":
            d = posixpath.dirname(o.path)
            same = tuple(f for f in self.dirs.get(d, ()) if f != o.path and f.endswith(".go")
                         and self.outlines[f].package == o.package)
            return self.lookup(Module(same), head, 0)
        if o.language == "rust" and head in ("crate", "self", "super"):
            m = self._rust_module(o.path, head)
            return [m] if m is not None else []
        return []

    # -- names in a module ----------------------------------------------------------------------------
    def lookup(self, mod: Module, name: str, depth: int) -> list[Target | Module]:
        """What `name` is in module `mod`: its definitions, else what its imports bind to that
        name (re-exports), its star imports, or a submodule."""
        key = (mod, name)
        hit = self._found.get(key)
        if hit is not None and hit[0] <= depth:
            return hit[1]
        if depth > MAX_DEPTH or key in self._active or self.lookups >= self._name_end:
            return []
        self.lookups += 1
        self._active.add(key)
        try:
            out = self._lookup(mod, name, depth)[:MAX_TARGETS]
        finally:
            self._active.discard(key)
        self._found[key] = (depth, out)
        return out

    def _lookup(self, mod: Module, name: str, depth: int) -> list[Target | Module]:
        out: list[Target | Module] = []
        for f in mod.files:
            o = self.outlines.get(f)
            if o is None:
                continue
            if name == "default" and o.language != "python":  # `export default function f`
                out += [(f, i) for i, d in enumerate(o.definitions) if d.parent < 0
                        and d.signature.lstrip().startswith("export default")]
            out += [(f, i) for i in o.top.get(name, ())]
        if out:
            return _containers_first(self.outlines, out)
        for f in mod.files:
            o = self.outlines.get(f)
            if o is None:
                continue
            for imp in o.imports:
                if imp.alias == name and o.language != "go":
                    out += self._import(o, imp, depth)
            if not out:
                for imp in o.imports:
                    if imp.name == "*":
                        sub = self.module(o, imp.source)
                        out += self.lookup(sub, name, depth + 1) if sub is not None else []
            if out:
                return out
        if mod.dir or (mod.files and mod.files[0].endswith(".rs")):
            sub = (self._py_path(posixpath.join(mod.dir, name)) if mod.dir
                   else self._rust_module(mod.files[0], f"self::{name}"))
            if sub is not None:
                return [sub]
        return out

    def _members(self, t: Target, name: str) -> list[Target]:
        """`name` inside definition t: a method or field of a class, of a Rust type's impl blocks
        (same file) or of a Go type's methods (same package)."""
        path, i = t
        o = self.outlines[path]
        d = o.definitions[i]
        if d.kind not in CONTAINERS and d.kind != "type":
            return []
        same = [j for j, m in enumerate(o.definitions) if m.name == name and m.parent >= 0
                and o.definitions[m.parent].name == d.name]
        if same or o.language != "go":
            return [(path, j) for j in same]
        d_dir = posixpath.dirname(path)
        return [(f, j) for f in self.dirs.get(d_dir, ()) if f in self.outlines
                for j, m in enumerate(self.outlines[f].definitions) if m.owner == d.name and m.name == name]


def _containers_first(outlines: Mapping[str, Outline], ts: list[Target]) -> list[Target]:
    """A Rust struct before its impl blocks, a class before a same-named variable."""
    rank = {"class": 0, "struct": 0, "interface": 0, "trait": 0, "enum": 0, "function": 1, "type": 2, "impl": 3}
    return sorted(ts, key=lambda t: rank.get(outlines[t[0]].definitions[t[1]].kind, 4))
