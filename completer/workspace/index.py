"""The workspace index: file → outline (definitions and imports), kept current from the editor's
live text and from disk, bounded in memory, built in the background; and the ring of recently
edited and viewed files that similarity snippets come from. No torch here: it lives in the
language server's process. What it reads from disk, and which paths it takes at all, follow the
rules of completer.workspace.files (inside the root once resolved, regular files, bounded reads,
UTF-8 names).

The walk (files.Walk) goes nearest the open files first and stops at its bounds on files and
entries, or when the memory bound is reached: it never evicts what it indexed to walk on (that
traded the shallow files it meant to keep for deeper ones); `stats()["partial"]` then says how much
of the workspace is indexed. The editor's files are indexed even at the bound (the least
recently indexed others make room).

Threads: the builder thread is the only one that parses while it runs; `update` and `remove`
queue work for it (the latest text of a path wins) and `retrieve` reads under the lock what is
indexed so far, so a completion never waits for the index. Without a builder (`start` not
called: the CLI, tests, benchmarks) `update` indexes at once and `build` walks synchronously."""
from __future__ import annotations

import bisect
import logging
import posixpath
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tree_sitter import Tree

from ..config import WorkspaceOptions
from ..documents import MAX_PARSE_BYTES, Snapshot, encode, is_binary, language_for, parse_from, shared_ends
from .files import Walk, nameable, read_bytes, read_source, resolve
from .outline import Outline, outline
from .refs import Use, importers, providers, python_import_name
from .resolve import Resolver, python_module_name
from .retrieve import Snippet, View, retrieve
from .similar import Windows, windows

log = logging.getLogger(__name__)
RECENT_FILES = 16     # the ring of recently edited and viewed files similarity snippets come from
PROGRESS_EVERY = 100  # files between two progress reports
TOKEN_MEMO = 8192     # token counts remembered (snippet texts: about 2 MB at most)
KEEP_PARSES = 4       # parses kept to parse a file's next version from (see _Recent)
KEEP_BYTES = 1 << 20  # of their sources at most (their trees: ≈36× that, 4.3 MB for 120 KB)
KEEP_MIN = 32 * 1024  # a smaller file is parsed whole (≈5 ms)
BUILD_PAUSE_S = 0.001  # the builder's pause between two files: the language server's thread runs


def estimate_tokens(text: str) -> int:
    """Tokens of `text` without a tokenizer: 3 characters per token, an over-estimate for code
    (the embedded BPE averages 3.6 on Python, bench/context.py prints it)."""
    return (len(text) + 2) // 3


class WorkspaceIndex:
    def __init__(self, root: str | Path, options: WorkspaceOptions | None = None,
                 count_tokens: Callable[[str], int] = estimate_tokens,
                 on_progress: Callable[[str, int, str], None] | None = None):
        """`on_progress(kind, files_indexed, message)`, kind: begin | report | end (as `$/progress`)."""
        self.root = Path(root).resolve()
        options = options or WorkspaceOptions()
        self.options, self.count_tokens, self.on_progress = options, count_tokens, on_progress
        self.max_bytes = options.index_max_file_kb * 1024
        self.memory_bound = int(options.index_memory_mb * 2**20)
        self._lock = threading.RLock()
        self._outlines: dict[str, Outline] = {}
        self._dirs: dict[str, list[str]] = {}
        self._py: dict[str, list[str]] = {}       # a Python module's last name → its files
        self._names: dict[str, set[str]] = {}     # a definition's name → files defining it
        self._lru: OrderedDict[str, None] = OrderedDict()  # eviction order, least recent first
        self._live: set[str] = set()              # paths whose text is the editor's, not the disk's
        # an open document's outline before its latest re-index (at most RECENT_FILES): a rename's
        # importers are resolved against the text before it (importers), with no parse then
        self._before: OrderedDict[str, Outline] = OrderedDict()
        # recently edited and viewed files, most recent last: path → (text, its lines and windows once
        # a retrieval needed them; not at each keystroke)
        self._recent: OrderedDict[str, tuple[str, tuple[list[str], Windows] | None]] = OrderedDict()
        self._pending: OrderedDict[str, str | None] = OrderedDict()
        self._tokens: OrderedDict[str, int] = OrderedDict()  # text → tokens (see _count)
        self._renders: OrderedDict = OrderedDict()  # see View.render
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.used = 0            # estimated bytes the outlines hold
        self.complete = False    # the walk has finished (or stopped at a bound)
        self.full = False        # the memory bound stopped the walk or evicted files
        self._walker = Walk(self.root, self.max_bytes)
        self._walk_full = False  # the memory bound stopped the walk
        self.go_module = _go_module(self.root, self.max_bytes)

    # -- paths ------------------------------------------------------------------------------------------
    def rel(self, path: str | Path) -> str | None:
        """`path` relative to the root ('/'-separated), as the index names it (links not followed:
        a link inside the root is a file of its own name); None outside the root or for a name
        the index cannot carry (files.nameable). Whether it may be read is files.resolve's call."""
        if isinstance(path, str) and path in self._outlines:  # already relative (the common case)
            return path
        p = Path(path)
        if not p.is_absolute():
            p = self.root / p
        try:
            r = Path(posixpath.normpath(p.as_posix())).relative_to(self.root)
        except ValueError:
            return None
        return r.as_posix() if r.parts and r.parts[0] != ".." and nameable(r.as_posix()) else None

    # -- the editor's side ------------------------------------------------------------------------------
    def update(self, path: str | Path, text: str | None = None, recent: bool = False) -> bool:
        """(Re)index `path`: from `text` (an open document's live text: didOpen/didChange), or
        from disk (None: a watched-file change, didSave; an open document keeps its live text).
        `recent`: the user is editing or viewing it (similarity snippets come from such files).
        False: not part of the workspace."""
        rel = self.rel(path)
        if rel is None or language_for(None, rel) is None:
            return False
        if resolve(self.root, rel) is None:  # a link out of the root: neither its text nor the disk's is kept
            self.remove(rel)
            return False
        with self._lock:
            if text is None and rel in self._live:
                return True  # an open document: its live text stands
            if text is not None:
                self._live.add(rel)
                self._walker.near(rel)
                if recent:
                    self._remember(rel, text)
            if self._thread is not None:
                self._pending[rel] = text
                self._pending.move_to_end(rel)
                self._wake.notify_all()
                return True
        self._index(rel, text)
        return True

    def closed(self, path: str | Path) -> None:
        """didClose: the disk's text is the file's again."""
        rel = self.rel(path)
        if rel is not None:
            with self._lock:
                self._live.discard(rel)
                self._before.pop(rel, None)
            self.update(rel)

    def remove(self, path: str | Path) -> None:
        """A file deleted (or the old name of a renamed one)."""
        rel = self.rel(path)
        if rel is None:
            return
        with self._lock:
            self._pending.pop(rel, None)
            self._live.discard(rel)
            self._recent.pop(rel, None)
            self._before.pop(rel, None)
            self._drop(rel)

    def retrieve(self, doc_path: str | Path, text: str, cursor: int, budget: int) -> list[Snippet]:
        """Cross-file snippets for a completion at char `cursor` of `text` (the document's live
        text), at most `budget` tokens together; [] when cross-file context is off."""
        rel = self.rel(doc_path)
        if rel is None or not self.options.cross_file or budget <= 0 or resolve(self.root, rel) is None:
            return []  # a file outside the workspace (or a link out of it) has no imports into it
        offset = max(0, min(cursor, len(text)))
        with self._lock:
            known = rel in self._outlines
        if not known and language_for(None, rel) is not None:
            self._index(rel, text)  # the first completion in a file nobody indexed yet: its imports are needed
        with self._lock:
            view = View(self._outlines, Resolver(self._outlines, self._dirs, self._py, self.root, self.go_module),
                        self._names, self._recent_windows(rel), self._renders)
            return retrieve(view, rel, text, offset, budget, self._count, self.options.cross_file_max_files)

    def importers(self, path: str | Path, name: str, text: str | None = None) -> list[Use]:
        """The files that use `path`'s top-level definition `name` (refs.importers), resolved
        against `text` for `path` when given (the file before a rename: importers still name
        the old name) instead of what is indexed: the outline indexed from that very text (the
        current one, or for an open document the one its latest re-index replaced), else a parse."""
        rel = self.rel(path)
        if rel is None:
            return []
        mine = None
        if text is not None:
            stamp = hash(text)
            with self._lock:
                known = [o for o in (self._outlines.get(rel), self._before.get(rel)) if o is not None and o.stamp == stamp]
            mine = known[0] if known else outline(rel, _parse(text, language_for(None, rel)))
        with self._lock:
            outlines = self._outlines if mine is None or self._outlines.get(rel) is mine else {**self._outlines, rel: mine}
            resolver = Resolver(outlines, self._dirs, self._py, self.root, self.go_module)
            return importers(resolver, outlines, rel, name)

    def statements(self, path: str | Path, text: str) -> tuple[Sequence[int], Mapping[int, Sequence[int]]] | None:
        """(where `path`'s top-level statements that begin a line start, where the lines of its
        Python classes' bodies' statements start by class), byte offsets, when `text` is the
        text indexed for it; else None (documents.parse_ranges)."""
        rel = self.rel(path)
        with self._lock:
            o = self._outlines.get(rel) if rel is not None else None
            return (o.starts, o.bodies) if o is not None and o.stamp == hash(text) and o.starts else None

    def providers(self, path: str | Path, name: str) -> list[tuple[str, str]]:
        """The files other than `path` that define `name` at top level, with the module name an
        import uses (refs.providers), then the packages whose `__init__` re-exports a single such
        definition: where a name used but not bound in `path` may come from."""
        rel = self.rel(path)
        lang = language_for(None, rel) if rel is not None else None
        if rel is None or lang is None:
            return []
        with self._lock:
            found = providers(self._outlines, rel, name, lang)
            if lang == "python" and not found:  # no definition: a submodule of that name (`from pkg import name`)
                found = self._packages_holding(rel, name)
            if lang == "python" and len(found) == 1:  # and the packages re-exporting it (`from pkg import name`)
                resolver = Resolver(self._outlines, self._dirs, self._py, self.root, self.go_module)
                found += [(u.path, python_import_name(self._outlines, u.path))
                          for u in importers(resolver, self._outlines, found[0][0], name)
                          if u.path.endswith("__init__.py") and u.how == "name" and u.alias == name and u.path != rel]
            return found

    def _packages_holding(self, rel: str, name: str) -> list[tuple[str, str]]:
        """The packages with a submodule `name` (`pkg/name.py`, `pkg/name/__init__.py`) other than
        `rel` itself, as (the package's `__init__.py`, its import name): what `from pkg import
        name` needs. Under the lock."""
        out = set()
        for f in self._py.get(name, ()):
            d = posixpath.dirname(f)
            if f.endswith(("/__init__.py", "/__init__.pyi")):
                d = posixpath.dirname(d)
            init = d + "/__init__.py" if d else ""
            if f != rel and init in self._outlines:
                out.add((init, python_import_name(self._outlines, init)))
        return sorted(out)

    def _count(self, text: str) -> int:
        """Token counts memoised: the same signatures and windows come back keystroke after keystroke."""
        n = self._tokens.get(text)
        if n is None:
            n = self._tokens[text] = self.count_tokens(text)
            if len(self._tokens) > TOKEN_MEMO:
                self._tokens.popitem(last=False)
        return n

    # -- building -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Walk the workspace in a background thread, then keep applying updates."""
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="workspace-index", daemon=True)
                self._thread.start()

    def build(self) -> None:
        """Walk the whole workspace now (no builder thread)."""
        self._walk(lambda: None)

    def wait_idle(self, timeout: float) -> bool:
        """Until the walk is done and no update waits (tests, the CLI); False on timeout."""
        with self._lock:
            return self._wake.wait_for(lambda: self.complete and not self._pending, timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def stats(self) -> dict:
        """`partial`: "partial: N of at least M files (the bound that stopped the walk)", None
        when the walk saw every file (or is still walking); `found`: the files worth indexing the
        walk saw; `ignore_patterns`, `ignores_cut`: .gitignore patterns kept, files read in part;
        `skipped_names`: names that are not UTF-8."""
        w = self._walker
        with self._lock:
            return {"files": len(self._outlines), "bytes": self.used, "complete": self.complete,
                    "full": self.full, "recent": len(self._recent), "partial": self._partial(),
                    "found": w.found, "ignore_patterns": w.patterns, "ignores_cut": w.cut_ignores,
                    "skipped_names": w.odd_names}

    def _partial(self) -> str | None:
        w = self._walker
        if self._walk_full:
            why = f"index_memory_mb {self.options.index_memory_mb:g} reached"
        elif w.stopped == "files":
            why = f"a walk indexes at most {w.max_files} files" + (" under / or a home directory" if w.broad else "")
        elif w.stopped == "entries":
            why = f"a walk reads at most {w.max_entries} directory entries"
        else:
            return None
        n = len(self._outlines)
        return f"partial: {n} of at least {max(n, w.found)} files ({why}; nearest the open files first)"

    def _run(self) -> None:
        self._walk(self._drain)
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    return
            self._drain()

    def _drain(self) -> None:
        """Apply the queued updates (the editor's come before the walk's files)."""
        while True:
            with self._lock:
                if self._closed or not self._pending:
                    self._wake.notify_all()
                    return
                rel, text = self._pending.popitem(last=False)
            self._index(rel, text)

    def _walk(self, between: Callable[[], None]) -> None:
        self._progress("begin", "indexing the workspace")
        n = 0
        for rel in self._walker:
            between()
            with self._lock:
                if self._closed:
                    return
                if rel in self._outlines or rel in self._pending:
                    continue
            if not self._index(rel, None, walking=True):
                break
            time.sleep(BUILD_PAUSE_S)
            n += 1
            if n % PROGRESS_EVERY == 0:
                self._progress("report", f"{n} files", n)
        with self._lock:
            self.complete = True
            self._wake.notify_all()
            n, message = len(self._outlines), self._partial()
        self._progress("end", message or f"{n} files", n)

    def _progress(self, kind: str, message: str, n: int = 0) -> None:
        if self.on_progress is not None:
            try:
                self.on_progress(kind, n, message)
            except Exception:  # a broken progress sink must not stop the index
                log.exception("workspace index: progress report failed")

    # -- one file -------------------------------------------------------------------------------------
    def _index(self, rel: str, text: str | None, walking: bool = False) -> bool:
        """(Re)index `rel` from `text` or the disk. False: a file of the walk the memory bound
        has no room for (it is not kept, and the walk stops)."""
        if text is None:
            with self._lock:
                if rel in self._live:  # an open document's text beats the disk's
                    return True
            text = read_source(self.root, rel, self.max_bytes)
            if text is None:  # gone, out of the root, not a regular file, unreadable, binary or huge
                with self._lock:
                    self._drop(rel)
                return True
        elif len(text) > self.max_bytes:
            return True
        else:
            self._windows(rel, text)
        with self._lock:
            old = self._outlines.get(rel)
            if old is not None and old.stamp == hash(text):
                self._lru.move_to_end(rel)
                return True
        o = outline(rel, _parse(text, language_for(None, rel)))  # outside the lock
        with self._lock:
            if self._closed:
                return True
            before = self._outlines.get(rel)
            self._drop(rel)
            self._put(o)
            if before is not None and rel in self._live:
                self._before[rel] = before
                self._before.move_to_end(rel)
                while len(self._before) > RECENT_FILES:
                    self._before.popitem(last=False)
            if walking and self.used > self.memory_bound:
                self._drop(rel)
                self.full = self._walk_full = True
                return False
            while self.used > self.memory_bound and self._evict(keep=rel):
                self.full = True
        return True

    def _put(self, o: Outline) -> None:
        rel = o.path
        self._outlines[rel] = o
        self._lru[rel] = None
        self.used += o.cost
        bisect.insort(self._dirs.setdefault(posixpath.dirname(rel), []), rel)
        if o.language == "python":
            bisect.insort(self._py.setdefault(python_module_name(rel).rsplit(".", 1)[-1], []), rel)
        for d in o.definitions:
            if d.kind not in ("field", "variable"):
                self._names.setdefault(d.name, set()).add(rel)

    def _drop(self, rel: str) -> None:
        o = self._outlines.pop(rel, None)
        if o is None:
            return
        self._lru.pop(rel, None)
        self.used -= o.cost
        _discard(self._dirs, posixpath.dirname(rel), rel)
        if o.language == "python":
            _discard(self._py, python_module_name(rel).rsplit(".", 1)[-1], rel)
        for d in o.definitions:
            s = self._names.get(d.name)
            if s is not None:
                s.discard(rel)
                if not s:
                    del self._names[d.name]

    def _evict(self, keep: str) -> bool:
        """Drop the least recently indexed file that is neither open nor `keep`."""
        for rel in self._lru:
            if rel != keep and rel not in self._live:
                self._drop(rel)
                return True
        return False

    def _remember(self, rel: str, text: str) -> None:
        if len(text) > self.max_bytes:
            return
        old = self._recent.pop(rel, None)
        self._recent[rel] = old if old is not None and old[0] == text else (text, None)
        while len(self._recent) > RECENT_FILES:
            self._recent.popitem(last=False)

    def _windows(self, rel: str, text: str) -> None:
        """A recent file's windows, computed where files are indexed (the builder thread), so
        that neither a keystroke nor a retrieval pays for them."""
        with self._lock:
            entry = self._recent.get(rel)
            if entry is None or entry[1] is not None or entry[0] != text:
                return
        lines = text.split("\n")
        done = (lines, windows(lines))
        with self._lock:
            entry = self._recent.get(rel)
            if entry is not None and entry[1] is None and entry[0] == text:
                self._recent[rel] = (text, done)

    def _recent_windows(self, doc: str) -> list[tuple[str, list[str], Windows]]:
        """(path, lines, windows) of the recent files other than `doc`, most recent first, at
        most cross_file_max_files of them."""
        out = []
        for rel in reversed(self._recent):
            if len(out) >= self.options.cross_file_max_files:
                break
            if rel == doc:
                continue
            text, done = self._recent[rel]
            if done is None:
                lines = text.split("\n")
                done = (lines, windows(lines))
                self._recent[rel] = (text, done)
            out.append((rel, *done))
        return out


def _parse(text: str, language: str | None) -> Snapshot:
    """A parse from bytes: py-tree-sitter 0.26.1 keeps every chunk a read callback returns (400
    re-indexes of a 160 KB file typed in grew RSS 118.7 MB that way, 1.2 MB now). A parse from
    bytes holds the GIL throughout (160 ms for 270 KB here, every completion waiting on it), so the
    next version of a file parsed lately (the one being typed in) is parsed from that parse."""
    src = encode(text)
    if language is None or is_binary(text) or len(src) > MAX_PARSE_BYTES:
        return Snapshot(text, None, None)
    return Snapshot(text, language, _RECENT.parse(src, language))


class _Recent:
    """The last KEEP_PARSES parses of files of KEEP_MIN bytes or more, KEEP_BYTES of source at
    most: a text that shares all but less than half with one of them (its common prefix and
    suffix) is parsed incrementally from it, and takes its place. Any thread (the builder, a
    retrieval indexing a file first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[bytes, Tree, str]] = []  # (source, its tree, language), most recent first

    def parse(self, src: bytes, language: str) -> Tree:
        with self._lock:
            kept = [k for k in self._kept if k[2] == language]
        # the one it shares most with (a different file costs a few compares of 64 bytes)
        shared, best = max(((sum(shared_ends(k[0], src)), k) for k in kept), key=lambda t: t[0], default=(0, None))
        if shared * 2 < len(src):
            best = None
        tree = parse_from(src, language, None if best is None else best[:2])
        if len(src) >= KEEP_MIN:
            with self._lock:
                self._kept = [k for k in self._kept if k is not best]
                self._kept.insert(0, (src, tree, language))
                while len(self._kept) > KEEP_PARSES or sum(len(k[0]) for k in self._kept) > KEEP_BYTES:
                    self._kept.pop()
        return tree


_RECENT = _Recent()


def _discard(m: dict[str, list[str]], key: str, rel: str) -> None:
    lst = m.get(key)
    if lst is not None and rel in lst:
        lst.remove(rel)
        if not lst:
            del m[key]


def _go_module(root: Path, max_bytes: int) -> str:
    data = read_bytes(root, "go.mod", max_bytes)  # as any file of the root: a FIFO named go.mod must not block here
    for line in (data or b"").decode("utf-8", errors="replace").splitlines():
        if line.startswith("module ") and len(line.split()) > 1:
            return line.split()[1].strip('"')
    return ""
