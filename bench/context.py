"""Cross-file context at call sites, on real packages the project never saw (PyPI sdists unpacked
at benchmark time; never the standard library the embedded pair trained on).

A site is a call `name(` or `x.name(` whose callee is a function or class defined in exactly one
other file of the package (read with Python's `ast`, independently of the tree-sitter index),
cut right after `(` with the rest of that line hidden. Each method fills the same token budget
(the embedded tokenizer) with cross-file context:

- none: today's prompt, one file;
- ring: a llama.vim-style ring buffer of 64-line chunks of recently opened files;
- jaccard: 16-line windows of all other files ranked by Jaccard similarity to the 20 lines
  before the cursor (Copilot/Continue's ranking over the whole workspace);
- ours: `WorkspaceIndex.retrieve` (definitions resolved through imports, then similar windows
  of recent files).

"Recently opened files" (ring, and ours' similar windows) are the same 4 other files per site,
drawn at random with a fixed seed. Recall: the share of sites whose callee's `def`/`class` line
is in the context. Precision: the share of context tokens in snippets that hold the header of a
definition the hidden line uses (its callee and other names defined once elsewhere). Latency:
`retrieve` p50/p95 on each package and on a ≥1 000-file workspace (the packages copied side by
side).

    python bench/context.py [--sdists DIR] [--budget 256 --budget 512] [--sites 200]
"""
from __future__ import annotations

import argparse
import ast
import builtins
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from completer.config import WorkspaceOptions
from completer.workspace import WorkspaceIndex
from completer.workspace.similar import jaccard, query_words, windows

PACKAGES = ("httpx==0.27.2", "rich==13.9.4", "click==8.1.7", "jinja2==3.1.4")
TOKENIZER = Path(__file__).resolve().parents[1] / "draft_models" / "default" / "target" / "tokenizer.json"
RECENT = 4
RING_LINES = 64
# methods of builtin types: `d.get(` says nothing about which definition in the package it calls
BUILTIN_ATTRS = {a for t in (dict, list, str, bytes, set, int, float, object, tuple) for a in dir(t)}
SKIP_PARTS = {"tests", "test", "docs", "doc", "examples", "scripts", "benchmarks"}


def fetch(specs: list[str], sdists: Path | None, into: Path) -> list[Path]:
    """Each package's unpacked source tree (from `sdists` when it holds the tarball)."""
    roots = []
    for spec in specs:
        name, ver = spec.split("==")
        found = [p for d in ([sdists] if sdists else []) for p in d.glob("*.tar.gz")
                 if p.name.lower().replace("_", "-").startswith(f"{name.lower()}-{ver}")]
        if not found:
            dl = into / "sdists"
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec,
                            "-d", str(dl), "-q"], check=True)
            found = [p for p in dl.glob("*.tar.gz") if p.name.lower().startswith(name.lower())]
        with tarfile.open(found[0]) as tf:
            top = tf.getnames()[0].split("/")[0]
            tf.extractall(into, filter="data")
        roots.append(into / top)
    return roots


def ast_defs(root: Path) -> tuple[dict[str, list[tuple[str, int, str]]], dict[str, str]]:
    """name → [(path, 0-based def line, the def line's text)] for module- and class-level functions
    and classes; and path → text."""
    defs: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    texts = {}
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        texts[rel] = text
        lines = text.split("\n")

        def visit(body, _rel=rel, _lines=lines):
            for n in body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defs[n.name].append((_rel, n.lineno - 1, _lines[n.lineno - 1].strip()))
                    if isinstance(n, ast.ClassDef):
                        visit(n.body)
        visit(tree.body)
    return defs, texts


def sites(defs, texts, rng: random.Random, n: int) -> list[dict]:
    out = []
    for rel, text in texts.items():
        if SKIP_PARTS & set(rel.split("/")[:-1]) or rel.split("/")[-1].startswith("test"):
            continue
        tree = ast.parse(text)
        imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for a in node.names}
        starts = [0]
        for ln in text.split("\n"):
            starts.append(starts[-1] + len(ln) + 1)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name):
                name = f.id
                if name not in imported:  # a bare name from the workspace arrives through an import
                    continue
            elif isinstance(f, ast.Attribute):
                name = f.attr
                if name in BUILTIN_ATTRS:
                    continue
            else:
                continue
            where = {p for p, _, _ in defs.get(name, ())}
            if len(where) != 1 or rel in where or name.startswith("__") or name in dir(builtins):
                continue
            line = text.split("\n")[f.end_lineno - 1]
            col = len(line.encode("utf-8")[: f.end_col_offset].decode("utf-8", "ignore"))
            paren = line.find("(", col)
            if paren < 0:
                continue
            cut = starts[f.end_lineno - 1] + paren + 1
            end = starts[f.end_lineno - 1] + len(line)
            out.append({"path": rel, "cut": cut, "end": end, "name": name, "line": line})
    rng.shuffle(out)
    return out[:n]


def used_defs(site, defs, texts) -> tuple[set, set]:
    """(the callee's definitions, every definition the hidden line's names make in one other file)."""
    callee = {(p, t) for p, _, t in defs[site["name"]]}
    used = set(callee)
    for w in set(ast_names(site["line"])):
        where = {p for p, _, _ in defs.get(w, ())}
        if len(where) == 1 and site["path"] not in where:
            used |= {(p, t) for p, _, t in defs[w]}
    return callee, used


def ast_names(line: str) -> list[str]:
    return re.findall(r"[A-Za-z_]\w*", line)


def holds(snippets, wanted: set) -> bool:
    return any((s["path"], ln.strip()) in wanted for s in snippets for ln in s["text"].split("\n"))


# -- baselines -------------------------------------------------------------------------------------------
def fit(chunks, budget: int, count) -> list[dict]:
    out, used = [], 0
    for path, text in chunks:
        t = count(text + "\n")
        if used + t <= budget:
            out.append({"path": path, "text": text, "tokens": t})
            used += t
    return out


def ring(recent: list[str], texts, rng: random.Random, budget: int, count) -> list[dict]:
    chunks = []
    for p in recent:  # llama.vim picks a chunk of each buffer entered (and yanks, saves)
        lines = texts[p].split("\n")
        for _ in range(2):
            s = rng.randrange(max(len(lines) - RING_LINES, 0) + 1)
            chunks.append((p, "\n".join(lines[s:s + RING_LINES])))
    return fit(chunks, budget, count)


def jaccard_all(site, wins_by_file, text, budget: int, count) -> list[dict]:
    q = query_words(text, site["cut"])
    scored = sorted(((-jaccard(q, w.words), p, w.start_line, lines, w) for p, (lines, wins) in wins_by_file.items()
                     if p != site["path"] for w in wins.items), key=lambda t: t[:3])
    return fit([(p, "\n".join(lines[w.start_line:w.end_line + 1])) for _, p, _, lines, w in scored[:64]],
               budget, count)


# -- one package ----------------------------------------------------------------------------------------
def run_package(root: Path, budgets: list[int], n_sites: int, count, seed: int) -> dict:
    defs, texts = ast_defs(root)
    rng = random.Random(seed)
    ss = sites(defs, texts, rng, n_sites)
    wins_by_file = {p: (t.split("\n"), windows(t.split("\n"))) for p, t in texts.items()}
    files = sorted(texts)
    res = {b: defaultdict(lambda: [0, 0, 0]) for b in budgets}  # method → [recalled, useful tokens, tokens]
    times = []
    for b in budgets:
        ix = WorkspaceIndex(root, WorkspaceOptions(), count_tokens=count)
        ix.build()
        for k, site in enumerate(ss):
            srng = random.Random(seed * 7919 + k)
            recent = srng.sample([f for f in files if f != site["path"]], min(RECENT, len(files) - 1))
            text = texts[site["path"]]
            doc = text[: site["cut"]] + text[site["end"]:]
            callee, used = used_defs(site, defs, texts)
            for p in recent:
                ix.update(p, texts[p], recent=True)
            ix.update(site["path"], doc, recent=True)
            t0 = time.perf_counter()
            ours = [s.as_dict() for s in ix.retrieve(site["path"], doc, len(doc[: site["cut"]].encode()), b)]
            times.append((time.perf_counter() - t0) * 1000)
            ix.update(site["path"], text)
            for name, snips in (("none", []), ("ring", ring(recent, texts, srng, b, count)),
                                ("jaccard", jaccard_all(site, wins_by_file, doc, b, count)), ("ours", ours)):
                r = res[b][name]
                r[0] += holds(snips, callee)
                r[1] += sum(s["tokens"] for s in snips if holds([s], used))
                r[2] += sum(s["tokens"] for s in snips)
        ix.close()
    return {"sites": len(ss), "files": len(texts), "res": res, "times": times}


def latency_at_scale(roots: list[Path], into: Path, count, seed: int, target_files: int = 1000) -> tuple[int, list]:
    """Retrieval times on a workspace of ≥ target_files Python files: the packages copied side by
    side (c0/, c1/, …); the sites are each package's, in its first copy."""
    big = into / "big"
    n, copy = 0, 0
    while n < target_files:
        for r in roots:
            shutil.copytree(r, big / f"c{copy}" / r.name, ignore=shutil.ignore_patterns("*.pyc"))
        copy += 1
        n = sum(1 for _ in big.rglob("*.py"))
    ix = WorkspaceIndex(big, WorkspaceOptions(), count_tokens=count)
    ix.build()
    times = []
    for r in roots:
        defs, texts = ast_defs(r)
        files = sorted(texts)
        pre = f"c0/{r.name}/"
        for k, site in enumerate(sites(defs, texts, random.Random(seed), 100)):
            for p in random.Random(k).sample(files, RECENT):
                ix.update(pre + p, texts[p], recent=True)
            text = texts[site["path"]]
            doc = text[: site["cut"]] + text[site["end"]:]
            ix.update(pre + site["path"], doc, recent=True)
            t0 = time.perf_counter()
            ix.retrieve(pre + site["path"], doc, len(doc[: site["cut"]].encode()), 512)
            times.append((time.perf_counter() - t0) * 1000)
            ix.update(pre + site["path"], text)
    return ix.stats()["files"], times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", nargs="+", default=list(PACKAGES))
    ap.add_argument("--sdists", type=Path, help="a directory already holding the sdists (else pip download)")
    ap.add_argument("--budget", type=int, action="append", help="cross-file token budgets (default 256, 512)")
    ap.add_argument("--sites", type=int, default=200, help="call sites per package")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-scale", action="store_true", help="skip the 1 000-file latency run")
    a = ap.parse_args()
    budgets = a.budget or [256, 512]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TOKENIZER))
    count = lambda s: len(tok.encode(s).ids)
    with tempfile.TemporaryDirectory() as tmp:
        roots = fetch(a.packages, a.sdists, Path(tmp))
        total = {b: defaultdict(lambda: [0, 0, 0]) for b in budgets}
        all_sites, all_times = 0, []
        chars = toks = 0
        print(f"{'package':<18}{'files':>6}{'sites':>6}{'budget':>7}  " + "".join(f"{m:>16}" for m in
              ("none", "ring", "jaccard", "ours")) + "   recall (precision)")
        for root in roots:
            r = run_package(root, budgets, a.sites, count, a.seed)
            all_sites += r["sites"]
            all_times += r["times"]
            for f in list(root.rglob("*.py"))[:40]:
                s = f.read_text(encoding="utf-8", errors="replace")
                chars, toks = chars + len(s), toks + count(s)
            for b in budgets:
                cells = []
                for m in ("none", "ring", "jaccard", "ours"):
                    rec, useful, tokens = r["res"][b][m]
                    for i, v in enumerate((rec, useful, tokens)):
                        total[b][m][i] += v
                    cells.append(f"{rec / max(r['sites'], 1):.2f} ({useful / tokens:.2f})" if tokens else
                                 f"{rec / max(r['sites'], 1):.2f} (  - )")
                print(f"{root.name:<18}{r['files']:>6}{r['sites']:>6}{b:>7}  " + "".join(f"{c:>16}" for c in cells))
        for b in budgets:
            cells = [f"{t[0] / all_sites:.2f} ({t[1] / t[2]:.2f})" if t[2] else f"{t[0] / all_sites:.2f} (  - )"
                     for t in (total[b][m] for m in ("none", "ring", "jaccard", "ours"))]
            print(f"{'all':<18}{'':>6}{all_sites:>6}{b:>7}  " + "".join(f"{c:>16}" for c in cells))
        print(f"\nretrieve on these packages: p50 {pct(all_times, .5):.2f} ms, p95 {pct(all_times, .95):.2f} ms "
              f"({len(all_times)} calls)")
        print(f"embedded tokenizer: {chars / max(toks, 1):.2f} characters per token on these sources")
        if not a.no_scale:
            n, times = latency_at_scale(roots, Path(tmp), count, a.seed)
            print(f"retrieve at a {n}-file workspace: p50 {pct(times, .5):.2f} ms, p95 {pct(times, .95):.2f} ms, "
                  f"max {max(times):.2f} ms ({len(times)} calls)")


if __name__ == "__main__":
    main()
