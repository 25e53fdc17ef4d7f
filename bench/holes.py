"""Hole punching on code the models never trained on: remove the rest of a line or a whole block from
real packages' sources (PyPI sdists unpacked at benchmark time: bench/heldout.py's PACKAGES; with
`--source heldout` the stdlib packages the embedded pair held out instead), ask the same engine to fill it twice — with the
raw prefix/suffix prompt, and through the syntax-aware pipeline — and compare what would land in
the editor: exact match, edit similarity, insertions that add parse errors, insertions that
duplicate the suffix, degenerate text shown, decode tokens spent on completions that show
nothing, prompt tokens, latency. `--no-degenerate-stop` adds the pipeline without the degenerate
stop as a before column.

    python bench/holes.py --n 40 [--sdists DIR] [--target DIR --draft DIR] [--max-new-tokens 48] [--no-degenerate-stop]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from difflib import SequenceMatcher
from pathlib import Path

from heldout import PACKAGES, SKIP_PARTS, fetch  # bench/, the script's directory

from completer.config import OPTIONS
from completer.documents import parse_snapshot
from completer.pipeline import CompletionOptions, complete_at, make_engine
from completer.syntax import SyntaxOptions
from completer.syntax.degenerate import find
from completer.syntax.postprocess import error_count
from completer.syntax.stop import SEEN_CHARS
from draft_models.data import corpus_files, read_source

OUT = Path(__file__).resolve().parent / "out"
BLOCKS = ("function_definition", "if_statement", "for_statement", "while_statement", "with_statement",
          "try_statement")


def line_hole(text: str, rng: random.Random):
    """The rest of a line, from a point after its first token."""
    lines = text.split("\n")
    starts = [0]
    for ln in lines[:-1]:
        starts.append(starts[-1] + len(ln) + 1)
    cands = [i for i, ln in enumerate(lines) if len(ln.strip()) >= 12 and not ln.strip().startswith(("#", '"', "'"))]
    if not cands:
        return None
    i = rng.choice(cands)
    ln = lines[i]
    lead = len(ln) - len(ln.lstrip())
    first = ln.find(" ", lead)
    lo = first + 1 if 0 < first < len(ln) - 4 else lead + 1
    cut = rng.randrange(lo, len(ln) - 2)
    while cut < len(ln) and (ln[cut - 1].isalnum() or ln[cut - 1] == "_") and (ln[cut].isalnum() or ln[cut] == "_"):
        cut += 1  # a hole starts at a token boundary, as a cursor after typing would be
    s = starts[i] + cut
    return s, starts[i] + len(ln)


def block_hole(text: str, rng: random.Random):
    """The whole body of a short block (≤ 8 lines), from its first statement's indentation."""
    snap = parse_snapshot(text, "python")
    found, stack = [], [snap.tree.root_node]
    while stack:
        n = stack.pop()
        stack.extend(n.children)
        body = n.child_by_field_name("body") or n.child_by_field_name("consequence")
        if n.type in BLOCKS and body is not None and 2 <= body.end_point[0] - body.start_point[0] + 1 <= 8:
            found.append(body)
    if not found:
        return None
    body = rng.choice(found)
    src = snap.source
    return len(src[: body.start_byte].decode("utf-8", "replace")), len(src[: body.end_byte].decode("utf-8", "replace"))


def source_files(source: str, sdists: Path | None, into: Path) -> list[tuple[str, Path]]:
    """(name shown, path) of the Python files holes are cut from: the packages' own modules (no
    tests, docs or examples), or the stdlib packages the embedded pair held out (`heldout`)."""
    if source == "heldout":
        return [(p.as_posix(), p) for p in corpus_files(split="heldout") if "/test" not in p.as_posix()]
    out = []
    for root in fetch(list(PACKAGES), sdists, into):
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            if not SKIP_PARTS & set(rel.parts) and p.stat().st_size >= 800:
                out.append((f"{root.name}/{rel.as_posix()}", p))
    return out


def make_holes(n: int, seed: int, files: list[tuple[str, Path]]) -> list[dict]:
    rng = random.Random(seed)
    holes = []
    while len(holes) < n:
        name, p = rng.choice(files)
        text = read_source(p)
        if len(text) < 200:
            continue
        kind = "line" if len(holes) % 2 == 0 else "block"
        span = (line_hole if kind == "line" else block_hole)(text, rng)
        if span is None:
            continue
        s, e = span
        if not text[s:e].strip():
            continue
        holes.append({"file": name, "kind": kind, "text": text[:s] + text[e:], "offset": s,
                      "middle": text[s:e]})
    return holes


def parse_errors(text: str, offset: int, insert: str) -> bool:
    before = error_count(parse_snapshot(text, "python").tree)
    after = error_count(parse_snapshot(text[:offset] + insert + text[offset:], "python").tree)
    return after > before


def duplicates_suffix(insert: str, text: str, offset: int) -> bool:
    """The insertion repeats what follows it: the rest of the cursor line, or the next line."""
    if not insert.strip():
        return False
    nl = text.find("\n", offset)
    tail = text[offset: nl if nl >= 0 else len(text)].strip()
    if tail and insert.rstrip().endswith(tail):
        return True
    after = [ln.strip() for ln in text[offset:].split("\n")[1:] if ln.strip()]
    last = [ln.strip() for ln in insert.split("\n") if ln.strip()]
    return bool(after and last and len(last[-1]) > 1 and last[-1] == after[0])


def score(hole: dict, insert: str) -> dict:
    want = hole["middle"].rstrip()
    got = insert.rstrip()
    return {"exact": got == want, "similarity": SequenceMatcher(None, got, want).ratio() if (got or want) else 1.0,
            "parse_error": parse_errors(hole["text"], hole["offset"], insert),
            "dup_suffix": duplicates_suffix(insert, hole["text"], hole["offset"]), "empty": not got}


def is_degenerate(hole: dict, insert: str) -> bool:
    """The shown text judged by the stop's own detector (completer/syntax/degenerate.py) with the same
    context the stop had: the cursor's line, the line above it and the document around."""
    text, off = hole["text"], hole["offset"]
    s = text.rfind("\n", 0, off) + 1
    above = [ln for ln in text[:s].split("\n") if ln.strip()]
    return find(insert, text[s:off], above[-1] if above else "", text[max(off - SEEN_CHARS, 0):off + SEEN_CHARS]) is not None


def repeats(insert: str) -> bool:
    """An independent, stricter check: a word (with ≤ 3 separators) three times in a row, or the
    same non-blank line twice in a row."""
    lines = [ln.strip() for ln in insert.split("\n")]
    return bool(re.search(r"(\w{2,}\W{0,3})\1\1", insert)) or any(
        a and a == b for a, b in itertools.pairwise(lines))


def variant(hole: dict, comp, ms: float) -> dict:
    return {"text": comp.text, "gate": comp.syntax.gate if comp.syntax else None, "prompt_tokens": comp.prompt_tokens,
            "tokens_saved": comp.syntax.tokens_saved if comp.syntax else 0, "new_tokens": comp.new_tokens,
            "stop_reason": comp.stop_reason, "ms": ms, **score(hole, comp.text),
            "dropped_by": comp.syntax.dropped.rule if comp.syntax and comp.syntax.dropped else None,
            "degenerate": bool(comp.text.strip()) and is_degenerate(hole, comp.text),
            "repeats": bool(comp.text.strip()) and repeats(comp.text)}


def run(args) -> dict:
    engine = make_engine(None, target=args.target, draft=args.draft, max_new_tokens=args.max_new_tokens,
                         device=args.device, kv_cache=args.kv_cache)
    # the syntax layer's time budget as large as the schema allows: under load the default would
    # skip checks on some holes and change the numbers from run to run
    budget = SyntaxOptions(syntax_budget_ms=OPTIONS["syntax_budget_ms"].meta["hi"])
    pipelines = {"syntax": budget}
    if args.no_degenerate_stop:  # the before column, in the same run, on the same engine
        pipelines = {"no-degen": replace(budget, stop_degenerate=False), **pipelines}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        holes = make_holes(args.n, args.seed, source_files(args.source, args.sdists, Path(tmp)))
    for i, h in enumerate(holes):
        text, off = h["text"], h["offset"]
        t0 = time.perf_counter()
        raw = engine.complete(text[:off], text[off:], doc_key="raw:" + h["file"], max_new=args.max_new_tokens)
        row = {"file": h["file"], "kind": h["kind"], "middle": h["middle"],
               "raw": variant(h, raw, (time.perf_counter() - t0) * 1e3)}
        for name, syn in pipelines.items():
            res = complete_at(engine, text, off, language="python", doc_key=f"{name}:{h['file']}",
                              options=CompletionOptions(max_new_tokens=args.max_new_tokens, syntax=syn))
            row[name] = variant(h, res, res.total_ms)
        rows.append(row)
        print(f"\r{i + 1}/{args.n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {"n": len(rows), "source": args.source, "target": args.target or "embedded default", "draft": args.draft or "embedded default",
            "kv_cache": args.kv_cache,
            "max_new_tokens": args.max_new_tokens, "seed": args.seed, "variants": ["raw", *pipelines],
            "summary": {kind: summarize(rows, kind, ["raw", *pipelines]) for kind in ("all", "line", "block")},
            "holes": rows}


def summarize(rows: list[dict], kind: str, variants: list[str]) -> dict:
    sel = [r for r in rows if kind == "all" or r["kind"] == kind]
    out = {}
    for name in variants:
        v = [r[name] for r in sel]
        nonempty = [x for x in v if not x["empty"]]
        pct = lambda xs, k: round(100 * sum(x[k] for x in xs) / len(xs), 1) if xs else 0.0
        out[name] = {
            "holes": len(v), "exact_%": pct(v, "exact"),
            "similarity": round(statistics.fmean(x["similarity"] for x in v), 3) if v else 0.0,
            "adds_parse_errors_%": pct(nonempty, "parse_error"), "dup_suffix_%": pct(nonempty, "dup_suffix"),
            "empty_%": pct(v, "empty"),
            "degenerate_%": pct(nonempty, "degenerate"), "repeats_%": pct(nonempty, "repeats"),
            "decode_tokens": sum(x["new_tokens"] for x in v),
            "wasted_tokens": sum(x["new_tokens"] for x in v if x["empty"]),  # decoded, then nothing shown
            "wasted_by_rule": {r: sum(x["new_tokens"] for x in v if x.get("dropped_by") == r)
                               for r in sorted({x["dropped_by"] for x in v if x.get("dropped_by")})},
            "prompt_tokens_mean": round(statistics.fmean(x["prompt_tokens"] for x in v), 1) if v else 0.0,
            "latency_ms_p50": round(statistics.median(x["ms"] for x in v), 1) if v else 0.0}
    return out


def print_table(report: dict) -> None:
    cols = ["exact_%", "similarity", "adds_parse_errors_%", "dup_suffix_%", "empty_%", "degenerate_%", "repeats_%",
            "decode_tokens", "wasted_tokens", "prompt_tokens_mean", "latency_ms_p50"]
    where = ("held-out stdlib (email/, json/, asyncio/)" if report["source"] == "heldout"
             else "PyPI sdists (" + ", ".join(PACKAGES) + ")")
    print(f"holes on {where}: n={report['n']}, target={report['target']}")
    print("degenerate_%: shown completions the stop's detector flags; repeats_%: an independent check (a word "
          "3x or a line 2x in a row); wasted_tokens: decoded for completions that show nothing")
    print(f"{'kind':6} {'prompt':9} " + " ".join(f"{c:>13.13}" for c in cols))
    for kind, s in report["summary"].items():
        for name in report["variants"]:
            print(f"{kind:6} {name:9} " + " ".join(f"{s[name][c]:>13}" for c in cols))
    wasted = report["summary"]["all"]
    print("wasted tokens by the rule that dropped the completion: " + "; ".join(
        f"{name} {wasted[name]['wasted_by_rule']}" for name in report["variants"] if wasted[name]["wasted_by_rule"]))


def plot(report: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = report["summary"]["all"]
    keys = ["exact_%", "adds_parse_errors_%", "dup_suffix_%", "empty_%", "degenerate_%"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(keys))
    width = 0.8 / len(report["variants"])
    for j, name in enumerate(report["variants"]):
        ax.bar([x - 0.4 + (j + 0.5) * width for x in xs], [s[name][k] for k in keys], width, label=name)
    ax.set_xticks(list(xs), keys)
    ax.set_ylabel("% of holes / insertions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40, help="number of holes (half line, half block)")
    ap.add_argument("--target", help="target model dir (default: the embedded pair)")
    ap.add_argument("--draft", help="draft model dir (default: the embedded pair)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", default="pypi", choices=["pypi", "heldout"],
                    help="pypi: the sdists of bench/heldout.py's PACKAGES; heldout: the stdlib packages the pair held out")
    ap.add_argument("--sdists", type=Path, help="a folder holding those sdists (else pip downloads them)")
    ap.add_argument("--kv-cache", default="f16", choices=["f16", "f32"], help="EngineConfig.kv_cache")
    ap.add_argument("--no-degenerate-stop", action="store_true",
                    help="also run the pipeline without the degenerate stop (the before column)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = run(args)
    print_table(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "holes.json").write_text(json.dumps(report, indent=1))
    png = plot(report, args.out / "holes.png")
    print(f"wrote {args.out / 'holes.json'}" + (f" and {args.out / 'holes.png'}" if png else " (no matplotlib: no PNG)"))


if __name__ == "__main__":
    main()
