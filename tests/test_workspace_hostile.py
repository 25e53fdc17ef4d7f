"""The workspace index under a hostile repository (issue 35, items 1, 2, 3, 8 and 9), built in a
temp dir: a file link out of the root (its text never reaches a retrieval or a context answer),
links to /dev/zero and FIFOs named by the editor's events (never read, the index goes on
indexing), a root of more files than the walk's bounds (partial, nearest the open files first,
never evicting what it indexed to walk on), nested .gitignore files of many patterns (bounded and
counted) and a file name that is not UTF-8 (one name, completions beside it work). First against
WorkspaceIndex and files.py, then end to end through the real `completer-lsp`."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from helpers.lsp import context_at, did_change_watched, indexed, open_path, start_in, tiny_options
from lsprotocol import types as t
from pytest_lsp import LanguageClient

from completer.config import WorkspaceOptions
from completer.workspace import WorkspaceIndex, files

SECRET = "AKIA-SECRET-never-in-a-prompt"
HELPERS = 'def scale_all(values, factor):\n    """Multiply each value by factor."""\n    return values\n'
MAIN = "from helpers import scale_all\nfrom settings import KEY\n\n\ndef run(xs):\n    ys = scale_all(KEY, \n"


def write(root: Path, files_: dict[str, str]) -> Path:
    for rel, text in files_.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root


def hostile(tmp_path: Path) -> Path:
    """A repository with a link out of its root, links to a device, FIFOs and a name that is not UTF-8."""
    write(tmp_path / "home/.aws", {"credentials.py": f'KEY = "{SECRET}"\n\n\ndef leak():\n    """{SECRET}"""\n'})
    root = write(tmp_path / "repo", {"helpers.py": HELPERS, "main.py": MAIN, "pyproject.toml": "",
                                     "pkg/util.py": "def inside():\n    pass\n"})
    (root / "settings.py").symlink_to("../home/.aws/credentials.py")  # git stores such links
    (root / "pkg" / "creds").symlink_to(tmp_path / "home" / ".aws")   # a directory link out
    (root / "alias.py").symlink_to("pkg/util.py")                     # inside to inside: fine
    (root / "zero.py").symlink_to("/dev/zero")
    os.mkfifo(root / "pipe.py")
    os.mkfifo(root / "go.mod")  # read when the index starts: it must not block there
    fd = os.open(os.path.join(os.fsencode(root), b"mod\xff.py"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"def odd():\n    pass\n")
    os.close(fd)
    return root


def texts(snips) -> str:
    return "\n".join(s.text for s in snips)


# -- reads outside the root, non-regular files ---------------------------------------------------------------
def test_a_link_out_of_the_root_is_never_read(tmp_path):
    root = hostile(tmp_path)
    ix = WorkspaceIndex(root)
    ix.build()
    assert sorted(ix._outlines) == ["alias.py", "helpers.py", "main.py", "pkg/util.py"]
    cursor = MAIN.index("KEY, ") + 3
    assert SECRET not in texts(ix.retrieve("main.py", MAIN, cursor, 2000))
    assert "helpers.py" in {s.path for s in ix.retrieve("main.py", MAIN, cursor, 2000)}
    # every other way a path reaches the index: a watched-file event, didSave, didOpen (the
    # editor's text of the link), a completion in it (indexed on first use), didClose
    secret_text = (tmp_path / "home/.aws/credentials.py").read_text()
    for path in (root / "settings.py", root / "pkg/creds/credentials.py"):
        assert not ix.update(path)
        assert not ix.update(path, secret_text, recent=True)
        assert ix.retrieve(path, secret_text, 5, 2000) == []
        ix.closed(path)
    assert "settings.py" not in ix._outlines and not ix._recent
    assert SECRET not in texts(ix.retrieve("main.py", MAIN, cursor, 2000))
    # a file indexed before it became a link out of the root leaves the index at the event
    (root / "helpers.py").unlink()
    (root / "helpers.py").symlink_to(tmp_path / "home/.aws/credentials.py")
    assert not ix.update(root / "helpers.py") and "helpers.py" not in ix._outlines


def test_non_regular_files_are_never_opened_for_reading(tmp_path):
    root = hostile(tmp_path)
    assert files.read_bytes(Path("/"), "dev/zero", 100) is None  # a device inside the root (`/`)
    assert files.read_bytes(root, "pipe.py", 100) is None         # would block in open() without O_NONBLOCK
    assert files.read_bytes(root, "zero.py", 100) is None         # out of the root
    (root / "big.py").write_bytes(b"x" * 10_000)
    assert len(files.read_bytes(root, "big.py", 100)) == 101      # never more than the cap + 1
    ix = WorkspaceIndex(root)  # go.mod is a FIFO: the constructor does not block on it
    ix.start()
    for name in ("pipe.py", "zero.py", "go.mod"):
        ix.update(root / name)  # watched-file events, applied on the builder thread
    (root / "later.py").write_text("def later():\n    pass\n")
    ix.update(root / "later.py")
    assert ix.wait_idle(60)
    assert "later.py" in ix._outlines and not {"pipe.py", "zero.py"} & set(ix._outlines)
    ix.close()


# -- a root larger than the walk's bounds ----------------------------------------------------------------
def many(root: Path, n: int, defs: int = 2) -> Path:
    """`n` modules under bulk/, a shallow file, and an open file four directories down with a sibling."""
    body = "".join(f"def f{j}(a, b, c):\n    pass\n" for j in range(defs))
    return write(root, {"top.py": "def top():\n    pass\n", "deep/a/b/c/near.py": "from sib import s\ns(",
                        "deep/a/b/c/sib.py": "def s():\n    pass\n", "deep/a/b/up.py": "def up():\n    pass\n",
                        **{f"bulk/m{i:03}.py": body for i in range(n)}})


def test_more_files_than_the_bound_nearest_the_open_file_first(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_WALK_FILES", 10)
    root = many(tmp_path, 40)
    ix = WorkspaceIndex(root)
    ix.update("deep/a/b/c/near.py", "from sib import s\ns(", recent=True)  # open before the walk lists anything
    ix.build()
    st = ix.stats()
    assert {"deep/a/b/c/sib.py", "deep/a/b/up.py", "top.py"} <= set(ix._outlines)
    assert st["files"] == 10 and st["complete"] and not st["full"]
    assert st["partial"].startswith("partial: 10 of at least ") and "at most 10 files" in st["partial"]
    assert st["found"] >= 40


def test_more_entries_than_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_WALK_ENTRIES", 12)  # directory entries, files or not
    ix = WorkspaceIndex(many(tmp_path, 40))
    ix.build()
    st = ix.stats()
    assert st["complete"] and 0 < st["files"] < 12 and "at most 12 directory entries" in st["partial"]
    assert "top.py" in ix._outlines


def test_the_memory_bound_stops_the_walk_without_evicting_what_it_indexed(tmp_path):
    root = many(tmp_path, 200, defs=40)
    ix = WorkspaceIndex(root, WorkspaceOptions(index_memory_mb=1))
    ix.build()
    st = ix.stats()
    assert st["full"] and st["bytes"] <= 2**20 and 0 < st["files"] < 200
    assert "top.py" in ix._outlines  # the shallow file the walk meant to keep, not evicted for deeper ones
    walked = sorted(r for r in ix._outlines if r.startswith("bulk/"))
    assert walked == [f"bulk/m{i:03}.py" for i in range(len(walked))]  # a prefix of the walk, nothing evicted
    assert st["partial"].startswith(f"partial: {st['files']} of at least ") and "index_memory_mb 1" in st["partial"]


def test_a_home_directory_is_indexed_partially(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "BROAD_ROOT_FILES", 4)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert files.Walk(Path("/"), 1000).max_files == 4 and files.Walk(Path("/"), 1000).broad
    root = many(tmp_path, 20)
    ix = WorkspaceIndex(root)
    ix.update(root / "deep/a/b/c/near.py", "from sib import s\ns(")
    ix.build()
    st = ix.stats()
    assert {"deep/a/b/c/near.py", "deep/a/b/c/sib.py", "deep/a/b/up.py"} <= set(ix._outlines)
    assert st["files"] == 4 and "under / or a home directory" in st["partial"]


# -- .gitignore files of many patterns ---------------------------------------------------------------------
def test_nested_ignores_are_bounded_and_counted(tmp_path):
    patterns = "".join(f"gen_{i}.py\n" for i in range(100_000))  # 1.2 MB
    d = tmp_path
    for depth in range(12):
        write(d, {".gitignore": "ignored_first.py\n" + patterns, "gen_5.py": "x = 1\n",
                  "ignored_first.py": "x = 1\n", "kept.py": "def kept():\n    pass\n"})
        d = d / f"d{depth}"
    write(d, {"kept.py": "def kept():\n    pass\n"})
    os.mkfifo(d / ".gitignore")  # never opened for reading (it would block)
    ix = WorkspaceIndex(tmp_path)
    ix.build()
    st = ix.stats()
    assert st["ignore_patterns"] == files.MAX_WALK_IGNORE_PATTERNS and st["ignores_cut"] == 12
    # the first patterns of each file apply; each directory's kept.py is indexed
    assert sorted(r.rsplit("/", 1)[-1] for r in ix._outlines) == ["kept.py"] * 13


# -- a name that is not UTF-8 --------------------------------------------------------------------------------
def test_a_name_that_is_not_utf8_is_skipped_and_completions_beside_it_work(tmp_path):
    root = hostile(tmp_path)
    ix = WorkspaceIndex(root)
    ix.build()
    assert ix.stats()["skipped_names"] == 1 and all(r.encode() for r in ix._outlines)
    assert not ix.update(os.fsdecode(os.path.join(os.fsencode(root), b"mod\xff.py")))  # the walk's spelling
    # the editor's spelling (file:///…/mod%FF.py decodes to U+FFFD): one name, from its live text
    odd = "from helpers import scale_all\nscale_all("
    assert ix.update(root / "mod\ufffd.py", odd, recent=True)
    assert [s.path for s in ix.retrieve(root / "mod\ufffd.py", odd, len(odd), 500)] == ["helpers.py"]
    assert "helpers.py" in {s.path for s in ix.retrieve("main.py", MAIN, MAIN.index("KEY, ") + 3, 2000)}


# -- end to end: the real completer-lsp ------------------------------------------------------------------
def _nested_ignores(root: Path, depth: int = 12) -> None:
    """`depth` nested .gitignore files of 100 000 patterns each (issue 35: RSS 426 → 1 033 MB)."""
    patterns = "".join(f"gen_{i}.py\n" for i in range(100_000))
    d = root / "ign"
    for i in range(depth):
        write(d, {".gitignore": patterns, "gen_7.py": "x = 1\n", "kept.py": "def kept():\n    pass\n"})
        d = d / f"d{i}"


async def _paths(lsp: LanguageClient, path: Path, line: int, ch: int) -> set[str]:
    return {c.path for c in await context_at(lsp, path.as_uri(), line, ch)}


@pytest.mark.slow
@pytest.mark.asyncio
async def test_lsp_a_hostile_repository(client: LanguageClient, tiny_pair, tmp_path):
    root = hostile(tmp_path)
    _nested_ignores(root)
    await start_in(client, root, tiny_options(tiny_pair))
    ws = (await indexed(client)).workspace
    assert (ws.files, ws.skipped_names, ws.ignores_cut) == (16, 1, 12)  # 4 files and 12 kept.py
    assert ws.ignore_patterns == files.MAX_WALK_IGNORE_PATTERNS and ws.partial is None

    main, line, ch = root / "main.py", 5, len("    ys = scale_all(KEY, ")
    open_path(client, main, MAIN)
    assert "helpers.py" in await _paths(client, main, line, ch)
    # the link out of the root through each way a path reaches the index: the editor opens it
    # (with the secret as its text), saves it, a watcher reports it
    settings = root / "settings.py"
    open_path(client, settings, (tmp_path / "home/.aws/credentials.py").read_text())
    client.text_document_did_save(t.DidSaveTextDocumentParams(t.TextDocumentIdentifier(uri=settings.as_uri())))
    # a device and FIFOs named by events and saves: never opened for reading, the index goes on
    client.text_document_did_save(t.DidSaveTextDocumentParams(t.TextDocumentIdentifier(uri=(root / "pipe.py").as_uri())))
    did_change_watched(client, *((root / n, t.FileChangeType.Changed) for n in ("settings.py", "zero.py", "pipe.py")))
    (root / "later.py").write_text("def later():\n    pass\n")
    did_change_watched(client, (root / "later.py", t.FileChangeType.Created))
    for _ in range(200):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.workspace.files == 17:
            break
        await asyncio.sleep(0.05)
    assert stats.workspace.files == 17 and stats.files_changed == 6
    got = await _paths(client, main, line, ch)
    assert "helpers.py" in got and "settings.py" not in got
    assert await context_at(client, settings.as_uri(), 0, 3) is not None  # its own completions go on

    # the name that is not UTF-8, as an editor spells it (%FF decodes to U+FFFD): its context answers
    odd = "from helpers import scale_all\nscale_all("
    odd_uri = root.as_uri() + "/mod%FF.py"
    client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=t.TextDocumentItem(
        uri=odd_uri, language_id="python", version=1, text=odd)))
    assert "helpers.py" in {c.path for c in await context_at(client, odd_uri, 1, 10)}
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.workspace.files == 18 and getattr(stats, "engine_exceptions", 0) == 0


@pytest.mark.slow
@pytest.mark.asyncio
async def test_lsp_a_partial_index_keeps_the_files_near_the_open_one(client: LanguageClient, tiny_pair,
                                                                     tmp_path):
    root = many(tmp_path, 200, defs=40)
    await start_in(client, root, tiny_options(tiny_pair, index_memory_mb=1))
    ws = (await indexed(client)).workspace
    assert ws.full and ws.partial.startswith(f"partial: {ws.files} of at least ")
    near, text = root / "deep/a/b/c/near.py", "from sib import s\ns("
    open_path(client, near, text)  # after the walk: it ended breadth-first in bulk/, far from here
    assert "deep/a/b/c/sib.py" not in await _paths(client, near, 1, 2)
    # a rebuild starts from the open file: its directory and its parents' first
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"index_memory_mb": 1.5}}))
    stats = await indexed(client)
    assert stats.index_rebuilds == 1 and stats.workspace.full and stats.workspace.partial.startswith("partial: ")
    assert "deep/a/b/c/sib.py" in await _paths(client, near, 1, 2)
