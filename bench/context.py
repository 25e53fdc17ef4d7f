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

`--lsp`: the same sites typed through the real language server (`python -m lsp.server`, stdio,
rootUri = the unpacked package), cross_file on and off (initializationOptions): the site's line
emptied to its indent, typed back one character at a time with an inline completion after each.
Per keystroke, completer/stats' engine counters give the prompt tokens the request prefilled
(and the warmups meanwhile); completer/context the cross-file snippets. Once at the server's
max_new_tokens (KV reuse, end-to-end latency), once at max_new_tokens 1 (end to end = TTFT).
`--exact`: at sites whose call closes on its line, the rest of the line completed by the
pipeline in process on the embedded pair, with and without the index: exact match and edit
similarity (bench/holes.py's rule), and whether the callee's definition was in the prompt.

    python bench/context.py [--sdists DIR] [--budget 256 --budget 512] [--sites 200]
    python bench/context.py --lsp [--sites 2] [--max-new N]
    python bench/context.py --exact [--sites 100]
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from heldout import (  # bench/, the script's directory (next_edit.py takes them from here too)
    PACKAGES,
    SKIP_PARTS,
    fetch,
)
from keystrokes import LspClient
from record import machine

from completer.config import WorkspaceOptions
from completer.workspace import WorkspaceIndex
from completer.workspace.similar import jaccard, query_words, windows

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "draft_models" / "default" / "target" / "tokenizer.json"
RECENT = 4
RING_LINES = 64
# methods of builtin types: `d.get(` says nothing about which definition in the package it calls
BUILTIN_ATTRS = {a for t in (dict, list, str, bytes, set, int, float, object, tuple) for a in dir(t)}


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
            out.append({"path": rel, "cut": cut, "end": end, "name": name, "line": line,
                        "one_line": node.end_lineno == f.end_lineno})  # the call closes on its line
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


def open_site(ix: WorkspaceIndex, site: dict, texts: dict, files: list[str], srng: random.Random):
    """(the recently opened other files, the cursor file's text with the rest of the site's line
    hidden), both given to the index as the editor would (the recent ones first)."""
    recent = srng.sample([f for f in files if f != site["path"]], min(RECENT, len(files) - 1))
    text = texts[site["path"]]
    doc = text[: site["cut"]] + text[site["end"]:]
    for p in recent:
        ix.update(p, texts[p], recent=True)
    ix.update(site["path"], doc, recent=True)
    return recent, doc


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
            recent, doc = open_site(ix, site, texts, files, srng)
            callee, used = used_defs(site, defs, texts)
            t0 = time.perf_counter()
            ours = [s.as_dict() for s in ix.retrieve(site["path"], doc, site["cut"], b)]
            times.append((time.perf_counter() - t0) * 1000)
            ix.update(site["path"], texts[site["path"]])
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
            ix.retrieve(pre + site["path"], doc, site["cut"], 512)
            times.append((time.perf_counter() - t0) * 1000)
            ix.update(pre + site["path"], text)
    return ix.stats()["files"], times


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


# -- typing a call site through the language server (--lsp) --------------------------------------------
CROSS = ("definition", "similar")  # the kinds of the prompt's entries that come from other files (pipeline.Entry)
COUNTED = ("requests", "prefill_tokens", "tokens_reused", "warmup_tokens", "type_through")  # engine_stats counters


def typed_line(text: str, site: dict) -> tuple[int, str, str]:
    """(the site's 0-based line, its indent, the rest of it: what the user types)."""
    i = text.count("\n", 0, site["cut"])
    line = text.split("\n")[i]
    indent = line[: len(line) - len(line.lstrip())]
    return i, indent, line[len(indent):]


def utf16(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def server_ready(lsp, timeout: float = 600) -> dict:
    """completer/stats once the engine is loaded and the workspace walk is done."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = lsp.request("completer/stats", {}).get("result") or {}
        if str(st.get("engine")).startswith("failed"):
            raise SystemExit(f"the language server's engine failed: {st['engine']}")
        if st.get("engine") == "ready" and (st.get("workspace") or {}).get("complete"):
            return st
        time.sleep(0.2)
    raise SystemExit("the language server was not ready (engine loaded, workspace indexed) in time")


def type_sites(root: Path, ss: list[dict], texts: dict, opts: dict, threads: int) -> list[dict]:
    """One `completer-lsp` (stdio) with rootUri = `root` and `opts` as initializationOptions. Per
    site: its file opened with the site's line emptied to its indent, the line typed back one
    character at a time, an inline completion requested after each; completer/stats after each
    request gives what the engine computed (counters' deltas: warmups that ran meanwhile land in
    the keystroke they finished in) and completer/context the cross-file snippets the prompt held."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    lsp = LspClient([sys.executable, "-m", "lsp.server"], env)
    rows = []
    try:
        lsp.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(), "capabilities": {},
                                   "initializationOptions": opts})
        lsp.notify("initialized", {})
        server_ready(lsp)
        for k, site in enumerate(ss):
            text = texts[site["path"]]
            ln, indent, typed = typed_line(text, site)
            lines = text.split("\n")
            lines[ln] = indent
            uri = (root / site["path"]).as_uri()
            lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                 "text": "\n".join(lines)}})
            before = lsp.request("completer/stats", {})["result"]["engine_stats"]
            col, last = utf16(indent), None
            for i, ch in enumerate(typed):
                pos = {"line": ln, "character": col}
                lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": i + 2},
                                                      "contentChanges": [{"range": {"start": pos, "end": pos},
                                                                          "text": ch}]})
                col += utf16(ch)
                at = {"textDocument": {"uri": uri}, "position": {"line": ln, "character": col}}
                t0 = time.perf_counter()
                r = lsp.request("textDocument/inlineCompletion", {**at, "context": {"triggerKind": 2}})
                ms = (time.perf_counter() - t0) * 1e3
                after = lsp.request("completer/stats", {})["result"]["engine_stats"]
                ctx = (lsp.request("completer/context", at).get("result") or {}).get("context") or []
                cross = [(c["path"], c["start_line"], c["end_line"], c["tokens"]) for c in ctx if c["kind"] in CROSS]
                rows.append({"package": root.name, "site": k, "char": i, "e2e_ms": ms,
                             "shown": bool((r.get("result") or {}).get("items")),
                             **{c: after.get(c, 0) - before.get(c, 0) for c in COUNTED},
                             "cross_tokens": sum(c[3] for c in cross), "cross_changed": last is not None and cross != last})
                before, last = after, cross
            lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    finally:
        lsp.close()
    return rows


def typing_summary(rows: list[dict]) -> dict:
    """Keystrokes after each site's first (that one prefills the whole prompt: `cold`), over those
    that reached the engine (not gated; a type-through counts 0): `recomputed`, prompt tokens the
    request prefilled; `le32`, the share that recomputed at most 32; `with_warmups`, plus the
    tokens of warmups that ended meanwhile; `e2e`: end-to-end ms of the requests the model
    answered (not type-through)."""
    warm = [r for r in rows if r["char"] > 0]
    reached = [r for r in warm if r["requests"]]
    model = [r for r in reached if not r["type_through"]]
    e2e = [r["e2e_ms"] for r in model]
    return {"keystrokes": len(rows), "reached": len(reached), "type_through": sum(bool(r["type_through"]) for r in warm),
            "cold": statistics.median([r["prefill_tokens"] for r in rows if r["char"] == 0 and r["requests"]] or [0]),
            "prompt": statistics.median([r["prefill_tokens"] + r["tokens_reused"] for r in model] or [0]),
            "recomputed": [pct([r["prefill_tokens"] for r in reached], q) for q in (.5, .9)],
            "le32": sum(r["prefill_tokens"] <= 32 for r in reached) / max(len(reached), 1),
            "with_warmups": [pct([r["prefill_tokens"] + r["warmup_tokens"] for r in reached], q) for q in (.5, .9)],
            "e2e": [pct(e2e, q) for q in (.5, .9)], "shown": sum(r["shown"] for r in warm) / max(len(warm), 1),
            "cross_tokens": statistics.fmean([r["cross_tokens"] for r in rows] or [0]),
            "cross_changed": sum(r["cross_changed"] for r in rows)}


def typing(a, roots: list[Path]) -> dict:
    """Each package's sites typed through the language server with cross-file context on and off,
    at the server's max_new_tokens (what a user gets: KV reuse, latency) and at 1 (end to end =
    time to the first token). On and off take turns, so a change in the machine's load hits both."""
    rows = []
    for root in roots:
        defs, texts = ast_defs(root)
        ss = sites(defs, texts, random.Random(a.seed), a.sites or 2)
        for run, max_new in (("typing", a.max_new), ("ttft", 1)):
            for cross in (True, False):
                opts = {"debounce_ms": 0, "cross_file": cross, **({"max_new_tokens": max_new} if max_new else {})}
                t0 = time.perf_counter()
                got = type_sites(root, ss, texts, opts, a.threads)
                rows += [{**r, "run": run, "cross_file": cross} for r in got]
                print(f"  {root.name}: {run} cross_file={cross}: {len(got)} keystrokes, "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    summary = {f"{run} {'on' if cross else 'off'}": typing_summary([r for r in rows if r["run"] == run
                                                                    and r["cross_file"] == cross])
               for run in ("typing", "ttft") for cross in (True, False)}
    return {"sites": len(rows and {(r["package"], r["site"]) for r in rows}), "summary": summary, "rows": rows}


def print_typing(res: dict) -> None:
    s = res["summary"]
    print(f"{res['sites']} call sites typed through completer-lsp, a request per keystroke; keystrokes after "
          f"each site's first")
    print(f"{'run':<13}{'keys':>6}{'engine':>7}{'t-thru':>7}{'cold':>6}{'prompt':>7}{'recomputed p50/p90':>20}"
          f"{'<=32':>6}{'+warmups p50/p90':>18}{'e2e ms p50/p90':>16}{'shown':>7}{'x-file tok':>11}"
          f"{'x-file changed':>15}")
    for name, v in s.items():
        print(f"{name:<13}{v['keystrokes']:>6}{v['reached']:>7}{v['type_through']:>7}{v['cold']:>6.0f}{v['prompt']:>7.0f}"
              f"{v['recomputed'][0]:>12.0f}/{v['recomputed'][1]:<7.0f}{v['le32']:>6.0%}{v['with_warmups'][0]:>10.0f}/"
              f"{v['with_warmups'][1]:<7.0f}{v['e2e'][0]:>8.1f}/{v['e2e'][1]:<7.1f}{v['shown']:>7.0%}"
              f"{v['cross_tokens']:>11.0f}{v['cross_changed']:>15}")
    for run, what in (("typing", "end to end"), ("ttft", "TTFT (max_new_tokens 1, end to end)")):
        on, off = s[f"{run} on"]["e2e"], s[f"{run} off"]["e2e"]
        print(f"{what} with / without context: p50 {on[0] / off[0]:.2f}x, p90 {on[1] / off[1]:.2f}x")


# -- exact match at call sites on the embedded pair (--exact) -------------------------------------------
def callee_in(context: list[dict], defs_of: list[tuple[str, int, str]]) -> bool:
    """Whether a snippet of `context` spans one of the callee's definition lines."""
    return any(c["path"] == p and c["start_line"] <= line <= c["end_line"] for c in context for p, line, _ in defs_of)


def exact(a, roots: list[Path]) -> dict:
    """At call sites that close on their line, cut right after `name(`: the rest of the line the
    pipeline completes (in process, the embedded pair, greedy) without and with the workspace
    index, scored by bench/holes.py's rule (exact = the same text up to trailing space)."""
    import torch
    from holes import score  # bench/holes.py: what exact match and edit similarity mean here

    from completer.pipeline import CompletionOptions, complete_at, make_engine

    torch.set_num_threads(a.threads)
    engine = make_engine(None, **({"max_new_tokens": a.max_new} if a.max_new else {}))
    engine.warm_start()
    opts = CompletionOptions(max_new_tokens=a.max_new)
    rows = []
    for root in roots:
        defs, texts = ast_defs(root)
        files = sorted(texts)
        ss = [s for s in sites(defs, texts, random.Random(a.seed), 1 << 30) if s["one_line"]][: a.sites or 100]
        ix = WorkspaceIndex(root, WorkspaceOptions(), count_tokens=engine.count_tokens)
        ix.build()
        for k, site in enumerate(ss):
            _, doc = open_site(ix, site, texts, files, random.Random(a.seed * 7919 + k))
            text = texts[site["path"]]
            hole = {"middle": text[site["cut"]:site["end"]], "text": doc, "offset": site["cut"]}
            for arm, kw in (("without", {}), ("with", {"workspace": ix, "path": str(root / site["path"])})):
                c = complete_at(engine, doc, site["cut"], language="python", doc_key=f"{arm}:{site['path']}",
                                options=opts, **kw)
                cross = [x for x in (c.syntax.context if c.syntax is not None else []) if x["kind"] in CROSS]
                rows.append({"package": root.name, "site": k, "path": site["path"], "arm": arm,
                             "middle": hole["middle"], "text": c.text, "ms": c.total_ms, **score(hole, c.text),
                             "cross_tokens": sum(x["tokens"] for x in cross),
                             "callee_in_prompt": callee_in(cross, defs[site["name"]])})
            ix.update(site["path"], text)
        ix.close()
        print(f"  {root.name}: {len(ss)} sites", file=sys.stderr)
    return {"rows": rows}


def print_exact(res: dict) -> None:
    rows = res["rows"]
    print(f"{'package':<18}{'arm':<9}{'sites':>6}{'exact %':>8}{'edit sim':>9}{'empty %':>8}"
          f"{'callee in prompt %':>19}{'x-file tok':>11}{'p50 ms':>8}")
    for pkg in [*dict.fromkeys(r["package"] for r in rows), "all"]:
        for arm in ("without", "with"):
            v = [r for r in rows if r["arm"] == arm and pkg in ("all", r["package"])]
            share = lambda key, v=v: 100 * sum(r[key] for r in v) / len(v)
            print(f"{pkg:<18}{arm:<9}{len(v):>6}{share('exact'):>8.1f}{statistics.fmean(r['similarity'] for r in v):>9.3f}"
                  f"{share('empty'):>8.1f}{share('callee_in_prompt'):>19.1f}"
                  f"{statistics.fmean(r['cross_tokens'] for r in v):>11.0f}{statistics.median(r['ms'] for r in v):>8.1f}")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["package"], r["site"]), {})[r["arm"]] = r["exact"]
    won = sum(p.get("with", False) and not p.get("without", False) for p in pairs.values())
    lost = sum(p.get("without", False) and not p.get("with", False) for p in pairs.values())
    print(f"sites exact only with context: {won}, only without: {lost}")


def recall(a, roots: list[Path], tmp: Path) -> None:
    budgets = a.budget or [256, 512]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TOKENIZER))
    count = lambda s: len(tok.encode(s).ids)
    total = {b: defaultdict(lambda: [0, 0, 0]) for b in budgets}
    all_sites, all_times = 0, []
    chars = toks = 0
    print(f"{'package':<18}{'files':>6}{'sites':>6}{'budget':>7}  " + "".join(f"{m:>16}" for m in
          ("none", "ring", "jaccard", "ours")) + "   recall (precision)")
    for root in roots:
        r = run_package(root, budgets, a.sites or 200, count, a.seed)
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
        n, times = latency_at_scale(roots, tmp, count, a.seed)
        print(f"retrieve at a {n}-file workspace: p50 {pct(times, .5):.2f} ms, p95 {pct(times, .95):.2f} ms, "
              f"max {max(times):.2f} ms ({len(times)} calls)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", nargs="+", help=f"default {' '.join(PACKAGES)}")
    ap.add_argument("--sdists", type=Path, help="a directory already holding the sdists (else pip download)")
    ap.add_argument("--budget", type=int, action="append", help="cross-file token budgets (default 256, 512)")
    ap.add_argument("--sites", "--n", type=int,
                    help="call sites per package (default 200; --lsp: 2; --exact: 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-scale", action="store_true", help="skip the 1 000-file latency run")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--lsp", action="store_true", help="type call sites through completer-lsp, context on/off")
    mode.add_argument("--exact", action="store_true", help="exact match at call sites, context on/off")
    ap.add_argument("--max-new", type=int, help="--lsp/--exact: max_new_tokens (default: the engine's)")
    ap.add_argument("--threads", type=int, default=1, help="--lsp/--exact: torch threads")
    ap.add_argument("--out", type=Path, help="--lsp/--exact: the JSON written (default bench/out/context_*.json)")
    a = ap.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        roots = fetch(a.packages or list(PACKAGES), a.sdists, Path(tmp))
        if not (a.lsp or a.exact):
            recall(a, roots, Path(tmp))
            return
        t0 = time.perf_counter()
        res = typing(a, roots) if a.lsp else exact(a, roots)
        (print_typing if a.lsp else print_exact)(res)
    print(f"{time.perf_counter() - t0:.0f} s; now {machine()}")
    out = a.out or ROOT / "bench" / "out" / f"context_{'lsp' if a.lsp else 'exact'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, **res}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
