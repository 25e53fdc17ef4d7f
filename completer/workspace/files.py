"""Which files make up a workspace: its root, a walk that honours `.gitignore` (per directory,
last match wins, `!` re-includes, a trailing `/` matches directories only, a `/` elsewhere anchors
the pattern to its file's directory) and skips vendored and generated trees, huge and binary
files, and symlinks that leave the root or loop back."""
from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..documents import is_binary, language_for

ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "package.json", "go.mod", "Cargo.toml")
# Trees of code nobody edits here (dependencies, build output, caches): never indexed.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "bower_components", "vendor", "third_party",
                       "site-packages", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache",
                       ".ruff_cache", ".tox", ".nox", "target", "dist", "build", ".next", ".cache"})
SKIP_SUFFIXES = (".min.js", ".bundle.js", ".d.ts.map")


def find_root(path: str | Path) -> Path:
    """The nearest directory at or above `path` holding a project marker, else `path`'s directory."""
    p = Path(path).resolve()
    start = p if p.is_dir() else p.parent
    for d in (start, *start.parents):
        if any((d / m).exists() for m in ROOT_MARKERS):
            return d
    return start


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern
    negate: bool
    dir_only: bool


def parse_gitignore(text: str) -> list[_Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):  # an escaped trailing space
            line += " "
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        line = line.removeprefix("\\")
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _glob(line.lstrip("/"))
        rules.append(_Rule(re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z"), negate, dir_only))
    return rules


def _glob(pat: str) -> str:
    out, i = [], 0
    while i < len(pat):
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif pat[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pat[i] == "?":
            out.append("[^/]")
            i += 1
        elif pat[i] == "[" and "]" in pat[i + 2:]:
            j = pat.index("]", i + 2)
            cls = pat[i + 1:j]
            out.append("[" + ("^" + cls[1:] if cls[:1] in "!^" and cls else cls).replace("\\", "\\\\") + "]")
            i = j + 1
        else:
            out.append(re.escape(pat[i]))
            i += 1
    return "".join(out)


def ignored(stack: list[tuple[str, list[_Rule]]], rel: str, is_dir: bool) -> bool:
    """Whether `rel` (root-relative, '/'-separated) is ignored by the .gitignore files in
    `stack` [(their directory relative to the root, rules)], outermost first."""
    verdict = False
    for base, rules in stack:
        sub = rel[len(base) + 1:] if base else rel
        for r in rules:
            if (is_dir or not r.dir_only) and r.regex.match(sub):
                verdict = not r.negate
    return verdict


def walk(root: Path, max_bytes: int) -> Iterator[tuple[str, Path]]:
    """(root-relative path, absolute path) of each file worth indexing, breadth-first (a
    shallow file is more likely to be imported than one ten directories down). Never raises for
    an unreadable directory; never enters a directory twice (symlink loops) or outside the root."""
    root = root.resolve()
    seen: set[tuple[int, int]] = set()
    queue: deque[tuple[Path, str, list]] = deque([(root, "", [])])
    while queue:
        d, rel_d, stack = queue.popleft()
        try:
            st = d.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        gi = d / ".gitignore"
        if gi.is_file():
            try:
                stack = [*stack, (rel_d, parse_gitignore(gi.read_text(encoding="utf-8", errors="replace")))]
            except OSError:
                pass
        for e in entries:
            rel = f"{rel_d}/{e.name}" if rel_d else e.name
            try:
                if e.is_dir():
                    if e.name in SKIP_DIRS or ignored(stack, rel, True):
                        continue
                    if e.is_symlink() and not Path(e.path).resolve().is_relative_to(root):
                        continue
                    queue.append((Path(e.path), rel, stack))
                elif e.is_file() and wanted(e.name) and not ignored(stack, rel, False) \
                        and e.stat().st_size <= max_bytes:
                    yield rel, Path(e.path)
            except OSError:
                continue


def wanted(name: str) -> bool:
    """A file in a language the index reads (by name alone)."""
    return language_for(None, name) is not None and not name.endswith(SKIP_SUFFIXES)


def read_source(path: Path, max_bytes: int) -> str | None:
    """A file's text, or None: unreadable, too large, binary or not UTF-8."""
    try:
        if path.stat().st_size > max_bytes:
            return None
        data = path.read_bytes()[: max_bytes + 1]
    except OSError:
        return None
    if len(data) > max_bytes:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if is_binary(text) else text
