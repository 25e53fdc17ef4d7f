"""Next-edit suggestions on code the project never trained on (issue 24): real packages' sources
from PyPI sdists (unpacked at benchmark time, never the standard library the embedded pair saw).

Tasks are made as in training (draft_models/edit_data.py): one change applied at a site — a local
or parameter renamed, a `self.` attribute renamed, a called function renamed, a literal changed,
an argument added to or removed from a call — and the expected file carries that change to the
other sites of the editable region the language server would choose (completer/edits/region.py,
default options). The history is OLD → FILE, as `completer next-edit --before` makes it.

- quality (default): per kind, exact match of the predicted file (FILE with the suggested edits
  applied) with the expected one, the share of suggestions that parse, the share left empty (and
  why: completer/edits/predict.py's drop reasons); tasks whose region has no other site measure
  false suggestions (anything suggested there is wrong). The goal of the issue: >= 50 % exact on
  rename propagation (rename_local + rename_attr). `--rename`: the syntax tree's rename before
  the model is asked (`first`, the servers' default), only where the model gives nothing usable
  (`fallback`), or never (`off`); `model_exact` counts the model's own answers, so measure a
  model with `fallback` or `off` (with `first` it is not asked where the last edit is a rename).
- the next-edit gate (next_edit_min_confidence): `model_by_confidence` gives, per threshold, the
  model's answers that pass it (shown, exact, and wrong: inexact, or a suggestion where nothing
  should change) — run with `--min-confidence 0` to see every threshold. `--calibrate` (with
  --target) first makes the same tasks from the stdlib's held-out split, picks the lowest
  threshold whose shown answers are exact at least as often as wrong and writes it to the
  target's config.json; the packages' code is then measured with it in force (never tuned on it).
  Calibrate with the servers' defaults (no `--rename`, so the table holds the answers the model
  shows in an editor) and enough tasks: the shipped gate came from `--n 30 --noop 10`.
- `--speed`: regions of 20-40 lines decoded twice, speculative (the region's tokens drafted by
  EditDrafter) and plain, the same greedy outputs (checked), both with the prompt already in
  the document's KV cache (a first run puts it there), 3 times each interleaved, the fastest of
  each: tokens/s ratio and tau.
- `--lsp N`: N renames typed through the real language server (`python -m lsp.server`, stdio):
  the user's change sent as didChange, then completer/nextEdit; latency from the change to the
  answer, p50/p90 (the editor's debounce, next_edit_debounce_ms, comes on top).

- `--follow N` (issue 39): a change at a definition followed past the region and into other
  files (completer/edits/follow.py, no model), N tasks per kind and package: a top-level function
  or class used in >= 2 other files renamed (expected: jedi's rename), a parameter of a function
  called in >= 3 places removed (expected: its argument dropped at each call jedi finds — its
  references, and each call of that name its goto resolves to the definition; a src layout's
  `src/` on jedi's path — by `ast`), a name taken out of its import and written again (expected:
  the file as it was), the same edit again (an argument added to, or a keyword argument taken out
  of, the first two calls of a callee called >= 3 times in a file; expected: the same at its other
  calls, by `ast`; and two different changes, or no third call: nothing offered), and edits that
  need nothing (a number, a comment, a statement: nothing offered). Per kind: recall of the
  places, precision, exact final files, the share shown. `--follow-kinds` picks kinds. Needs
  `pip install jedi`.
- `--latency N` (issue 39, Measure): N edits per kind (rename, signature, import, repeat) made
  from the packages' code, typed into a real `completer-lsp` (stdio) whose workspace holds
  `--files` Python files (the packages' import roots and tests, then generated modules importing
  each other and the packages); latency from the edit's didChange to the completer/nextEdit
  answer, p50/p90 over answers with a suggestion and over all, after the engine and the index are
  ready. Time it on an otherwise idle machine.

    python bench/next_edit.py [--n 40] [--sdists DIR] [--target DIR --draft DIR] [--rename first|fallback|off]
                              [--calibrate] [--min-confidence T]
    python bench/next_edit.py --follow 10 [--sdists DIR] [--follow-kinds rename,remove_param,import,quiet,repeat]
    python bench/next_edit.py --latency 20 --files 1000 [--sdists DIR]
    python bench/next_edit.py --speed [--n 12]
    python bench/next_edit.py --lsp 20
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from context import PACKAGES, SKIP_PARTS, fetch, machine  # bench/, the script's directory
from keystrokes import LspClient

from completer.edits.diff import apply_edits
from completer.edits.predict import from_versions, predict
from completer.edits.region import editable_region
from draft_models.edit_data import KINDS, make_task

RENAMES = ("rename_local", "rename_attr")
FOLLOW_KINDS = ("rename", "remove_param", "import", "quiet", "repeat")


def sources(roots: list[Path]) -> list[tuple[str, str]]:
    out = []
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            if SKIP_PARTS & set(rel.parts) or p.stat().st_size < 800:
                continue
            out.append((f"{root.name}/{rel.as_posix()}", p.read_text(encoding="utf-8", errors="replace")))
    return out


def server_region(below: int = 20, max_lines: int = 40):
    def rule(text, line, col, scope, rng):
        return editable_region(text, line, below=below, max_lines=max_lines, language="python")
    return rule


def make_tasks(files, kinds, n: int, seed: int, noop: bool, below: int = 20, lines: tuple[int, int] | None = None):
    """`n` tasks per kind (positives: the region holds another site; noop: it holds none)."""
    rng = random.Random(seed)
    out = defaultdict(list)
    rule = server_region(below)
    for kind in kinds:
        tries = 0
        while len(out[kind]) < n and tries < n * 60:
            tries += 1
            path, text = rng.choice(files)
            t = make_task(text, path, rng, kind=kind, region_rule=rule, max_region_chars=4000,
                          noop_rate=1.0 if noop else 0.0)
            if t is None or (t.sites == 0) != noop:
                continue
            if lines and not lines[0] <= t.region[1] - t.region[0] <= lines[1]:
                continue
            out[kind].append(t)
    return out


FORMAT = "auto"  # main() sets it: --format, else ours for the embedded pair (never taught: "auto" skips it)


RENAME = "first"  # main() sets it: --rename (next_edit_rename / next_edit_rename_first)


def run(engine, t, speculative: bool = True, below: int = 20):
    hist = from_versions(t.before, t.current, t.path)
    ne = predict(engine, t.current, t.line, t.col, hist, path=t.path, language="python", fmt=FORMAT,
                 speculative=speculative, below=below, doc_key=t.path, rename=RENAME != "off",
                 rename_first=RENAME == "first")
    return ne, apply_edits(t.current, ne.edits)


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except (SyntaxError, ValueError):
        return False


def quality(engine, tasks_by_kind, noop_by_kind) -> dict:
    res = {}
    for kind, tasks in tasks_by_kind.items():
        rows = []
        for t in tasks:
            ne, got = run(engine, t)
            rows.append({"exact": got == t.expected, "empty": not ne.edits, "parses": parses(got),
                         "reason": ne.dropped, "source": ne.source if ne.edits else None,
                         "model_reason": ne.model_dropped, "region_lines": t.region[1] - t.region[0], "ms": ne.total_ms,
                         "tau": ne.accepted_per_forward, "confidence": ne.confidence})
        res[kind] = summarize(rows)
    for kind, tasks in noop_by_kind.items():
        answers = [ne for ne, _ in (run(engine, t) for t in tasks)]
        shown = [ne.source for ne in answers if ne.edits]
        res.setdefault(kind, {})["noop_suggested"] = round(len(shown) / len(tasks), 3) if tasks else None
        res[kind]["noop_suggested_by"] = dict(Counter(shown))
        res[kind]["noop_tasks"] = len(tasks)
        # the model's suggestions where nothing should change, with their scores (see model_by_confidence)
        res[kind]["noop_model_confidence"] = sorted(ne.confidence for ne in answers
                                                    if ne.edits and ne.source == "model" and ne.confidence is not None)
    return res


GATE_THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8)


def _by_confidence(rows: list[dict]) -> list[dict]:
    """The model's shown answers kept if their score (NextEdit.confidence) were at least t: how many,
    how many exact — what next_edit_min_confidence = t leaves (an answer passes the engine's gate
    exactly when its score is at least t; measure with the gate off to see every t)."""
    mine = [r for r in rows if r["source"] == "model" and r["confidence"] is not None]
    return [{"at_least": t, "shown": sum(r["confidence"] >= t for r in mine),
             "exact": sum(r["confidence"] >= t and r["exact"] for r in mine)} for t in GATE_THRESHOLDS]


def gate_table(q: dict, kinds) -> list[dict]:
    """Every kind together, per threshold: the model's answers shown (where something should change
    and where nothing should), how many exact, how many wrong (not exact, or any suggestion where
    nothing should change)."""
    per = [q[k]["model_by_confidence"] for k in kinds if q.get(k, {}).get("tasks")]
    noop = [c for k in kinds for c in q.get(k, {}).get("noop_model_confidence", ())]
    out = []
    for rows in zip(*per):
        t = rows[0]["at_least"]
        shown, exact = sum(r["shown"] for r in rows), sum(r["exact"] for r in rows)
        quiet = sum(c >= t for c in noop)
        out.append({"at_least": t, "shown": shown, "exact": exact, "noop_shown": quiet,
                    "wrong": shown - exact + quiet})
    return out


def calibrated(table: list[dict]) -> float:
    """The lowest threshold at which the model's shown next edits are exact at least as often as
    wrong (the completion gate's rule, bench/gate.py, with every inexact edit wrong), else the
    highest swept."""
    for row in table:
        if row["shown"] + row["noop_shown"] and row["exact"] >= row["wrong"]:
            return row["at_least"]
    return table[-1]["at_least"]


def stdlib_heldout() -> list[tuple[str, str]]:
    """The training domain's held-out split (draft_models.data.HELD_OUT: email/, json/, asyncio/,
    never trained on, next-edit fine-tunes included), tests left out as for the packages."""
    from draft_models.data import corpus_files, read_source

    return [(p.as_posix(), read_source(p)) for p in corpus_files(split="heldout")
            if "/test" not in p.as_posix() and p.stat().st_size >= 800]


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    if not n:
        return {"tasks": 0}
    shown = [r for r in rows if not r["empty"]]
    return {"tasks": n, "exact": round(sum(r["exact"] for r in rows) / n, 3),
            # the model's own answers: exact where a rename did not stand in for it
            "model_exact": round(sum(r["exact"] and r["source"] == "model" for r in rows) / n, 3),
            "model_by_confidence": _by_confidence(rows),
            "empty": round(sum(r["empty"] for r in rows) / n, 3),
            "shown_by": dict(Counter(r["source"] for r in rows if r["source"])),
            "model_dropped": dict(Counter(r["model_reason"] or r["reason"] for r in rows
                                          if r["model_reason"] or r["reason"])),
            "parses_of_shown": round(sum(r["parses"] for r in shown) / len(shown), 3) if shown else None,
            "dropped": dict(Counter(r["reason"] for r in rows if r["reason"])),
            "region_lines_median": statistics.median(r["region_lines"] for r in rows),
            "ms_median": round(statistics.median(r["ms"] for r in rows), 1),
            "tau_median": round(statistics.median(r["tau"] for r in rows), 2)}


def calibrate(engine, target: Path, kinds, n: int, noop: int, seed: int) -> dict:
    """The gate's threshold for `target`, measured with the gate off on the stdlib's held-out split
    (the same task kinds and counts as the quality run), written to its config.json."""
    engine.reconfigure(next_edit_min_confidence=0.0)
    files = stdlib_heldout()
    print(f"# calibration: {len(files)} held-out stdlib files", file=sys.stderr)
    q = quality(engine, make_tasks(files, kinds, n, seed, False), make_tasks(files, kinds, noop, seed + 1, True))
    table = gate_table(q, kinds)
    chosen = calibrated(table)
    cfg_path = target / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["completer_next_edit_min_confidence"] = chosen
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"calibrated next_edit_min_confidence {chosen}, written to {cfg_path}", file=sys.stderr)
    return {"next_edit_min_confidence": chosen, "files": len(files), "table": table,
            "source": "stdlib held-out split (email/, json/, asyncio/; tests left out)", "per_kind": q}


def speed(engine, tasks, reps: int = 3) -> dict:
    rows, plain, spec = [], None, None
    for t in tasks:
        run(engine, t, speculative=False, below=36)  # the prompt into the document's cache: both timed warm
        times = {False: [], True: []}
        for _ in range(reps):  # interleaved; the fastest of each (timing noise only ever adds)
            for sp in (False, True):
                ne, _ = run(engine, t, speculative=sp, below=36)
                times[sp].append(ne.total_ms)
                plain, spec = (ne, spec) if not sp else (plain, ne)
        if plain.text != spec.text:
            raise SystemExit(f"speculative and plain outputs differ on {t.path}:{t.line}: exactness is broken")
        if not plain.new_tokens:
            continue
        rows.append({"lines": t.region[1] - t.region[0], "tokens": plain.new_tokens,
                     "plain_tps": plain.new_tokens / min(times[False]) * 1e3,
                     "spec_tps": spec.new_tokens / min(times[True]) * 1e3,
                     "tau": spec.accepted_per_forward, "copied": plain.text == t.region_text()})
    if not rows:
        return {"tasks": 0}
    ratio = [r["spec_tps"] / r["plain_tps"] for r in rows]
    return {"tasks": len(rows), "region_lines_median": statistics.median(r["lines"] for r in rows),
            "tokens_median": statistics.median(r["tokens"] for r in rows),
            "plain_tokens_per_s_median": round(statistics.median(r["plain_tps"] for r in rows), 1),
            "speculative_tokens_per_s_median": round(statistics.median(r["spec_tps"] for r in rows), 1),
            "speedup_median": round(statistics.median(ratio), 2), "speedup_min": round(min(ratio), 2),
            "tau_median": round(statistics.median(r["tau"] for r in rows), 2),
            "outputs_equal_to_region": sum(r["copied"] for r in rows)}


def lsp_latency(tasks, opts: dict) -> dict:
    """Each task in its own document: open OLD, send the user's change, ask completer/nextEdit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as root:
        lsp = LspClient([sys.executable, "-m", "lsp.server"], env)
        lsp.request("initialize", {"processId": None, "rootUri": Path(root).as_uri(), "capabilities": {},
                                   "initializationOptions": opts})
        lsp.notify("initialized", {})
        end = time.monotonic() + 600
        while (lsp.request("completer/stats", {}).get("result") or {}).get("engine") != "ready":
            if time.monotonic() > end:
                raise SystemExit("the language server's engine did not load in 600 s")
            time.sleep(0.2)
        ms, reasons, shown = [], Counter(), 0
        for i, t in enumerate(tasks):
            uri = Path(root, f"t{i}", t.path).as_uri()
            lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                 "text": t.before}})
            b = t.current.splitlines(keepends=True)
            change = {"range": {"start": {"line": t.line, "character": 0}, "end": {"line": t.line + 1, "character": 0}},
                      "text": b[t.line]}
            t0 = time.perf_counter()
            lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [change]})
            r = lsp.request("completer/nextEdit", {"textDocument": {"uri": uri},
                                                   "position": {"line": t.line, "character": t.col}})
            ms.append((time.perf_counter() - t0) * 1e3)
            res = r.get("result") or {}
            shown += bool(res.get("edits"))
            if res.get("reason"):
                reasons[res["reason"]] += 1
            lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        lsp.close()
    ms.sort()
    q = lambda p: round(ms[min(len(ms) - 1, int(p * len(ms)))], 1)
    return {"requests": len(ms), "p50_ms": q(0.5), "p90_ms": q(0.9), "max_ms": round(ms[-1], 1),
            "shown": shown, "dropped": dict(reasons)}


# -- --follow: renames and signature changes followed through the repository (issue 39) ----------
def _py_files(root: Path) -> dict[str, str]:
    out = {}
    for f in sorted(root.rglob("*.py")):
        try:
            out[f.relative_to(root).as_posix()] = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return out


def _project(root: Path):
    """jedi's project for a package's tree: the tree (a src layout's `src/` first) and the standard
    library only on its path. The tests import the package by name: with the environment's path
    jedi resolved `click` to the copy installed in this virtualenv (even with `src/` added after
    it), and `click.command` in click's tests was not a use of the tree's `command`."""
    import sysconfig

    import jedi
    src = root / "src"
    std = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]]
    std.append(str(Path(std[0]) / "lib-dynload"))
    return jedi.Project(root, sys_path=[str(src) if src.is_dir() else str(root), *dict.fromkeys(std)])


def _inside(root: Path, path) -> str | None:
    p = Path(path).resolve()
    return p.relative_to(root.resolve()).as_posix() if p.is_relative_to(root.resolve()) else None


def _jedi_rename(root: Path, rel: str, text: str, line: int, col: int, new: str,
                 texts: dict[str, str]) -> dict[str, str] | None:
    """The oracle for a rename: jedi's refactoring (its own import resolution), rel → new text;
    in a file it left alone, each name token its goto resolves to the definition renamed too (its
    rename skipped jinja2's tests/conftest.py, `from jinja2.environment import Environment`,
    where its references and goto find the class)."""
    import io
    import tokenize

    import jedi
    project = _project(root)
    old = text.split("\n")[line][col:].split("(")[0].split(":")[0].strip()
    try:
        r = jedi.Script(code=text, path=str(root / rel), project=project).rename(line + 1, col, new_name=new)
        out = {f: cf.get_new_code() for p, cf in r.get_changed_files().items() if (f := _inside(root, p))}
    except Exception as e:  # noqa: BLE001 - jedi refuses some places: no task there
        print(f"# jedi: {rel}:{line + 1}: {e}", file=sys.stderr)
        return None
    for f, t in texts.items():
        if f in out or f == rel or not re.search(rf"\b{re.escape(old)}\b", t):
            continue
        try:
            toks = [k for k in tokenize.generate_tokens(io.StringIO(t).readline)
                    if k.type == tokenize.NAME and k.string == old]
            script = jedi.Script(code=t, path=str(root / f), project=project)
            hits = [k.start for k in toks if any(d.module_path is not None and _inside(root, d.module_path) == rel
                                                 and d.line == line + 1
                                                 for d in script.goto(k.start[0], k.start[1], follow_imports=True))]
        except Exception as e:  # noqa: BLE001 - a file jedi or tokenize cannot read: left as it is
            print(f"# jedi: {f}: {e}", file=sys.stderr)
            continue
        if hits:
            lines = t.split("\n")
            for ln, c in sorted(hits, reverse=True):
                lines[ln - 1] = lines[ln - 1][:c] + new + lines[ln - 1][c + len(old):]
            out[f] = "\n".join(lines)
    return out


def _jedi_calls(root: Path, rel: str, text: str, line: int, col: int,
                texts: dict[str, str]) -> list[tuple[str, int, int]] | None:
    """The oracle for a function's calls: jedi's references (path, 0-based line, column) of the
    name, and each other call of that name (ast) that jedi's goto resolves to the definition —
    its references skip some a goto finds (jinja2's nativetypes.py calls `has_safe_repr`, imported
    at the top, and nodes.py through a function's own import)."""
    import jedi
    name = text.split("\n")[line][col:].split("(")[0].strip()
    project = _project(root)
    try:
        refs = jedi.Script(code=text, path=str(root / rel), project=project).get_references(line + 1, col)
    except Exception as e:  # noqa: BLE001
        print(f"# jedi: {rel}:{line + 1}: {e}", file=sys.stderr)
        return None
    out = {(f, r.line - 1, r.column) for r in refs if r.module_path is not None and (f := _inside(root, r.module_path))}
    for f, t in texts.items():
        if name not in t:
            continue
        try:
            tree = ast.parse(t)
        except SyntaxError:
            continue
        ends = {(c.func.end_lineno - 1, c.func.end_col_offset - len(name)) for c in ast.walk(tree)
                if isinstance(c, ast.Call) and (getattr(c.func, "id", None) == name or getattr(c.func, "attr", None) == name)}
        for ln, c in sorted(ends - {(lf, cf) for g, lf, cf in out if g == f}):
            try:
                defs = jedi.Script(code=t, path=str(root / f), project=project).goto(ln + 1, c, follow_imports=True)
            except Exception as e:  # noqa: BLE001 - a place jedi cannot read: not a call it resolves
                print(f"# jedi: {f}:{ln + 1}: {e}", file=sys.stderr)
                continue
            if any(d.module_path is not None and _inside(root, d.module_path) == rel and d.line == line + 1 for d in defs):
                out.add((f, ln, c))
    return sorted(out)


def _removed_arg(text: str, calls: list[tuple[int, int]], params: list[str], drop: str) -> str:
    """`text` with the argument for parameter `drop` removed from the calls whose callee name ends
    at (line, col) (ast positions: an oracle apart from follow.py's tree-sitter rewrite); calls
    with *args/**kwargs are left alone."""
    tree = ast.parse(text)
    starts = [0]
    for ln in text.split("\n"):
        starts.append(starts[-1] + len(ln) + 1)
    off = lambda ln, c: starts[ln - 1] + len(text.split("\n")[ln - 1].encode()[:c].decode("utf-8", "replace"))
    want = set(calls)
    cuts = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name_end = (f.end_lineno - 1, f.end_col_offset) if isinstance(f, (ast.Name, ast.Attribute)) else None
        n = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name_end is None or (name_end[0], name_end[1] - len(n)) not in want:
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        # a lone generator argument's position is the call's parentheses (`f(x for x in y)`)
        lone = len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.GeneratorExp) and \
            (node.args[0].lineno, node.args[0].col_offset) == (f.end_lineno, f.end_col_offset)
        items = sorted([(a.lineno, a.col_offset + lone, a.end_lineno, a.end_col_offset - lone,
                         i < len(params) and params[i] == drop)
                        for i, a in enumerate(node.args)] +
                       [(k.lineno, k.col_offset, k.end_lineno, k.end_col_offset, k.arg == drop) for k in node.keywords])
        for i, (l1, c1, l2, c2, gone) in enumerate(items):
            if not gone:
                continue
            if i + 1 < len(items):
                cuts.append((off(l1, c1), off(items[i + 1][0], items[i + 1][1])))
            elif i > 0:
                cuts.append((off(items[i - 1][2], items[i - 1][3]), off(l2, c2)))
            else:  # the only argument: the call's parentheses left empty (no blank lines where it stood)
                cuts.append((text.index("(", off(f.end_lineno, f.end_col_offset)) + 1,
                             off(node.end_lineno, node.end_col_offset) - 1))
    for a, b in sorted(cuts, reverse=True):
        text = text[:a] + text[b:]
    return text


def _ours(index, texts: dict[str, str], rel: str, after: str, line: int, col: int, old_line: str, new_line: str):
    """Every place the language server's follower offers for the change, applied (the editor's
    multi-location edit: the region's edits and every place past it); rel → new text."""
    from completer.edits.follow import Follower
    from completer.edits.formats import HistoryItem

    now = {**texts, rel: after}
    got = Follower().answer(after, rel, line, col, [HistoryItem(rel, old_line, new_line)], language="python",
                            read=now.get, importers=index.importers)
    edits = defaultdict(list)  # a file's places together: each was computed on the text as it is
    for p in (got.all if got else []):
        edits[p.path] += p.edits
    return {**now, **{f: apply_edits(now[f], es) for f, es in edits.items()}}, got


def _places(before: str, after: str) -> set[tuple[int, int, str]]:
    """Where `after` differs from `before`: (0-based line and token index in `before`, the text put
    there), one per changed run of tokens (a rename's use, a call's removed argument). Aligned on
    the whole file's tokens (diff.span_edits bounds its work and would call a big file one change)."""
    import difflib
    import re

    if before == after:
        return set()
    a, b = re.findall(r"\w+|\s+|.", before), re.findall(r"\w+|\s+|.", after)
    lines = [0]
    for t in a:
        lines.append(lines[-1] + t.count("\n"))
    return {(lines[i1], i1, "".join(b[j1:j2])) for tag, i1, i2, j1, j2
            in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if tag != "equal"}


def _score(before: dict[str, str], want: dict[str, str], got: dict[str, str]) -> dict:
    """Places (file, line, new text) the oracle changed and we suggested, both from the same
    text (the user's edit at the definition applied); whether every file came out as the oracle's."""
    exp, sug = set(), set()
    for f in set(want) | set(got):
        a = before.get(f, "")
        exp |= {(f, *p) for p in _places(a, want.get(f, a))}
        sug |= {(f, *p) for p in _places(a, got.get(f, a))}
    files = {f for f in set(want) | set(got) if want.get(f, before.get(f)) != got.get(f, before.get(f))}
    return {"expected": len(exp), "suggested": len(sug), "hit": len(exp & sug), "exact": not files,
            "wrong_files": sorted(files)[:5], "missed": sorted(exp - sug)[:4], "extra": sorted(sug - exp)[:4]}


def _split_params(sig: str) -> list[str]:
    """A parameter list's text split at its top-level commas (defaults and annotations hold some)."""
    out, depth, cur = [], 0, ""
    for ch in sig:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + ([cur] if cur.strip() else [])


def _answer(index, texts: dict[str, str], rel: str, after: str, line: int, col: int, old_line: str, new_line: str):
    from completer.edits.follow import Follower
    from completer.edits.formats import HistoryItem

    return Follower().answer(after, rel, line, col, [HistoryItem(rel, old_line, new_line)], language="python",
                             read={**texts, rel: after}.get, importers=index.importers, providers=index.providers)


def _import_tasks(root: Path, texts: dict[str, str], index, n: int, rng: random.Random) -> list[dict]:
    """A name the file takes with `from M import …, N` (the last name of a one-line import, N
    defined in M and in no other module), taken out of the import; the user's edit writes N at
    its first use (that line had `None` there). Exact: the file as it was, import and all."""
    import re

    cands = []
    for rel, text in texts.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if not (isinstance(node, ast.ImportFrom) and node.lineno == node.end_lineno and node.names[-1].asname is None
                    and node.names[-1].name != "*"):
                continue
            name = node.names[-1].name
            if len({f for f, _ in index.providers(rel, name) if not f.endswith("__init__.py")}) != 1:
                continue  # one definition (packages may re-export it)
            lines = text.split("\n")
            imp = lines[node.lineno - 1]
            # its first use as a name (ast: not in a string or a comment), on a line naming it once
            uses = sorted(n.lineno - 1 for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name
                          and n.lineno > node.lineno)
            use = next((i for i in uses if len(re.findall(rf"(?<![\w.]){re.escape(name)}\b", lines[i])) == 1), None)
            if use is None or "(" in imp:
                continue
            cands.append((rel, node.lineno - 1, imp, name, use))
    rng.shuffle(cands)
    rows = []
    for rel, at, imp, name, use in cands[:n]:
        lines = texts[rel].split("\n")
        cut = imp[:imp.rindex(name)].rstrip().rstrip(",") if imp.count(",") else None
        # a line taken out between blank lines takes one with it (its block is gone)
        alone = not cut and 0 < at < len(lines) - 1 and not lines[at - 1].strip() and not lines[at + 1].strip()
        before = lines[:at] + ([cut] if cut else []) + lines[at + 1 + alone:]
        u = use - (0 if cut else 1 + alone)
        new_line = before[u]
        old_line = re.sub(rf"(?<![\w.]){re.escape(name)}\b", "None", new_line)
        after = "\n".join(before)
        col = re.search(rf"(?<![\w.]){re.escape(name)}\b", new_line).end()
        got = _answer(index, texts, rel, after, u, col, old_line + "\n", new_line + "\n")
        edits = [e for p in (got.all if got else []) if p.path == rel for e in p.edits]  # the region's and the jump's
        final = apply_edits(after, edits)
        rows.append({"task": f"{root.name}:{rel}:{at + 1} {name}", "shown": bool(edits),
                     "exact": final == texts[rel], "source": got and got.source,
                     "got": final.split("\n")[max(at - 1, 0):at + 2] if final != texts[rel] else None})
    return rows


def _quiet_tasks(texts: dict[str, str], index, n: int, rng: random.Random) -> list[dict]:
    """Edits that need no follow-up: a number changed, a comment added at a line's end, a
    statement added after a line; nothing should be offered."""
    import re

    files = [(rel, t) for rel, t in texts.items() if len(t) > 200]
    rows = []
    while len(rows) < n and files:
        rel, text = rng.choice(files)
        lines = text.split("\n")
        i = rng.randrange(len(lines))
        line = lines[i]
        kind = rng.choice(("literal", "comment", "statement"))
        if kind == "literal":
            m = re.search(r"(?<![\w.])\d+(?![\w.])", line)
            if m is None or line.lstrip().startswith("#"):
                continue
            new = line[:m.start()] + str(int(m.group()) + 1) + line[m.end():]
        elif kind == "comment":
            if not line.strip() or '"' in line or "'" in line or "#" in line:
                continue
            new = line + "  # note"
        else:
            if not line.strip() or line.rstrip().endswith((":", ",", "(", "[", "{", "\\")) or line.strip().startswith(("@", "#")):
                continue
            indent = line[:len(line) - len(line.lstrip())]
            new = line + "\n" + indent + "count = 0"
        after = "\n".join(lines[:i] + [new] + lines[i + 1:])
        try:
            ast.parse(after)
        except SyntaxError:
            continue
        got = _answer(index, texts, rel, after, i + new.count("\n"), len(new.split("\n")[-1]), line + "\n", new + "\n")
        rows.append({"task": f"{rel}:{i + 1} {kind}", "shown": got is not None, "exact": got is None,
                     "source": got and got.source})
    return rows


def _calls_by_callee(tree: ast.AST) -> dict[str, list[ast.Call]]:
    """A file's calls by their callee as written (`f`, `self.log.warn`), in file order."""
    out = defaultdict(list)
    for c in ast.walk(tree):
        if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute)):
            out[ast.unparse(c.func)].append(c)
    for cs in out.values():
        cs.sort(key=lambda c: (c.lineno, c.col_offset))
    return out


def _repeat_tasks(texts: dict[str, str], n: int, rng: random.Random) -> dict[str, list[dict]]:
    """The same edit again (issue 39 §2), made from a package's code: a function called >= 3 times
    in a file (its callee as written), the user's same change at its first two calls (one-line
    calls, the callee once on each line), scored against `ast`:
    - add: `, strict=True` (a keyword the file never uses) after the last argument; expected: the
      same at every other call of that callee (`strict=True` in an empty call), not in a call
      whose one argument is a bare generator (Python refuses it there);
    - drop: a keyword argument `k=v` the callee is passed at >= 3 calls taken out (with the comma
      before it, or after it when it is first); expected: the same `k=v` (as ast reads it) out of
      every other call of that callee;
    - quiet: the same two calls given different keywords (`strict=True`, `strict=False`), or one
      change at both calls of a callee called only twice; expected: nothing offered."""
    rows: dict[str, list[dict]] = defaultdict(list)
    cands = []
    for rel, text in texts.items():
        if SKIP_PARTS & set(rel.split("/")):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for callee, calls in _calls_by_callee(tree).items():
            cands.append((rel, callee, calls))
    rng.shuffle(cands)
    starts_of = {}

    def off(rel, ln, c):  # an ast position (1-based line, utf-8 column) → a char offset
        if rel not in starts_of:
            st, t = [0], texts[rel]
            for line in t.split("\n"):
                st.append(st[-1] + len(line) + 1)
            starts_of[rel] = st
        line = texts[rel].split("\n")[ln - 1]
        return starts_of[rel][ln - 1] + len(line.encode()[:c].decode("utf-8", "replace"))

    def single(rel, calls, callee):
        lines = texts[rel].split("\n")
        ok = [c for c in calls if c.lineno == c.end_lineno and lines[c.lineno - 1].count(callee + "(") == 1]
        return len({c.lineno for c in ok[:2]}) == 2 and ok[:2] == calls[:2]

    def last_end(rel, c):
        items = list(c.args) + list(c.keywords)
        if not items:
            return None
        e = max(items, key=lambda a: (a.end_lineno, a.end_col_offset))
        return off(rel, e.end_lineno, e.end_col_offset)

    def add_at(rel, c, kw):  # the keyword added after the last argument: (start, end, text)
        end = last_end(rel, c)
        if end is None:
            at = off(rel, c.func.end_lineno, c.func.end_col_offset) + 1
            return at, at, kw
        return end, end, ", " + kw

    def drop_span(rel, c, kw):  # (start, end) of keyword `kw` with its comma
        items = sorted(list(c.args) + list(c.keywords), key=lambda a: (a.lineno, a.col_offset))
        i = next(i for i, a in enumerate(items) if a is kw)
        if i > 0:
            p = items[i - 1]
            return off(rel, p.end_lineno, p.end_col_offset), off(rel, kw.end_lineno, kw.end_col_offset)
        if i + 1 < len(items):
            return off(rel, kw.lineno, kw.col_offset), off(rel, items[i + 1].lineno, items[i + 1].col_offset)
        return off(rel, kw.lineno, kw.col_offset), off(rel, kw.end_lineno, kw.end_col_offset)

    def edit(text, changes):  # (start, end, new) char spans, applied from the end
        for a, b, t in sorted(changes, reverse=True):
            text = text[:a] + t + text[b:]
        return text

    def task(kind, rel, first_two, rest, quiet=False):
        """first_two / rest: [(start, end, new)] of the user's edits and the expected others."""
        text = texts[rel]
        after = edit(text, first_two)
        hist, shift = [], 0
        for a, b, t in sorted(first_two):
            ls, le = text.rfind("\n", 0, a) + 1, text.find("\n", b)
            old_line = text[ls:le] + "\n"
            new_line = text[ls:a] + t + text[b:le] + "\n"
            line = after.count("\n", 0, ls + shift)
            col = a - ls + len(t)
            hist.append(HistoryItem(rel, old_line, new_line))
            shift += len(t) - (b - a)
        want = {rel: edit(text, first_two + rest)}
        got, ans = _follow_history({**texts, rel: after}, rel, after, line, col, hist)
        row = _score({**texts, rel: after}, want, got)
        row.update(task=f"{rel}:{first_two[0][0]} {kind}", source=ans and ans.source, shown=ans is not None)
        rows["repeat_quiet" if quiet else "repeat"].append(row)

    from completer.edits.formats import HistoryItem

    done = Counter()
    for rel, callee, calls in cands:
        if min(done.values(), default=0) >= n and len(done) == 3:
            break
        text = texts[rel]
        if len(calls) >= 3 and done["add"] < n and "strict" not in text and single(rel, calls, callee) \
                and all((c.args or c.keywords) and not isinstance(c.args[-1:] or None, ast.GeneratorExp)
                        for c in calls[:2]):
            mine = [add_at(rel, c, "strict=True") for c in calls[:2]]
            rest = [add_at(rel, c, "strict=True") for c in calls[2:]
                    if not (len(c.args) == 1 and not c.keywords and isinstance(c.args[0], ast.GeneratorExp))]
            task("add", rel, mine, rest)
            done["add"] += 1
            if done["quiet"] < n:
                a, b = mine
                task("different keywords", rel, [a, (b[0], b[1], b[2].replace("True", "False"))], [], quiet=True)
                done["quiet"] += 1
            continue
        if len(calls) == 2 and done["quiet"] < n and "strict" not in text and single(rel, calls, callee) \
                and all(c.args or c.keywords for c in calls):
            mine = [add_at(rel, c, "strict=True") for c in calls]
            task("no third call", rel, mine, [], quiet=True)
            done["quiet"] += 1
            continue
        if done["drop"] >= n:
            continue
        by_kw = defaultdict(list)
        for c in calls:
            for k in c.keywords:
                if k.arg is not None:
                    by_kw[ast.unparse(k)].append((c, k))
        for kwtext, ck in by_kw.items():
            if len(ck) < 3 or not single(rel, [c for c, _ in ck], callee) or [c for c, _ in ck][:2] != \
                    [c for c in calls if any(ast.unparse(k) == kwtext for k in c.keywords)][:2]:
                continue
            mine = [(*drop_span(rel, c, k), "") for c, k in ck[:2]]
            rest = [(*drop_span(rel, c, k), "") for c, k in ck[2:]]
            task("drop " + kwtext, rel, mine, rest)
            done["drop"] += 1
            break
    return rows


def _follow_history(now: dict[str, str], rel: str, after: str, line: int, col: int, history: list):
    """Every place the follower offers after `history` (the user's edits in `rel`), applied."""
    from completer.edits.follow import Follower

    got = Follower().answer(after, rel, line, col, history, language="python", read=now.get)
    edits = defaultdict(list)
    for p in (got.all if got else []):
        edits[p.path] += p.edits
    return {**now, **{f: apply_edits(now[f], es) for f, es in edits.items()}}, got


def follow_quality(roots: list[Path], n: int, seed: int, kinds: tuple[str, ...] = FOLLOW_KINDS) -> dict:
    """Per package, `n` tasks of each kind made from its code, scored against an oracle:
    - rename: a top-level function or class (in the package, not its tests) used in >= 2 other
      files (by jedi's references) renamed at its def; expected: jedi's rename of it;
    - remove_param: a parameter of a top-level function called in >= 3 places (jedi's references
      that are calls, positional or keyword) removed at the def; expected: the argument it binds
      removed at each such call (ast positions).
    Reported per kind: recall of the places that must change, precision of what was suggested,
    the share of tasks whose every file comes out exact."""
    from completer.workspace import WorkspaceIndex

    rng = random.Random(seed)
    rows: dict[str, list[dict]] = defaultdict(list)
    for root in roots:
        texts = _py_files(root)
        index = WorkspaceIndex(root)
        index.build()
        cands = []
        for rel, text in texts.items():
            if SKIP_PARTS & set(rel.split("/")) or "/tests/" in f"/{rel}" or rel.split("/")[-1].startswith("test"):
                continue
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
                    others = sum(1 for f, t in texts.items() if f != rel and node.name in t)
                    if others >= 2 or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        cands.append((rel, node))
        rng.shuffle(cands)
        done = defaultdict(int, {k: n for k in ("rename", "remove_param") if k not in kinds})
        for rel, node in cands:
            if all(done[k] >= n for k in ("rename", "remove_param")):
                break
            text = texts[rel]
            lines = text.split("\n")
            line = node.lineno - 1
            col = lines[line].index(node.name, lines[line].index("def " if not isinstance(node, ast.ClassDef) else "class "))
            calls = _jedi_calls(root, rel, text, line, col, texts)
            if calls is None:
                continue
            other_files = {f for f, _, _ in calls if f != rel}
            kind = "rename" if done["rename"] < n and len(other_files) >= 2 else None
            params = [a.arg for a in node.args.posonlyargs + node.args.args] if not isinstance(node, ast.ClassDef) else []
            if kind is None and done["remove_param"] < n and params and not node.args.vararg and not node.args.kwarg:
                call_sites = [(f, ln, c) for f, ln, c in calls if (f, ln, c) != (rel, line, col) and
                              texts.get(f, "").split("\n")[ln][c + len(node.name):].lstrip().startswith("(")]
                if len(call_sites) >= 3:
                    kind = "remove_param"
            if kind is None:
                continue
            old_line = lines[line] + "\n"
            if kind == "rename":
                new = node.name + "_renamed"
                new_line = old_line[:col] + new + old_line[col + len(node.name):]
                want = _jedi_rename(root, rel, text, line, col, new, texts)
                if want is None:
                    continue
                cur = (line, col + len(new))
            else:
                drop = params[-1]
                header = lines[line]
                i = header.find("(", col)
                j, depth = i, 0
                while j < len(header):
                    depth += header[j] in "([{"
                    depth -= header[j] in ")]}"
                    if depth == 0:
                        break
                    j += 1
                if i < 0 or j >= len(header) or drop in ("self", "cls"):
                    continue  # a one-line header only: the user's edit is that line
                kept = [p for p in _split_params(header[i + 1:j])
                        if p.strip().split(":")[0].split("=")[0].strip() != drop]
                new_line = header[:i + 1] + ",".join(kept).strip() + header[j:] + "\n"
                by_file = defaultdict(list)
                for f, ln, c in call_sites:
                    by_file[f].append((ln, c))
                want = {f: _removed_arg(texts[f], cs, params, drop) for f, cs in by_file.items()}
                want[rel] = _removed_arg(text.replace(old_line, new_line, 1), by_file.get(rel, []), params, drop)
                cur = (line, len(new_line.rstrip("\n")))
                new = drop
            after = text.replace(old_line, new_line, 1)
            got, ans = _ours(index, texts, rel, after, *cur, old_line, new_line)
            base = {**texts, rel: after}
            want = {**want, rel: want.get(rel, after)} if kind == "remove_param" else want
            row = _score(base, want, got)
            row.update(task=f"{root.name}:{rel}:{line + 1} {node.name} ({kind}: {new})", source=ans and ans.source)
            rows[kind].append(row)
            done[kind] += 1
        if "import" in kinds:
            rows["import"] += _import_tasks(root, texts, index, n, rng)
        if "quiet" in kinds:
            rows["quiet"] += _quiet_tasks(texts, index, n * 3, rng)
        if "repeat" in kinds:
            # its own draws: the other kinds' tasks stay those of a run without it
            for k, rs in _repeat_tasks(texts, n, random.Random(f"{seed}:{root.name}")).items():
                rows[k] += rs
        index.close()
    out = {}
    for kind in ("import", "quiet", "repeat_quiet"):
        rs = rows.pop(kind, [])
        if rs:
            out[kind] = {"tasks": len(rs), "shown": round(sum(r["shown"] for r in rs) / len(rs), 4),
                         "exact": round(sum(r["exact"] for r in rs) / len(rs), 4),
                         "misses": [r for r in rs if r["shown"] != (kind == "import") or not r["exact"]][:8]}
    for kind, rs in rows.items():
        e, s, h = (sum(r[k] for r in rs) for k in ("expected", "suggested", "hit"))
        out[kind] = {"tasks": len(rs), "recall": round(h / e, 4) if e else None, "precision": round(h / s, 4) if s else None,
                     "exact": round(sum(r["exact"] for r in rs) / len(rs), 4), "places": e,
                     "misses": [r for r in rs if not r["exact"]][:8]}
    return out


# -- --latency: edit → first suggestion through completer-lsp in a 1 000-file workspace ------------
def _workspace(roots: list[Path], dest: Path, files: int) -> dict[str, str]:
    """A workspace of `files` Python files: the packages' import roots (`src/click` → `click/`,
    `rich/`) and their tests (`tests_click/`), then generated modules up to the count, each
    importing two others' functions and a package's (what the index resolves and a rename
    follows), calling them. rel → text of the packages' files (the tasks are made from those)."""
    import shutil

    texts = {}
    for r in roots:
        base = r / "src" if (r / "src").is_dir() else r
        for d in sorted(base.iterdir()):
            if d.is_dir() and (d / "__init__.py").exists() and d.name not in SKIP_PARTS:
                shutil.copytree(d, dest / d.name, dirs_exist_ok=True)
        if (r / "tests").is_dir():
            shutil.copytree(r / "tests", dest / f"tests_{r.name.split('-')[0]}", dirs_exist_ok=True)
    for f in sorted(dest.rglob("*.py")):
        try:
            texts[f.relative_to(dest).as_posix()] = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    n = max(files - len(list(dest.rglob("*.py"))), 0)
    real = [(rel.removesuffix(".py").replace("/", "."), name) for rel, text in sorted(texts.items())
            if not rel.startswith("tests_") and not rel.endswith("__init__.py")
            for name in re.findall(r"^def ([a-z]\w*)\(", text, re.MULTILINE)[:1]]
    (dest / "gen").mkdir(exist_ok=True)
    (dest / "gen" / "__init__.py").write_text("")
    for i in range(n - 1):
        a, b = (i * 7 + 1) % max(n - 1, 1), (i * 13 + 5) % max(n - 1, 1)
        mod, fn = real[i % len(real)] if real else ("os.path", "join")
        (dest / "gen" / f"m{i}.py").write_text(
            f"from gen.m{a} import f{a}\nfrom gen.m{b} import K{b}\nfrom {mod} import {fn}\n\nK{i} = {i}\n\n\n"
            f"def f{i}(x, y, scale=1):\n    return f{a}(x, y) * scale + K{b}\n\n\n"
            f"class C{i}:\n    def run(self, x):\n        f{i}(x, 1)\n        return {fn}\n")
    return texts


def _latency_tasks(texts: dict[str, str], n: int, rng: random.Random) -> list[dict]:
    """`n` edits per kind from the packages' code, each as the editor sends it: the text open
    before, the user's changes (line, old line, new line: one didChange each), the cursor.
    rename: a top-level function or class imported by >= 2 other files, renamed at its def;
    signature: the last parameter (no default) of a one-line def called >= 3 times removed; import: a name taken out of a one-line
    `from M import a, N` and written again at its first use; repeat: `, strict=True` added to
    the first two one-line calls of a callee called >= 3 times in the file."""
    out: dict[str, list[dict]] = defaultdict(list)
    files = [(rel, t) for rel, t in sorted(texts.items()) if not rel.startswith("tests_") and not SKIP_PARTS & set(rel.split("/"))]
    rng.shuffle(files)
    tops = {rel.split("/")[0] for rel in texts}
    imported = Counter(w for t in texts.values() for m in re.finditer(r"^\s*from \S+ import (.+)$", t, re.MULTILINE)
                       for w in re.findall(r"\w+", m.group(1)))

    def one(kind, rel, text, changes):  # changes: [(line, new line text)] in order
        lines = text.split("\n")
        steps, cur = [], list(lines)
        for ln, new in changes:
            steps.append((ln, cur[ln], new))
            cur[ln] = new
        line = steps[-1][0]
        out[kind].append({"kind": kind, "path": rel, "before": text, "steps": steps, "line": line})

    for rel, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.split("\n")
        for node in tree.body:
            if len(out["rename"]) < n and isinstance(node, (ast.FunctionDef, ast.ClassDef)) and imported[node.name] >= 2:
                ln = node.lineno - 1 + len(node.decorator_list)
                if f" {node.name}" in lines[ln]:
                    one("rename", rel, text, [(ln, lines[ln].replace(f" {node.name}", f" {node.name}_renamed", 1))])
            elif len(out["signature"]) < n and isinstance(node, ast.FunctionDef) and node.lineno == node.body[0].lineno - 1 \
                    and node.args.args and not node.args.vararg and not node.args.kwarg and not node.decorator_list \
                    and sum(len(re.findall(rf"(?<![\w.]){node.name}\(", t)) for t in texts.values()) >= 4:  # 3 calls
                header = lines[node.lineno - 1]
                i, j = header.find("("), header.rfind(")")
                params = _split_params(header[i + 1:j])
                if i > 0 and j > i and params and params[-1].strip() and "*" not in header[i:j] \
                        and "=" not in params[-1] and params[-1].split(":")[0].strip() not in ("self", "cls"):
                    one("signature", rel, text, [(node.lineno - 1, header[:i + 1] + ",".join(params[:-1]).strip() + header[j:])])
        for node in tree.body:
            if len(out["import"]) < n and isinstance(node, ast.ImportFrom) and node.lineno == node.end_lineno \
                    and len(node.names) > 1 and node.names[-1].asname is None \
                    and (node.level or (node.module or "").split(".")[0] in tops):  # a workspace module's name
                name = node.names[-1].name
                imp = lines[node.lineno - 1]
                use = next((u.lineno - 1 for u in ast.walk(tree) if isinstance(u, ast.Name) and u.id == name
                            and len(re.findall(rf"\b{name}\b", lines[u.lineno - 1])) == 1), None)
                if use is None or "(" in imp or use <= node.lineno - 1:
                    continue
                cut = imp[:imp.rindex(name)].rstrip().rstrip(",")
                before = lines[:node.lineno - 1] + [cut] + lines[node.lineno:]
                before[use] = re.sub(rf"\b{name}\b", "None", before[use])
                one("import", rel, "\n".join(before), [(use, lines[use])])
                break
        if len(out["repeat"]) < n:
            for callee, calls in _calls_by_callee(tree).items():
                one_line = [c for c in calls if c.lineno == c.end_lineno and lines[c.lineno - 1].count(callee + "(") == 1]
                if len(calls) < 3 or one_line[:2] != calls[:2] or calls[0].lineno == calls[1].lineno \
                        or not all(c.args or c.keywords for c in calls[:2]) or "strict" in text:
                    continue
                ch = []
                for c in calls[:2]:
                    ln, e = c.lineno - 1, c.end_col_offset - 1
                    b = lines[ln].encode()
                    ch.append((ln, (b[:e] + b", strict=True" + b[e:]).decode("utf-8", "replace")))
                one("repeat", rel, text, ch)
                break
        if all(len(out[k]) >= n for k in ("rename", "signature", "import", "repeat")):
            break
    return [t for k in ("rename", "signature", "import", "repeat") for t in out[k][:n]]


def _utf16(s: str) -> int:
    """LSP's default column unit: UTF-16 code units."""
    return len(s.encode("utf-16-le")) // 2


def follow_latency(roots: list[Path], n: int, files: int, seed: int) -> dict:
    """Each task through a real `completer-lsp` (stdio) whose workspace holds `files` Python files:
    the file opened with the text before, the user's edits sent as didChange, then
    completer/nextEdit at the cursor as an editor asks after its debounce (next_edit_debounce_ms,
    not counted); latency from the last didChange sent to the answer, per kind and in all: p50,
    p90, and the share answered with a suggestion (edits or a jump). Waits first for the engine
    and the index (the models' load and the index's walk are not what is timed)."""
    ws = Path(tempfile.mkdtemp(prefix="next_edit_ws_"))
    texts = _workspace(roots, ws, files)
    count = len(list(ws.rglob("*.py")))
    tasks = _latency_tasks(texts, n, random.Random(seed))
    exe = Path(sys.executable).parent / "completer-lsp"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "lsp.server"]
    lsp = LspClient(argv, dict(os.environ, PYTHONPATH=str(ROOT)))
    lsp.request("initialize", {"processId": None, "rootUri": ws.as_uri(), "capabilities": {}, "initializationOptions": {}})
    lsp.notify("initialized", {})
    end = time.monotonic() + 600
    while True:
        st = lsp.request("completer/stats", {}).get("result") or {}
        if st.get("engine") == "ready" and (st.get("workspace") or {}).get("complete"):
            break
        if time.monotonic() > end:
            raise SystemExit(f"the language server was not ready in 600 s: {st.get('engine')}, {st.get('workspace')}")
        time.sleep(0.2)
    indexed = st["workspace"]["files"]
    rows = []
    for t in tasks:
        uri = (ws / t["path"]).as_uri()
        lsp.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                             "text": t["before"]}})
        lsp.request("completer/stats", {})  # the open handled before the edits are timed
        for v, (ln, old, new) in enumerate(t["steps"], 2):
            if v == len(t["steps"]) + 1:
                t0 = time.perf_counter()
            lsp.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": v}, "contentChanges": [
                {"range": {"start": {"line": ln, "character": 0}, "end": {"line": ln, "character": _utf16(old)}},
                 "text": new}]})
        r = lsp.request("completer/nextEdit", {"textDocument": {"uri": uri},
                                               "position": {"line": t["line"], "character": _utf16(t["steps"][-1][2])}})
        ms = (time.perf_counter() - t0) * 1e3
        res = r.get("result") or {}
        rows.append({"kind": t["kind"], "ms": ms, "shown": bool(res.get("edits") or res.get("jump")),
                     "source": res.get("source"), "reason": res.get("reason")})
        lsp.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        time.sleep(1.1)  # past the history's pause: the next task's edits are an event of their own
    lsp.close()
    subprocess.run(["rm", "-rf", str(ws)], check=False)

    def pct(ms: list[float]) -> dict:
        if not ms:
            return {"n": 0}
        ms = sorted(ms)
        q = lambda p: round(ms[min(len(ms) - 1, int(p * len(ms)))], 1)
        return {"n": len(ms), "p50_ms": q(0.5), "p90_ms": q(0.9), "max_ms": round(ms[-1], 1)}

    out = {"workspace_files": count, "indexed": indexed, "cpu": machine()}
    for kind in ("rename", "signature", "import", "repeat", None):
        rs = [r for r in rows if kind is None or r["kind"] == kind]
        if rs:
            out[kind or "all"] = {**pct([r["ms"] for r in rs if r["shown"]]), "shown": round(sum(r["shown"] for r in rs) / len(rs), 3),
                                  "all_requests": pct([r["ms"] for r in rs]),
                                  "sources": dict(Counter(r["source"] or r["reason"] for r in rs))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="tasks per kind (quality), or speed tasks")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--noop", type=int, default=10, help="tasks per kind whose region has no other site")
    ap.add_argument("--sdists", type=Path, help="a folder holding the packages' sdists (else pip downloads them)")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--next-edit-model", help="next_edit_model: a model of its own writes the rewrites (the pair, "
                                              "--target/--draft or the embedded one, is loaded beside it)")
    ap.add_argument("--format", help="next_edit_format (default: completer for the embedded pair, else auto)")
    ap.add_argument("--rename", choices=("first", "fallback", "off"), default="first",
                    help="the syntax tree's rename: before the model (the default), where the model gives nothing, never")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--lsp", type=int, default=0, metavar="N")
    ap.add_argument("--follow", type=int, default=0, metavar="N",
                    help="N tasks per kind and package: renames and parameter removals followed through the "
                         "repository (completer/edits/follow.py) against jedi (pip install jedi) and ast")
    ap.add_argument("--follow-kinds", default=",".join(FOLLOW_KINDS), help="--follow's kinds (default: all)")
    ap.add_argument("--latency", type=int, default=0, metavar="N",
                    help="N edits per kind (rename, signature, import, repeat) timed through completer-lsp in a "
                         "workspace of --files Python files: edit to the first next-edit suggestion, p50/p90")
    ap.add_argument("--files", type=int, default=1000, help="--latency's workspace size (Python files)")
    ap.add_argument("--calibrate", action="store_true",
                    help="first choose the next-edit gate's threshold on the stdlib's held-out split (see calibrated) "
                         "and write it to --target's config.json as completer_next_edit_min_confidence; the "
                         "quality run on the packages' code then has it in force")
    ap.add_argument("--min-confidence", type=float, metavar="T",
                    help="next_edit_min_confidence for the quality run (default: the model's calibration; 0: off, "
                         "every answer with its score: model_by_confidence)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "next_edit.json")
    a = ap.parse_args()
    if a.calibrate and not (a.target or a.next_edit_model):
        ap.error("--calibrate writes to a model's config.json: give --target (and --draft), or --next-edit-model")
    work = Path(tempfile.mkdtemp(prefix="next_edit_"))
    if a.latency:
        res = {"packages": list(PACKAGES),
               "latency": follow_latency(fetch(list(PACKAGES), a.sdists, work), a.latency, a.files, a.seed)}
        out = a.out if a.out != ap.get_default("out") else ROOT / "runs" / "next_edit_latency.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
        subprocess.run(["rm", "-rf", str(work)], check=False)
        return 0
    if a.follow:
        unknown = set(a.follow_kinds.split(",")) - set(FOLLOW_KINDS)
        if unknown:
            ap.error(f"--follow-kinds: unknown {', '.join(sorted(unknown))} (kinds: {', '.join(FOLLOW_KINDS)})")
        res = {"packages": list(PACKAGES), "follow": follow_quality(fetch(list(PACKAGES), a.sdists, work), a.follow, a.seed,
                                                                  tuple(a.follow_kinds.split(",")))}
        out = a.out if a.out != ap.get_default("out") else ROOT / "runs" / "next_edit_follow.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
        subprocess.run(["rm", "-rf", str(work)], check=False)
        return 0
    files = sources(fetch(list(PACKAGES), a.sdists, work))
    print(f"# {len(files)} files from {', '.join(PACKAGES)}; CPU: {machine()}", file=sys.stderr)
    global FORMAT, RENAME
    FORMAT = a.format or ("auto" if a.target or a.next_edit_model else "completer")
    RENAME = "off" if a.speed else a.rename  # speed: the model's rewrites, timed
    if a.lsp and a.rename != "first":
        raise SystemExit("--lsp measures the server's defaults: --rename is for the quality run")
    opts = {k: v for k, v in (("target", a.target), ("draft", a.draft), ("next_edit_model", a.next_edit_model)) if v}
    res = {"cpu": machine(), "packages": list(PACKAGES), "models": opts or "embedded pair", "format": FORMAT,
           "rename": RENAME}
    if a.lsp:
        tasks = [t for ts in make_tasks(files, RENAMES, (a.lsp + 1) // 2, a.seed, False).values() for t in ts]
        res["lsp"] = lsp_latency(tasks[:a.lsp], {**opts, "next_edit_format": FORMAT})
    else:
        from completer.pipeline import make_engine

        engine = make_engine(**opts)
        engine.warm_start()
        if a.speed:
            tasks = [t for ts in make_tasks(files, RENAMES, (a.n + 1) // 2, a.seed, False, below=36,
                                            lines=(20, 40)).values() for t in ts]
            res["speed"] = speed(engine, tasks)
        else:
            kinds = a.kinds.split(",")
            if a.calibrate:
                res["calibration"] = calibrate(engine, Path(a.next_edit_model or a.target), kinds, a.n, a.noop, a.seed)
                engine.close()
                engine = make_engine(**opts)  # the model as the product loads it: the new calibration in force
                engine.warm_start()
            if a.min_confidence is not None:
                engine.reconfigure(next_edit_min_confidence=a.min_confidence)
            q = quality(engine, make_tasks(files, kinds, a.n, a.seed, False),
                        make_tasks(files, kinds, a.noop, a.seed + 1, True))
            rn = [q[k] for k in RENAMES if q.get(k, {}).get("tasks")]
            if rn:
                n = sum(r["tasks"] for r in rn)
                q["rename_propagation"] = {"tasks": n, "exact": round(sum(r["exact"] * r["tasks"] for r in rn) / n, 3),
                                           "model_exact": round(sum(r["model_exact"] * r["tasks"] for r in rn) / n, 3)}
            if any(q.get(k, {}).get("tasks") for k in kinds):  # every kind together
                q["model_by_confidence"] = gate_table(q, kinds)
                q["noop_model_confidence"] = sorted(c for k in kinds for c in q.get(k, {}).get("noop_model_confidence", ()))
            q["next_edit_min_confidence_in_force"] = engine.stats().get("next_edit_min_confidence_in_force")
            res["quality"] = q
        engine.close()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
