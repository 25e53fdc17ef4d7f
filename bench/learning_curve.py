"""The embedded pair's learning curve from its build log (draft_models/default/train_log.txt):
training loss (a moving mean over the logged steps) and held-out loss at each evaluation, against
tokens seen. Tokens per step come from the preset in the log's build summary or `--tokens-per-step`.

    python bench/learning_curve.py [--log draft_models/default/train_log.txt] [--tokens-per-step 2048]
        [--out docs/img/learning_curve.png]
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"\[(target|draft)\] step (\d+)/\d+ loss ([\d.]+)")
EVAL = re.compile(r"\[(target|draft)\] eval step (\d+): (\{.*\})")
RESUME = re.compile(r"\[(target|draft)\] resumed at step (\d+)")


def read(log: Path) -> dict[str, dict[str, list]]:
    """stage → {"train": [(step, loss)], "eval": [(step, loss, acc)]}; a resumed stage's repeated
    steps keep their last value."""
    out: dict[str, dict[str, dict]] = {}
    for line in log.read_text().splitlines():
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    tgt = curves.get("target")
    if not tgt:
        raise SystemExit(f"{a.log}: no target steps")
    mtok = lambda step: (a.tokens_before + step * a.tokens_per_step) / 1e6
    steps, losses = zip(*tgt["train"])
    w = a.smooth
    mean = [sum(losses[max(0, i - w + 1):i + 1]) / len(losses[max(0, i - w + 1):i + 1]) for i in range(len(losses))]
    ax.plot([mtok(s) for s in steps], mean, label=f"training loss (mean of {w} logged steps)")
    if tgt["eval"]:
        es, el, _ = zip(*tgt["eval"])
        ax.plot([mtok(s) for s in es], el, "o-", label="held-out loss (stdlib email/ json/ asyncio/)")
        for s, loss, acc in tgt["eval"]:
            ax.annotate(f"acc {acc:.3f}", (mtok(s), loss), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("embedded target: learning curve")
    ax.legend(fontsize=8)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=120)
    for s, loss, acc in tgt["eval"]:
        print(f"step {s:>6}  tokens {mtok(s):7.2f} M  held-out loss {loss:.4f}  acc {acc:.4f}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
