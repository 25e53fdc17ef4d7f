"""Hole punching on held-out code: remove the rest of a line or a whole block from files the models
never trained on (stdlib email/, json/, asyncio/), ask the same engine to fill it twice — with the
raw prefix/suffix prompt, and through the syntax-aware pipeline — and compare what would land in
the editor: exact match, edit similarity, insertions that add parse errors, insertions that
duplicate the suffix, prompt tokens, latency.

    python bench/holes.py --n 40 [--target DIR --draft DIR] [--max-new-tokens 48]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from difflib import SequenceMatcher
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from completer.documents import parse_snapshot
from completer.pipeline import CompletionOptions, complete_at, make_engine
from completer.syntax import SyntaxOptions
from completer.syntax.postprocess import error_count
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


def make_holes(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    files = [p for p in corpus_files(split="heldout") if "/test" not in p.as_posix()]
    holes = []
    while len(holes) < n:
        p = rng.choice(files)
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
        holes.append({"file": p.as_posix(), "kind": kind, "text": text[:s] + text[e:], "offset": s,
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


def run(args) -> dict:
    engine = make_engine(None, target=args.target, draft=args.draft, max_new_tokens=args.max_new_tokens,
                         device=args.device)
    opts = CompletionOptions(max_new_tokens=args.max_new_tokens, syntax=SyntaxOptions())
    rows = []
    for i, h in enumerate(make_holes(args.n, args.seed)):
        text, off = h["text"], h["offset"]
        t0 = time.perf_counter()
        raw = engine.complete(text[:off], text[off:], doc_key="raw:" + h["file"], max_new=args.max_new_tokens)
        raw_ms = (time.perf_counter() - t0) * 1e3
        res = complete_at(engine, text, off, language="python", doc_key="syn:" + h["file"], options=opts)
        rows.append({"file": h["file"], "kind": h["kind"], "middle": h["middle"],
                     "raw": {"text": raw.text, "prompt_tokens": raw.to_json()["prompt_tokens"], "ms": raw_ms,
                             **score(h, raw.text)},
                     "syntax": {"text": res.text, "gate": res.stats["gate"],
                                "prompt_tokens": res.stats.get("engine", {}).get("prompt_tokens", 0),
                                "tokens_saved": res.stats.get("tokens_saved", 0),
                                "ms": res.stats.get("total_ms", res.stats.get("syntax_ms", 0.0)),
                                **score(h, res.text)}})
        print(f"\r{i + 1}/{args.n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {"n": len(rows), "target": args.target or "embedded default", "draft": args.draft or "embedded default",
            "max_new_tokens": args.max_new_tokens, "seed": args.seed,
            "summary": {kind: summarize(rows, kind) for kind in ("all", "line", "block")}, "holes": rows}


def summarize(rows: list[dict], kind: str) -> dict:
    sel = [r for r in rows if kind == "all" or r["kind"] == kind]
    out = {}
    for variant in ("raw", "syntax"):
        v = [r[variant] for r in sel]
        nonempty = [x for x in v if not x["empty"]]
        pct = lambda xs, k: round(100 * sum(x[k] for x in xs) / len(xs), 1) if xs else 0.0
        out[variant] = {
            "holes": len(v), "exact_%": pct(v, "exact"),
            "similarity": round(statistics.fmean(x["similarity"] for x in v), 3) if v else 0.0,
            "adds_parse_errors_%": pct(nonempty, "parse_error"), "dup_suffix_%": pct(nonempty, "dup_suffix"),
            "empty_%": pct(v, "empty"),
            "prompt_tokens_mean": round(statistics.fmean(x["prompt_tokens"] for x in v), 1) if v else 0.0,
            "latency_ms_p50": round(statistics.median(x["ms"] for x in v), 1) if v else 0.0}
    return out


def print_table(report: dict) -> None:
    cols = ["exact_%", "similarity", "adds_parse_errors_%", "dup_suffix_%", "empty_%", "prompt_tokens_mean",
            "latency_ms_p50"]
    print(f"holes on held-out stdlib (email/, json/, asyncio/): n={report['n']}, target={report['target']}")
    print(f"{'kind':6} {'prompt':7} " + " ".join(f"{c:>20}" for c in cols))
    for kind, s in report["summary"].items():
        for variant in ("raw", "syntax"):
            print(f"{kind:6} {variant:7} " + " ".join(f"{s[variant][c]:>20}" for c in cols))


def plot(report: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    s = report["summary"]["all"]
    keys = ["exact_%", "adds_parse_errors_%", "dup_suffix_%", "empty_%"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], [s["raw"][k] for k in keys], 0.4, label="raw prompt")
    ax.bar([x + 0.2 for x in xs], [s["syntax"][k] for k in keys], 0.4, label="syntax pipeline")
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
