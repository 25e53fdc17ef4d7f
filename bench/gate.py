"""What lands in the editor, on code the models never trained on, and the confidence gate's
trade-off: precision of what is shown against the share of requests that show anything.

Holes as a user's cursor sees them (the rest of a line, cut a few characters in: holes.line_hole)
in real packages' sources (PyPI sdists, bench/heldout.py's PACKAGES) are completed through the path
`completer complete FILE --line L --col C` takes: the syntax layer, the workspace index rooted at the
package, the engine with every default but `min_confidence`, which is swept. Each pair
(`--pair NAME=TARGET_DIR,DRAFT_DIR`; default the embedded pair) is measured on the same holes.
Per threshold: share shown; among shown: exact first line, wrong from the first character, characters
kept (the expected text's longest prefix the shown text starts with, over all expected characters of
shown holes); and over all holes the expected characters the user got (`chars_got_%`).

`--calibrate` sweeps the same on the stdlib's held-out split (the training domain, never trained on),
picks the lowest threshold at which wrong-from-the-first-character ≤ exact among shown (the highest
share shown that allows it) and writes it to the first pair's target config.json as
`completer_min_confidence` (completer/confidence.py). Quality is then read on the PyPI holes.

    python bench/gate.py --n 60 --sdists /tmp/sdists [--pair old=DIR/target,DIR/draft] [--calibrate]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

from heldout import PACKAGES, SKIP_PARTS, fetch  # bench/, the script's directory
from holes import line_hole
from record import cpu_model, write
from report import draw, gate_figure

from completer.config import EngineConfig
from completer.pipeline import CompletionOptions, complete_at, make_engine
from completer.workspace import WorkspaceIndex, find_root
from draft_models import DEFAULT_TARGET
from draft_models.data import corpus_files, read_source

OUT = Path(__file__).resolve().parent / "out"
THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def make_line_holes(n: int, seed: int, files: list[tuple[str, Path, Path]]) -> list[dict]:
    """`n` holes: (file shown, path, workspace root), the text without the rest of one line."""
    rng = random.Random(seed)
    holes = []
    while len(holes) < n:
        name, p, root = rng.choice(files)
        text = read_source(p)
        span = line_hole(text, rng) if len(text) >= 200 else None
        if span is None or not text[span[0]:span[1]].strip():
            continue
        s, e = span
        holes.append({"file": name, "path": str(p), "root": str(root), "text": text[:s] + text[e:],
                      "offset": s, "middle": text[s:e]})
    return holes


def pypi_files(sdists: Path | None, into: Path) -> list[tuple[str, Path, Path]]:
    out = []
    for root in fetch(list(PACKAGES), sdists, into):
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            if not SKIP_PARTS & set(rel.parts) and p.stat().st_size >= 800:
                out.append((f"{root.name}/{rel.as_posix()}", p, root))
    return out


def heldout_files() -> list[tuple[str, Path, Path]]:
    return [(p.as_posix(), p, find_root(p)) for p in corpus_files(split="heldout") if "/test" not in p.as_posix()]


def judge(middle: str, shown: str) -> dict:
    """One completion against the expected rest of the line."""
    want = middle.split("\n", 1)[0].rstrip()
    got = shown.split("\n", 1)[0].rstrip()
    keep = 0
    while keep < min(len(want), len(got)) and want[keep] == got[keep]:
        keep += 1
    return {"shown": bool(got.strip()), "exact": bool(got.strip()) and got == want,
            "wrong_first": bool(got.strip()) and not want.startswith(got[:1]), "kept": keep if got.strip() else 0,
            "want": len(want)}


def sweep(engine, holes: list[dict], thresholds, indexes: dict) -> dict:
    """Each hole at each threshold, through complete_at (the CLI's path), the engine reconfigured
    between thresholds. → {threshold: [judge + text, ms, confidence]}."""
    rows: dict[float, list[dict]] = {t: [] for t in thresholds}
    for i, h in enumerate(holes):
        root = h["root"]
        if root not in indexes:
            indexes[root] = WorkspaceIndex(root, count_tokens=engine.count_tokens)
            indexes[root].build()
        for t in thresholds:
            engine.reconfigure(min_confidence=t)
            c = complete_at(engine, h["text"], h["offset"], language="python", doc_key=h["path"],
                            options=CompletionOptions(max_new_tokens=engine.cfg.max_new_tokens),
                            workspace=indexes[root], path=h["path"])
            rows[t].append({**judge(h["middle"], c.text), "text": c.text, "ms": round(c.total_ms, 1),
                            "confidence": c.confidence, "new_tokens": c.new_tokens,
                            "dropped": c.syntax.dropped.rule if c.syntax and c.syntax.dropped else None})
        print(f"\r{i + 1}/{len(holes)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def summarize(rows: list[dict]) -> dict:
    shown = [r for r in rows if r["shown"]]
    n, s = len(rows), len(shown)
    pct = lambda a, b: round(100 * a / b, 1) if b else 0.0
    return {"holes": n, "shown_%": pct(s, n), "exact": sum(r["exact"] for r in shown),
            "wrong_first": sum(r["wrong_first"] for r in shown),
            "exact_of_shown_%": pct(sum(r["exact"] for r in shown), s),
            "wrong_first_of_shown_%": pct(sum(r["wrong_first"] for r in shown), s),
            "chars_kept_of_shown_%": pct(sum(r["kept"] for r in shown), sum(r["want"] for r in shown)),
            "chars_got_%": pct(sum(r["kept"] for r in rows), sum(r["want"] for r in rows)),
            "exact_of_all_%": pct(sum(r["exact"] for r in rows), n),
            "decode_tokens": sum(r["new_tokens"] for r in rows),
            "ms_p50": sorted(r["ms"] for r in rows)[n // 2] if rows else 0.0}


def calibrated(table: dict[float, dict]) -> float:
    """The lowest threshold whose shown completions are no more often wrong from the first
    character than exact (the goal of issue 36), else the highest swept."""
    for t in sorted(table):
        if table[t]["wrong_first"] <= table[t]["exact"] and table[t]["shown_%"] > 0:
            return t
    return max(table)


def print_table(title: str, tables: dict[str, dict[float, dict]]) -> None:
    cols = ["shown_%", "exact", "wrong_first", "exact_of_shown_%", "wrong_first_of_shown_%",
            "chars_kept_of_shown_%", "chars_got_%", "exact_of_all_%", "decode_tokens", "ms_p50"]
    print(title)
    print(f"{'pair':10} {'min_conf':>8} " + " ".join(f"{c:>12.12}" for c in cols))
    for name, table in tables.items():
        for t, s in table.items():
            print(f"{name:10} {t:>8} " + " ".join(f"{s[c]:>12}" for c in cols))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60, help="holes (each at every threshold)")
    ap.add_argument("--pair", action="append", default=[],
                    help="NAME=TARGET_DIR,DRAFT_DIR (repeatable; default: embedded=the embedded pair)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sdists", type=Path, help="a folder holding the sdists (else pip downloads them)")
    ap.add_argument("--calibrate", action="store_true",
                    help="choose the first pair's threshold on the stdlib's held-out split and write it to its config.json")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    pairs = [(p.split("=", 1)[0], *p.split("=", 1)[1].split(",")) for p in a.pair] or [("embedded", None, None)]
    report: dict = {"n": a.n, "seed": a.seed, "packages": list(PACKAGES), "pairs": {}, "thresholds": a.thresholds}
    with tempfile.TemporaryDirectory() as tmp:
        pypi = make_line_holes(a.n, a.seed, pypi_files(a.sdists, Path(tmp)))
        calib = make_line_holes(a.n, a.seed, heldout_files()) if a.calibrate else []
        tables, cal_tables = {}, {}
        for i, (name, target, draft) in enumerate(pairs):
            engine = make_engine(None, target=target, draft=draft)
            indexes: dict = {}
            if calib and i == 0:
                rows = sweep(engine, calib, a.thresholds, indexes)
                cal_tables[name] = {t: summarize(r) for t, r in rows.items()}
                chosen = calibrated(cal_tables[name])
                cfg_path = Path(target or DEFAULT_TARGET) / "config.json"
                cfg = json.loads(cfg_path.read_text())
                cfg["completer_min_confidence"] = chosen
                cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
                report["calibration"] = {"pair": name, "min_confidence": chosen, "holes": len(calib),
                                         "source": "stdlib held-out split (email/, json/, asyncio/)",
                                         "table": cal_tables[name]}
                print(f"calibrated min_confidence {chosen} for {name}, written to {cfg_path}")
            rows = sweep(engine, pypi, a.thresholds, indexes)
            tables[name] = {t: summarize(r) for t, r in rows.items()}
            report["pairs"][name] = {"target": target or "embedded", "draft": draft or "embedded",
                                     "table": tables[name], "holes": rows[a.thresholds[0]] and [
                                         {**{k: h[k] for k in ("file", "middle")},
                                          **{str(t): rows[t][j] for t in a.thresholds}} for j, h in enumerate(pypi)]}
            engine.close()
    if cal_tables:
        print_table("calibration: stdlib held-out split (training domain, never trained on)", cal_tables)
    print_table(f"held-out PyPI code ({', '.join(PACKAGES)}), {a.n} line holes, CPU: {cpu_model()}", tables)
    path = write("gate", report, threads=EngineConfig().decode_threads, path=a.out / "gate.json")
    print(f"wrote {path}")
    try:
        draw(gate_figure, json.loads(path.read_text())["results"], a.out / "gate.png")  # the record's own figure
        print(f"wrote {a.out / 'gate.png'}")
    except ImportError:  # matplotlib is a dev extra
        pass


if __name__ == "__main__":
    main()
