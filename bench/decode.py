"""Decode speed of model pairs through the engine's public API, side by side in one run: for each
pair, `Engine.complete_ids` on the same held-out prompts (stdlib held-out split and a PyPI
package: bench/heldout.py), plain (drafter none) and speculative (the default drafter), greedy,
`--new` tokens after a prompt of `--depth` tokens; decode ms/token = (total - time to first token)
/ (new tokens - 1), medians over prompts; pairs and modes alternate prompt by prompt so that a
phase of the machine hits all alike. Nothing else should run meanwhile (no training).

    python bench/decode.py --pair new=DIR/target,DIR/draft --pair old=DIR/target,DIR/draft [--n 12]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from heldout import fim_holes
from record import cpu_model, write

from completer.config import EngineConfig
from completer.engine.engine import Engine

OUT = Path(__file__).resolve().parent / "out"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", action="append", default=[], help="NAME=TARGET_DIR,DRAFT_DIR (default: the embedded pair)")
    ap.add_argument("--n", type=int, default=12, help="prompts")
    ap.add_argument("--depth", type=int, default=400, help="prompt tokens")
    ap.add_argument("--new", type=int, default=48, help="tokens generated (a prompt whose answer ends sooner is skipped)")
    ap.add_argument("--out", type=Path, default=OUT / "decode.json")
    a = ap.parse_args()
    pairs = [(p.split("=", 1)[0], *p.split("=", 1)[1].split(",")) for p in a.pair] or [("embedded", None, None)]
    engines = {}
    for name, target, draft in pairs:
        engines[name, "plain"] = Engine(EngineConfig(target=target, draft=draft, drafter="none"))
        engines[name, "speculative"] = Engine(EngineConfig(target=target, draft=draft))
    for e in engines.values():
        e.warm_start()
    holes = fim_holes(4 * a.n, seed=0)
    ms: dict[tuple[str, str], list[float]] = {k: [] for k in engines}
    tau: dict[tuple[str, str], list[float]] = {k: [] for k in engines}
    rounds: dict[tuple[str, str], list[tuple[int, int, int]]] = {k: [] for k in engines}  # proposed, accepted, verifies
    used = 0
    for h in holes:
        if used >= a.n:
            break
        rows = {}
        for (name, mode), e in engines.items():
            ids = e.tok.encode(h.prefix, add_special_tokens=False).ids[-a.depth:]
            if len(ids) < a.depth // 2:
                break
            e.forget("bench")
            out, st = e.complete_ids(ids, doc_key="bench", max_new=a.new)
            if len(out) < a.new:
                break  # an answer that ends early (EOS) has no decode speed to compare
            rows[name, mode] = ((st.total_ms - st.ttft_ms) / (len(out) - 1), st.accepted_per_forward,
                                (st.proposed, st.accepted, st.target_forwards))
        if len(rows) < len(engines):
            continue
        used += 1
        for k, (v, t, r) in rows.items():
            ms[k].append(v)
            tau[k].append(t)
            rounds[k].append(r)
        print(f"\r{used}/{a.n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    report = {"prompts": used, "depth": a.depth, "new": a.new,
              "rows": {f"{n} {m}": {"ms_per_token_median": round(statistics.median(ms[n, m]), 3),
                                    "tau_median": round(statistics.median(tau[n, m]), 2)}
                       for (n, m) in engines if ms[n, m]},
              "per_prompt": {f"{n} {m}": [round(v, 3) for v in ms[n, m]] for (n, m) in engines if ms[n, m]}}
    print(f"decode through Engine.complete_ids, {used} held-out prompts of {a.depth} tokens, {a.new} new, "
          f"greedy; CPU: {cpu_model()}")
    base = next(iter(report["rows"].values()))["ms_per_token_median"] if report["rows"] else 0
    for k, r in report["rows"].items():
        print(f"{k:24} {r['ms_per_token_median']:8.3f} ms/token  τ {r['tau_median']:5.2f}  "
              f"{r['ms_per_token_median'] / base:5.2f}x the first row")
    report["where_the_time_goes"] = spent = {n: time_spent(engines[n, "speculative"], rounds[n, "speculative"])
                                             for n, _, _ in pairs if rounds[n, "speculative"]}
    for n, w in spent.items():
        print(f"{n}: {w['drafts_per_round']:.2f} drafts a round, {w['accepted_share']:.0%} accepted; a draft token "
              f"costs {w['draft_token_steps']:.3f} target steps, the verify {w['verify_steps']:.2f}: a round "
              f"{w['round_steps']:.2f} steps for {w['tokens_per_round']:.2f} tokens = {w['modelled_ratio']:.2f}x plain's "
              f"ms/token (modelled, the catch-ups and the loop left out)")
    print(f"wrote {write('decode', report, threads=EngineConfig().decode_threads, path=a.out)}")
    return 0


def time_spent(engine: Engine, rounds: list[tuple[int, int, int]]) -> dict:
    """What a speculative round costs in target steps, from the engine's own calibration
    (calibrate.measure_step_costs: c, one draft token; verify[k], a forward over k + 1 rows) and
    the drafts these prompts proposed and had accepted: the ceiling speculation has on this pair.
    Plain decoding is one step a token; below 1.0 drafting pays."""
    c, verify = engine.step_costs
    proposed, accepted, verifies = (sum(r[i] for r in rounds) for i in range(3))
    k = proposed / verifies if verifies else 0.0
    lo = min(int(k), len(verify) - 1) if verify else 0
    hi = min(lo + 1, len(verify) - 1) if verify else 0
    v = (verify[lo] + (verify[hi] - verify[lo]) * (k - lo)) if verify else 1.0 + 0.1 * k
    per_round = (accepted + verifies) / verifies if verifies else 1.0
    return {"drafts_per_round": round(k, 3), "accepted_share": round(accepted / proposed, 3) if proposed else 0.0,
            "draft_token_steps": round(c, 4), "verify_steps": round(v, 3), "round_steps": round(c * k + v, 3),
            "tokens_per_round": round(per_round, 3), "modelled_ratio": round((c * k + v) / per_round, 3),
            "verify_costs": [round(x, 3) for x in verify or []]}


if __name__ == "__main__":
    raise SystemExit(main())
