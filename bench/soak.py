"""A long day of typing, and the three hostile cases of issue 35, through the real servers.

  typing     a scripted typing session of `--minutes` (8 keys/s) at the end of a ≥100 KB file
             inside a real workspace, through a `completer-lsp` subprocess (LSP over stdio, the
             embedded pair): the server's RSS is sampled every second and the growth per minute
             after `--warmup-s` printed (a least-squares slope over the samples)
  star       500 modules each star-importing the next `--star-k`: a `completer/context` in a file
             importing a name none of them defines, while a second document is edited and asked
             `completer/documentInfo` every 20 ms: the context's time and the worst wait of the
             other document's requests
  many       one didChange of `--changes` changes (a replace-all) on a 1.2 MB document, the same
             other-document probe beside it
  next_edit  `completer serve`'s next_edit with `before` and `text` of `--lines` identical lines,
             two such frames on two connections and a completion on a third: the next edits'
             times and the completion's

Timings move with the machine and whatever else runs on it: compare runs made one after the
other on the same machine, and name the CPU.

    python bench/soak.py [--minutes 1] [--cases typing,star,many,next_edit]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from keystrokes import LspClient  # bench/, the script's directory
from record import machine

CASES = ("typing", "star", "many", "next_edit")
TYPED = "    total = compute(values, factor) + offset\n"  # the line typed again and again
PROBE_S = 0.02  # the other document's requests: one every 20 ms


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def slope_per_min(samples: list[tuple[float, float]]) -> float:
    """MB per minute: the least-squares slope of (seconds, MB)."""
    if len(samples) < 2:
        return float("nan")
    ts, ys = [s for s, _ in samples], [m for _, m in samples]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else float("nan")


def big_module(target_bytes: int, seed: str = "") -> str:
    """Plausible Python of about `target_bytes`: classes, methods, docstrings."""
    parts, i = ['"""A large module (bench/soak.py)."""\nimport os\n\n'], 0
    while sum(map(len, parts)) < target_bytes:
        parts.append(f'''
class Handler{seed}{i}:
    """Handles records of kind {i}."""

    def __init__(self, path, limit={i}):
        self.path = path
        self.limit = limit
        self.seen = []

    def feed(self, record):
        if len(self.seen) >= self.limit:
            return None
        self.seen.append(record)
        return os.path.join(self.path, str(record))


def compute_{i}(values, factor):
    return [v * factor + {i} for v in values]
''')
        i += 1
    return "".join(parts)


# -- the language server ---------------------------------------------------------------------------
def start_lsp(root: Path, opts: dict) -> LspClient:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    lsp = LspClient([sys.executable, "-m", "lsp.server"], env)
    lsp.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(), "capabilities": {},
                               "workspaceFolders": [{"uri": root.as_uri(), "name": root.name}],
                               "initializationOptions": {"debounce_ms": 0, "device": "cpu", **opts}})
    lsp.notify("initialized", {})
    for _ in range(3000):
        st = lsp.request("completer/stats", {}).get("result") or {}
        ws = st.get("workspace") or {}
        if str(st.get("engine")).startswith(("ready", "failed")) and ws.get("complete"):
            return lsp
        time.sleep(0.1)
    raise SystemExit("the language server never got ready")


def open_doc(lsp: LspClient, path: Path, text: str) -> str:
    uri = path.as_uri()
    lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                         "text": text}})
    return uri


class Probe:
    """Edits `uri` and asks its documentInfo every PROBE_S from a thread: the worst wait."""

    def __init__(self, lsp: LspClient, uri: str):
        self.lsp, self.uri, self.waits, self.stop = lsp, uri, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        v = 1
        while not self.stop.is_set():
            v += 1
            t0 = time.perf_counter()
            self.lsp.notify("textDocument/didChange", {"textDocument": {"uri": self.uri, "version": v},
                                                       "contentChanges": [{"range": {"start": {"line": 0, "character": 0},
                                                                                     "end": {"line": 0, "character": 0}},
                                                                           "text": "#"}]})
            self.lsp.request("completer/documentInfo", {"uri": self.uri})
            self.waits.append(time.perf_counter() - t0)
            time.sleep(PROBE_S)

    def worst_ms(self) -> float:
        self.stop.set()
        self.thread.join()
        return max(self.waits, default=float("nan")) * 1e3


def case_typing(a, root: Path) -> dict:
    big = root / "pkg" / "big.py"
    text = big.read_text()
    lsp = start_lsp(root, {})
    try:
        uri = open_doc(lsp, big, text)
        line, col, v = text.count("\n"), 0, 1
        samples, t0, typed, next_key = [], time.perf_counter(), 0, time.perf_counter()
        end = t0 + a.minutes * 60
        while time.perf_counter() < end:
            ch = TYPED[typed % len(TYPED)]
            v += 1
            pos = {"line": line, "character": col}
            lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": v},
                                                  "contentChanges": [{"range": {"start": pos, "end": pos}, "text": ch}]})
            typed += 1
            line, col = (line + 1, 0) if ch == "\n" else (line, col + 1)
            if ch == "\n":  # what a completion would show at the new line: the index's retrieval
                lsp.request("completer/context", {"textDocument": {"uri": uri},
                                                  "position": {"line": line, "character": 0}})
            now = time.perf_counter()
            if not samples or now - t0 - samples[-1][0] >= 1.0:
                samples.append((now - t0, rss_mb(lsp.p.pid)))
            next_key += 1 / a.keys_per_s
            time.sleep(max(0.0, next_key - time.perf_counter()))
        lsp.request("completer/documentInfo", {"uri": uri})  # every change applied
        samples.append((time.perf_counter() - t0, rss_mb(lsp.p.pid)))
    finally:
        lsp.close()
    after = [s for s in samples if s[0] >= a.warmup_s]
    return {"keys": typed, "file_kb": round(len(text.encode()) / 1024), "rss_start_mb": round(samples[0][1], 1),
            "rss_warm_mb": round(after[0][1], 1) if after else None, "rss_end_mb": round(samples[-1][1], 1),
            "growth_mb_per_min": round(slope_per_min(after), 2)}


def case_star(a, root: Path) -> dict:
    lsp = start_lsp(root, {})
    try:
        use = open_doc(lsp, root / "use.py", (root / "use.py").read_text())
        other = open_doc(lsp, root / "other.py", "x = 1\n")
        lsp.request("completer/documentInfo", {"uri": other})
        probe = Probe(lsp, other)
        time.sleep(0.2)
        t0 = time.perf_counter()
        lsp.request("completer/context", {"textDocument": {"uri": use}, "position": {"line": 2, "character": 8}})
        context_s = time.perf_counter() - t0
        time.sleep(0.2)
        worst = probe.worst_ms()
    finally:
        lsp.close()
    return {"k": a.star_k, "context_s": round(context_s, 3), "other_doc_worst_ms": round(worst, 1)}


def case_many(a, root: Path) -> dict:
    text = big_module(1_200_000, "M")
    lsp = start_lsp(root, {})
    try:
        uri = open_doc(lsp, root / "many.py", text)
        other = open_doc(lsp, root / "other.py", "x = 1\n")
        lsp.request("completer/documentInfo", {"uri": uri})
        # a replace-all of `limit` → `bound` from the last place to the first (earlier places keep their positions)
        lines, changes = text.split("\n"), []
        for ln in range(len(lines) - 1, -1, -1):
            c = lines[ln].rfind("limit")
            while c >= 0 and len(changes) < a.changes:
                changes.append({"range": {"start": {"line": ln, "character": c},
                                          "end": {"line": ln, "character": c + 5}}, "text": "bound"})
                c = lines[ln].rfind("limit", 0, c)
            if len(changes) >= a.changes:
                break
        probe = Probe(lsp, other)
        time.sleep(0.2)
        t0 = time.perf_counter()
        lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": changes})
        lsp.request("completer/documentInfo", {"uri": uri})
        applied_s = time.perf_counter() - t0
        time.sleep(0.2)
        worst = probe.worst_ms()
    finally:
        lsp.close()
    return {"changes": len(changes), "doc_mb": round(len(text) / 1e6, 2), "applied_s": round(applied_s, 3),
            "other_doc_worst_ms": round(worst, 1)}


# -- completer serve ------------------------------------------------------------------------------
def case_next_edit(a) -> dict:
    import msgpack
    from websockets.asyncio.client import connect

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--port", "0", "--device", "cpu",
                          "--max-frame-bytes", str(1 << 20)], stderr=subprocess.PIPE, text=True, env=env)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on ws://[^:]+:(\d+)/ws", line)
        port = int(m.group(1)) if m else port
        if "models ready" in line or "error" in line:
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    text = "value = compute(value)\n" * a.lines

    async def ask(frame: dict) -> tuple[dict, float]:
        async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
            t0 = time.perf_counter()
            await ws.send(msgpack.packb(frame))
            while True:
                r = msgpack.unpackb(await ws.recv())
                if r.get("type") != "chunk":
                    return r, time.perf_counter() - t0

    async def run() -> dict:
        edit = {"type": "next_edit", "text": text, "before": text, "line": 0, "col": 0, "path": "same.py",
                "language": "python"}
        alone, alone_s = await ask({**edit, "id": 1})
        comp = {"type": "complete", "id": 9, "doc": "c.py", "prefix": "def add(a, b):\n    return ", "suffix": "\n",
                "max_new_tokens": 8}
        _, comp_alone_s = await ask(comp)
        two = [asyncio.create_task(ask({**edit, "id": i})) for i in (2, 3)]
        await asyncio.sleep(0.3)  # both frames are in
        comp_r, comp_s = await ask(comp)
        both = await asyncio.gather(*two)
        return {"lines": a.lines, "frame_kb": round(len(text.encode()) / 1024), "next_edit_s": round(alone_s, 3),
                "next_edit_reason": alone.get("reason") or alone.get("code"),
                "completion_alone_s": round(comp_alone_s, 3),
                "completion_beside_two_next_edits_s": round(comp_s, 3), "completion": comp_r.get("type"),
                "two_next_edits_s": [round(s, 3) for _, s in both]}

    try:
        return asyncio.run(run())
    finally:
        p.terminate()
        p.wait(timeout=30)


# -- workspaces --------------------------------------------------------------------------------------
def workspace(root: Path, k: int) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text("def compute(values, factor):\n    return [v * factor for v in values]\n")
    (root / "pkg" / "big.py").write_text(big_module(120_000) + "\n\ndef typed_here(values, factor, offset):\n")
    (root / "star").mkdir()
    (root / "star" / "__init__.py").write_text("")
    n = 500
    for i in range(n):
        stars = "".join(f"from .m{j} import *\n" for j in range(i + 1, min(i + 1 + k, n)))
        (root / "star" / f"m{i}.py").write_text(f"{stars}\n\ndef f{i}(x):\n    return x + {i}\n")
    (root / "use.py").write_text("from star.m0 import nowhere\n\nnowhere(")
    (root / "other.py").write_text("x = 1\n")
    return root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=1.0, help="the typing session's length")
    ap.add_argument("--warmup-s", type=float, default=15.0, help="seconds of typing before the growth is measured")
    ap.add_argument("--keys-per-s", type=float, default=8.0)
    ap.add_argument("--star-k", type=int, default=8, help="star imports per module (issue 35: k 8 took 7-8 s)")
    ap.add_argument("--changes", type=int, default=2000, help="changes in the one didChange")
    ap.add_argument("--lines", type=int, default=10_000, help="identical lines of the next_edit frames")
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    cases = a.cases.split(",")
    print(f"# CPU: {machine()} (at the start)", flush=True)
    with tempfile.TemporaryDirectory(prefix="soak_") as tmp:
        root = workspace(Path(tmp) / "ws", a.star_k)
        for case in cases:
            if case == "typing":
                r = case_typing(a, root)
                print(f"typing: {r['keys']} keys in {a.minutes:g} min at the end of a {r['file_kb']} KB file; RSS "
                      f"{r['rss_start_mb']} → {r['rss_warm_mb']} (after {a.warmup_s:g} s) → {r['rss_end_mb']} MB; "
                      f"growth after warm-up {r['growth_mb_per_min']} MB/min", flush=True)
            elif case == "star":
                r = case_star(a, root)
                print(f"star (k {r['k']}): context {r['context_s']} s; another document's worst wait "
                      f"{r['other_doc_worst_ms']} ms", flush=True)
            elif case == "many":
                r = case_many(a, root)
                print(f"many: {r['changes']} changes in one didChange on a {r['doc_mb']} MB document applied in "
                      f"{r['applied_s']} s; another document's worst wait {r['other_doc_worst_ms']} ms", flush=True)
            elif case == "next_edit":
                r = case_next_edit(a)
                print(f"next_edit: {r['lines']} identical lines ({r['frame_kb']} KB) {r['next_edit_s']} s "
                      f"({r['next_edit_reason']}); a completion alone {r['completion_alone_s']} s, beside two such "
                      f"next edits {r['completion_beside_two_next_edits_s']} s ({r['completion']}); the two next edits "
                      f"{r['two_next_edits_s']} s", flush=True)
            else:
                raise SystemExit(f"unknown case {case!r}: {', '.join(CASES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
