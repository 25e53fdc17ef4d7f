"""Which files make up a workspace, and the one way the index reads them.

The root and its walk: a walk honours `.gitignore` (per directory, last match wins, `!`
re-includes, a trailing `/` matches directories only, a `/` elsewhere anchors the pattern to its
file's directory; the patterns read are bounded and counted), skips vendored and generated trees,
huge and binary files, names that are not UTF-8 and symlinks that leave the root or loop back, and
is bounded in the files it yields and the entries it looks at (a root of `/` or a home directory
is indexed partially, nearest the open files first).

The rules every path the index reads obeys (issue 35): `resolve` — it resolves inside the root
(a link inside the root to a file inside it is fine; `settings.py -> ~/.aws/credentials` is
not); `nameable` — its name is UTF-8 (a prompt never holds a name the tokenizer refuses, and a
file has one name, not the walk's and the editor's); `read_bytes` — a regular file, opened
without blocking (a FIFO) and read with a size cap (`/dev/zero`)."""
from __future__ import annotations

import logging
import os
import posixpath
import re
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from ..documents import is_binary, language_for

log = logging.getLogger(__name__)
ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "package.json", "go.mod", "Cargo.toml")
# Trees of code nobody edits here (dependencies, build output, caches): never indexed.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "bower_components", "vendor", "third_party",
                       "site-packages", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache",
                       ".ruff_cache", ".tox", ".nox", "target", "dist", "build", ".next", ".cache"})
SKIP_SUFFIXES = (".min.js", ".bundle.js", ".d.ts.map")
# The walk's bounds: a root with more is indexed partially, nearest the open files first, and says so.
MAX_WALK_FILES = 20_000      # files one walk yields (each is parsed: the walk's time)
BROAD_ROOT_FILES = 2_000     # the same for a root that is `/` or the home directory (rootUri file:///)
MAX_WALK_ENTRIES = 500_000   # directory entries one walk looks at (a tree of few sources: /proc, caches)
# .gitignore patterns cost about 620 bytes each compiled, and every entry below them is matched
# against them (12 nested files of 100 000 patterns: +600 MB, 62 s of CPU for 13 files).
MAX_IGNORE_BYTES = 64 * 1024     # of one .gitignore read (cut at its last whole line)
MAX_IGNORE_PATTERNS = 1_000      # kept from one .gitignore
MAX_WALK_IGNORE_PATTERNS = 4_000  # kept from all of one walk's .gitignore files (≤ 2.5 MB, ≤ 7 ms an entry)
READ_TRIES = 3  # reads of a file that changes while it is read (a writer mid-save) before its last read stands
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def find_root(path: str | Path) -> Path:
    """The nearest directory at or above `path` holding a project marker, else `path`'s directory."""
    p = Path(path).resolve()
    start = p if p.is_dir() else p.parent
    for d in (start, *start.parents):
        if any((d / m).exists() for m in ROOT_MARKERS):
            return d
    return start


# -- the rules of every read -----------------------------------------------------------------------
def nameable(name: str) -> bool:
    """Whether the index can carry this name: UTF-8 (os.scandir gives an undecodable byte as a
    lone surrogate, which the tokenizer refuses and a `file:` URI spells another way) and no NUL."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in name


def resolve(root: Path, rel: str) -> Path | None:
    """Where the file `rel` names under `root` (a resolved path) really is, or None when that is
    outside the root: every path the index reads passes here (the walk, the editor's events, a
    document indexed on first use)."""
    try:
        real = Path(os.path.realpath(root / rel))
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None
    return real if real.is_relative_to(root) else None


def read_bytes(root: Path, rel: str, limit: int) -> bytes | None:
    """At most `limit` + 1 bytes of the regular file `rel` names under `root` (more means too
    large; the caller decides), or None: outside the root once resolved, not a regular file
    (a FIFO, a device, a directory), unreadable. Read again when it changed while it was read."""
    path = resolve(root, rel)
    if path is None:
        return None
    data = None
    for _ in range(READ_TRIES):
        try:
            # non-blocking: opening a FIFO would wait for a writer forever; no-follow: `path` is
            # resolved, a link now is one swapped in since
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return None
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                return None
            data = _read_fd(fd, limit + 1)
            after = os.fstat(fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        if (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size):
            break
    return data


def _read_fd(fd: int, n: int) -> bytes:
    """Up to `n` bytes of an open file (a file that grows while read is cut there)."""
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_source(root: Path, rel: str, max_bytes: int) -> str | None:
    """A file's text, or None: not readable under the rules above, larger than `max_bytes`,
    binary or not UTF-8."""
    data = read_bytes(root, rel, max_bytes)
    if data is None or len(data) > max_bytes:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if is_binary(text) else text


def wanted(name: str) -> bool:
    """A file in a language the index reads (by name alone)."""
    return language_for(None, name) is not None and not name.endswith(SKIP_SUFFIXES)


# -- .gitignore ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern
    negate: bool
    dir_only: bool


def parse_gitignore(text: str) -> Iterator[_Rule]:
    """The rules of a .gitignore, one at a time (a caller takes as many as it keeps)."""
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
        yield _Rule(re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z"), negate, dir_only)


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


Stack = list[tuple[str, list[_Rule]]]  # (a .gitignore's directory relative to the root, its rules), outermost first


def ignored(stack: Stack, rel: str, is_dir: bool) -> bool:
    """Whether `rel` (root-relative, '/'-separated) is ignored by the .gitignore files in `stack`."""
    verdict = False
    for base, rules in stack:
        sub = rel[len(base) + 1:] if base else rel
        for r in rules:
            if (is_dir or not r.dir_only) and r.regex.match(sub):
                verdict = not r.negate
    return verdict


# -- the walk --------------------------------------------------------------------------------------------
def broad(root: Path) -> bool:
    """A root nobody means to index whole: `/` (or a drive) or the home directory."""
    try:
        home = Path.home().resolve()
    except (RuntimeError, OSError):  # no home directory known
        home = None
    return root.parent == root or root == home


class Walk:
    """One walk of a workspace: iterating yields the root-relative path of each file worth
    indexing, first in the directories `near` was told of (an open file's, then its parents'),
    then breadth-first on from where it got to (a shallow file is more likely imported than one
    ten directories down). `near` may be called from another thread while the walk runs. It stops after `max_files` files or `max_entries` entries (`stopped` says
    which) and counts what it saw. Never raises for an unreadable directory; never enters a
    directory twice (symlink loops) or outside the root."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = root.resolve(), max_bytes
        self.broad = broad(self.root)
        self.max_files = BROAD_ROOT_FILES if self.broad else MAX_WALK_FILES
        self.max_entries = MAX_WALK_ENTRIES
        self.files = 0        # yielded
        self.found = 0        # files worth indexing in the directories listed (yielded or not)
        self.entries = 0      # directory entries looked at
        self.patterns = 0     # .gitignore patterns kept
        self.cut_ignores = 0  # .gitignore files read in part (too large, too many patterns)
        self.odd_names = 0    # names skipped: not UTF-8
        self.stopped: str | None = None  # "files" | "entries": the bound that ended the walk early
        self.done = False
        self._near: deque[str] = deque()
        self._asked: set[str] = set()
        self._queue: deque[tuple[str, Stack]] = deque([("", [])])
        self._listed: set[tuple[int, int]] = set()  # (st_dev, st_ino) of the directories listed
        self._rules: dict[str, list[_Rule]] = {}    # a directory with a .gitignore → its rules

    def near(self, rel: str) -> None:
        """The user opened the file `rel`: its directory and its parents' are listed next."""
        d = posixpath.dirname(rel)
        while not self.done and d not in self._asked:
            self._asked.add(d)
            self._near.append(d)
            if not d:
                break
            d = posixpath.dirname(d)

    def __iter__(self) -> Iterator[str]:
        try:
            while self.stopped is None:
                if self._near:
                    d = self._near.popleft()
                    stack = self._stack_above(d)
                    if stack is None:
                        continue
                elif self._queue:
                    d, stack = self._queue.popleft()
                else:
                    return
                yield from self._list(d, stack)
        finally:  # what only a walk under way needs (compiled patterns, the directories seen) goes
            self.done = True
            self._near, self._asked, self._queue, self._listed, self._rules = deque(), set(), deque(), set(), {}

    def _stack_above(self, d: str) -> Stack | None:
        """The .gitignore rules above a near directory, or None when the walk would not enter it
        (a skipped or ignored directory on the way, a name it cannot carry, outside the root)."""
        stack: Stack = []
        parts = d.split("/") if d else []
        for i, name in enumerate(parts):
            parent = "/".join(parts[:i])
            rules = self._ignore_rules(parent)
            if rules:
                stack.append((parent, rules))
            if name in SKIP_DIRS or not nameable(name) or ignored(stack, "/".join(parts[:i + 1]), True):
                return None
        return stack if not d or resolve(self.root, d) is not None else None

    def _list(self, d: str, stack: Stack) -> Iterator[str]:
        path = self.root / d if d else self.root
        try:
            st = path.stat()
            if (st.st_dev, st.st_ino) in self._listed:
                return
            self._listed.add((st.st_dev, st.st_ino))
            with os.scandir(path) as it:  # never more than the entries left to look at
                entries = list(islice(it, self.max_entries - self.entries + 1))
        except OSError:
            return
        if self.entries + len(entries) > self.max_entries:
            self.stopped = "entries"
            entries = entries[:self.max_entries - self.entries]
        self.entries += len(entries)
        entries.sort(key=lambda e: e.name)
        rules = self._ignore_rules(d)
        if rules:
            stack = [*stack, (d, rules)]
        for e in entries:
            if not nameable(e.name):
                self.odd_names += 1
                if self.odd_names == 1:  # the rest are counted (a hostile tree may hold thousands)
                    log.info("workspace: %r and any other name that is not UTF-8 are not indexed",
                             os.fsencode(e.path))
                continue
            rel = f"{d}/{e.name}" if d else e.name
            try:
                if e.is_dir():
                    if e.name in SKIP_DIRS or ignored(stack, rel, True):
                        continue
                    if e.is_symlink() and resolve(self.root, rel) is None:
                        continue
                    self._queue.append((rel, stack))
                elif e.is_file() and wanted(e.name) and not ignored(stack, rel, False) \
                        and e.stat().st_size <= self.max_bytes \
                        and (not e.is_symlink() or resolve(self.root, rel) is not None):
                    self.found += 1
                    if self.files >= self.max_files:
                        self.stopped = "files"
                        continue  # the rest of this directory is still counted
                    self.files += 1
                    yield rel
            except OSError:
                continue

    def _ignore_rules(self, d: str) -> list[_Rule]:
        """The rules of directory `d`'s .gitignore, read once, within the bounds on patterns."""
        if d in self._rules:
            return self._rules[d]
        data = read_bytes(self.root, f"{d}/.gitignore" if d else ".gitignore", MAX_IGNORE_BYTES)
        if data is None:  # none here (most directories)
            return []
        cut = len(data) > MAX_IGNORE_BYTES
        if cut:
            data = data[:data.rfind(b"\n", 0, MAX_IGNORE_BYTES) + 1]
        room = min(MAX_IGNORE_PATTERNS, MAX_WALK_IGNORE_PATTERNS - self.patterns)
        rules = list(islice(parse_gitignore(data.decode("utf-8", errors="replace")), room + 1))
        if cut or len(rules) > room:
            self.cut_ignores += 1
            rules = rules[:room]
            log.info("workspace: %s/.gitignore read in part: %d patterns kept (at most %d bytes and %d patterns "
                     "a file, %d a walk)", d or ".", len(rules), MAX_IGNORE_BYTES, MAX_IGNORE_PATTERNS,
                     MAX_WALK_IGNORE_PATTERNS)
        self.patterns += len(rules)
        self._rules[d] = rules
        return rules
