"""The embedded pair's learning curve from its build log (draft_models/default/train_log.txt):
training loss (a moving mean over the logged steps) and held-out loss at each evaluation, against
tokens seen. Tokens per step come from the preset in the log's build summary or `--tokens-per-step`.
Writes the curves as bench/out/learning_curve.json (bench/record.py) and draws them to --out with
bench/report.py's figure (the one docs/benchmarks.md shows).

    python bench/learning_curve.py [--log draft_models/default/train_log.txt] [--tokens-per-step 2048]
        [--out docs/img/learning_curve.png]
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from record import write  # bench/, the script's directory
from report import draw, learning_curve_figure, mtok

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"\[(target|draft)\] step (\d+)/\d+ loss ([\d.]+)")
EVAL = re.compile(r"\[(target|draft)\] eval step (\d+): (\{.*\})")
RESUME = re.compile(r"\[(target|draft)\] resumed at step (\d+)")


def read(log: Path) -> dict[str, dict[str, list]]:
    """stage → {"train": [(step, loss)], "eval": [(step, loss, acc)]} of the log's last build (builds
    are separated by `# --- ` lines); a resumed stage's repeated steps keep their last value."""
    out: dict[str, dict[str, dict]] = {}
    for line in re.split(r"^# --- .*$", log.read_text(), flags=re.MULTILINE)[-1].splitlines():
        if m := STEP.search(line):
            out.setdefault(m[1], {"train": {}, "eval": {}})["train"][int(m[2])] = float(m[3])
        elif m := EVAL.search(line):
            ev = json.loads(m[3])
            out.setdefault(m[1], {"train": {}, "eval": {}})["eval"][int(m[2])] = (ev["loss"], ev["acc"])
    return {s: {"train": sorted(d["train"].items()), "eval": sorted((k, *v) for k, v in d["eval"].items())}
            for s, d in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, default=ROOT / "draft_models" / "default" / "train_log.txt")
    ap.add_argument("--tokens-per-step", type=int, default=2 * 1024, help="rows × window of the run")
    ap.add_argument("--tokens-before", type=int, default=0, help="tokens the run's warm start had seen")
    ap.add_argument("--smooth", type=int, default=25, help="logged points in the moving mean")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "learning_curve.png")
    a = ap.parse_args()
    curves = read(a.log)
    if not curves.get("target"):
        raise SystemExit(f"{a.log}: no target steps")
    log = a.log.resolve()
    res = {"log": str(log.relative_to(ROOT) if log.is_relative_to(ROOT) else log), "tokens_per_step": a.tokens_per_step,
           "tokens_before": a.tokens_before, "smooth": a.smooth, "stages": curves}
    path = write("learning_curve", res, threads=None)  # nothing timed: a log read back
    res = json.loads(path.read_text())["results"]  # the figure draws what the record holds
    draw(learning_curve_figure, res, a.out, (6.5, 4))
    for s, loss, acc in res["stages"]["target"]["eval"]:
        print(f"step {s:>6}  tokens {mtok(res, s):7.2f} M  held-out loss {loss:.4f}  acc {acc:.4f}")
    print(f"wrote {path} and {a.out}")


if __name__ == "__main__":
    main()
