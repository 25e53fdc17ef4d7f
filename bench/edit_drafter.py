"""Speculative edits on the embedded pair: plain greedy decoding vs EditDrafter decoding of the
same outputs, with the original = (a) the output itself (a rewrite that changes nothing) and
(b) the output with a few tokens changed, inserted or deleted (a small edit), plus the target's
verify cost by width — the price of k = 32.

    python bench/edit_drafter.py [--n 8] [--new 96] [--k 32] [--edits 3] [--threads 0]

Prints the CPU, verify(k)/verify(0) for k = 0, 8, 16, 31, 32, 64, and per case the median tokens/s
of each method, its ratio to plain, and τ (tokens per target forward); checks that every
method produced plain decoding's ids.
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time

import torch
from heldout import fim_holes


def cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")


def edited(ids: list[int], n: int, rng: random.Random) -> list[int]:
    o = list(ids)
    for _ in range(n):
        at = rng.randrange(len(o) - 2)
        kind = rng.choice(["change", "insert", "delete"])
        if kind == "change":
            o[at] = o[(at + 7) % len(o)]
        elif kind == "insert":
            o[at:at] = o[at + 1:at + 3]
        else:
            del o[at]
    return o


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8, help="prompts")
    ap.add_argument("--new", type=int, default=96, help="new tokens per prompt (EOS ignored)")
    ap.add_argument("--k", type=int, default=32, help="EditDrafter's longest draft")
    ap.add_argument("--edits", type=int, default=3, help="edits in case (b)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from completer.engine.drafters import EditDrafter
    from completer.engine.engine import Engine, EngineConfig
    from completer.engine.runner_factory import make_runner
    from completer.engine.sampling import Sampling
    from completer.engine.speculative import generate

    print(f"CPU: {cpu()}, torch threads: {torch.get_num_threads()}")
    eng = Engine(EngineConfig())
    runner = make_runner(eng.pair.target, eng.ctx)
    runner.forward(list(range(3, 67)))
    verify_ms: dict[int, float] = {}
    for k in (0, 8, 16, 31, 32, 64):  # the target forward over [cur] + k drafts after a 64-token context
        ts = []
        for _ in range(7):
            t0 = time.perf_counter()
            runner.forward([5] * (k + 1))
            ts.append(time.perf_counter() - t0)
            runner.truncate(64)
        verify_ms[k] = ms = statistics.median(ts) * 1e3
        print(f"verify({k:2d}): {ms:6.2f} ms  = {ms / verify_ms[0]:5.2f} × verify(0)")

    holes = fim_holes(a.n, a.seed, ("more-itertools",), kind="start")
    prompts = [eng.fim_prompt(h.prefix, h.suffix, a.new) for h in holes]  # the prompt builder's budget
    greedy, rng = Sampling(), random.Random(a.seed)

    def run(prompt, drafter):
        k = drafter.adaptive_k() if drafter is not None else None
        t0 = time.perf_counter()
        ids, st = generate(make_runner(eng.pair.target, eng.ctx), prompt, a.new, greedy, drafter, k)
        return ids, st, time.perf_counter() - t0

    run(prompts[0], None)  # warm up (allocator, kernels)
    rows: dict[str, dict[str, list[float]]] = {}
    same = True
    for p in prompts:
        ref, _, dt = run(p, None)
        rows.setdefault("plain", {"tps": [], "tau": []})["tps"].append(len(ref) / dt)
        for name, orig in (("(a) original = output", ref), (f"(b) {a.edits} edits", edited(ref, a.edits, rng))):
            ids, st, dt = run(p, EditDrafter(orig, k=a.k))
            same &= ids == ref
            r = rows.setdefault(name, {"tps": [], "tau": []})
            r["tps"].append(len(ids) / dt)
            r["tau"].append(st.accepted_per_forward)
    plain = statistics.median(rows["plain"]["tps"])
    print(f"{a.n} prompts × {a.new} new tokens, k = {a.k}")
    for name, r in rows.items():
        tps = statistics.median(r["tps"])
        tau = f"{statistics.median(r['tau']):5.1f}" if r["tau"] else "    1"
        print(f"{name:24s} {tps:8.1f} tok/s  {tps / plain:5.2f}×  τ {tau}")
    print("ids equal plain decoding:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
