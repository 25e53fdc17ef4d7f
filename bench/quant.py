"""Quantized targets side by side: weight memory, speed and greedy agreement with the
unquantized target, on held-out code.

    python bench/quant.py [--n 12] [--new 32] [--modes none,fp16,fast-int8,mixed,int8,nf4]

For each `--quant` mode: bytes of weights (packed size for ours, the model's footprint for
bitsandbytes), plain greedy ms/token (our loop, median over prompts), and against the
unquantized target: next-token argmax agreement over the prompts' last 64 positions
(teacher-forced), how many greedy tokens match before the first divergence, and the share of
continuations that are identical. Writes bench/out/quant.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from heldout import fim_holes

OUT = Path(__file__).resolve().parent / "out"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="default: the embedded target")
    ap.add_argument("--n", type=int, default=12, help="prompts")
    ap.add_argument("--new", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--modes", default="none,fp16,fast-int8,mixed,int8,nf4")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from completer.engine.engine import Engine, EngineConfig
    from completer.engine.models import ModelError, load_model, resolve_device
    from completer.engine.quant import model_bytes
    from completer.engine.runner_factory import make_runner
    from completer.engine.sampling import Sampling
    from completer.engine.speculative import generate
    from draft_models import DEFAULT_TARGET

    tdir = a.target or str(DEFAULT_TARGET)
    eng = Engine(EngineConfig(target=tdir, drafter="none"))
    holes = fim_holes(a.n, 0, ("more-itertools",), kind="start")
    prompts = [eng.fim_prompt(h.prefix, h.suffix, a.new) for h in holes]  # the prompt builder's budget
    dev = resolve_device("cpu")

    def run_mode(model):
        logits, outs, ms = [], [], []
        for p in prompts:
            r = make_runner(model, eng.ctx)
            logits.append(r.forward(p)[-64:].float())
            t0 = time.perf_counter()
            ids, _ = generate(make_runner(model, eng.ctx), p, a.new, Sampling(), None, None)
            ms.append((time.perf_counter() - t0) * 1e3 / max(1, len(ids)))
            outs.append(ids)
        return logits, outs, statistics.median(ms)

    rows, ref = {}, None
    for mode in a.modes.split(","):
        t0 = time.perf_counter()
        try:
            model = load_model(tdir, dev, torch.float32, mode)
        except ModelError as e:
            print(f"{mode:10s} unavailable: {e}")
            rows[mode] = {"error": str(e)}
            continue
        load_s = time.perf_counter() - t0
        logits, outs, ms = run_mode(model)
        if ref is None:
            ref = (logits, outs)  # the first mode is the reference (none)
        agree = statistics.mean(float((lg.argmax(-1) == rl.argmax(-1)).float().mean())
                                for lg, rl in zip(logits, ref[0]))
        prefix = []
        for o, r in zip(outs, ref[1]):
            n = 0
            while n < min(len(o), len(r)) and o[n] == r[n]:
                n += 1
            prefix.append(n)
        same = sum(o == r for o, r in zip(outs, ref[1])) / len(outs)
        rows[mode] = {"weight_mb": model_bytes(model) / 2**20, "load_s": load_s, "ms_per_token": ms,
                      "next_token_agreement": agree, "greedy_prefix_match": statistics.mean(prefix),
                      "identical_continuations": same}
        del model

    base = rows.get(a.modes.split(",")[0], {})
    print(f"\n{len(prompts)} held-out FIM prompts, {a.new} greedy tokens; target {tdir}; "
          f"reference = {a.modes.split(',')[0]}")
    hdr = (f"{'mode':10s} {'weights MB':>10s} {'vs ref':>7s} {'ms/tok':>7s} {'next-tok agree':>14s} "
           f"{'greedy prefix':>13s} {'identical':>9s}")
    print(hdr)
    print("-" * len(hdr))
    for mode, r in rows.items():
        if "error" in r:
            continue
        print(f"{mode:10s} {r['weight_mb']:10.1f} {base['weight_mb'] / r['weight_mb']:6.2f}x "
              f"{r['ms_per_token']:7.2f} {r['next_token_agreement']:14.3f} "
              f"{r['greedy_prefix_match']:10.1f}/{a.new} {r['identical_continuations']:9.0%}")
    OUT.mkdir(exist_ok=True)
    (OUT / "quant.json").write_text(json.dumps({"n": len(prompts), "new": a.new, "modes": rows}, indent=2) + "\n")
    print(f"\nwrote {OUT / 'quant.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
