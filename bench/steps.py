"""The target's decode step on its own: what `decode_threads` and the NumPy step cost, in one run.

    python bench/steps.py [--target DIR] [--quant auto] [--reps 15]
    python bench/steps.py --loop 2000          # only steps, e.g. under `perf record`

1. Median ms of one cached decode step (after a 400-token prompt) on 1 and on 2 torch threads,
   first on an idle machine, then with one core kept busy by a spinning process (an editor, a
   build): the measurement behind EngineConfig.decode_threads' default of 1.
2. Median ms of a forward of T = 1..9 new tokens (a verify of T-1 drafts) through the NumPy step
   vs the torch forward it falls back to for long inputs (NumpyRunner.SHORT), 1 thread vs
   torch's threads: where the routing should switch.
The methods take turns within each repetition, so a drifting machine hits them alike.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch

PROMPT = 400


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _runner(a, threads: int):
    from completer.engine.models import load_pair
    from completer.engine.runner_factory import make_runner

    pair = load_pair(a.target, None, device="cpu", quant=a.quant)  # no target: the embedded pair
    return pair, make_runner(pair.target, PROMPT + 64, True, threads)


def _step_ms(runners: dict, reps: int, steps: int = 20) -> dict:
    out: dict = {k: [] for k in runners}
    for _ in range(reps):
        for name, r in runners.items():
            t0 = time.perf_counter()
            for i in range(steps):
                r.forward([100 + i])
            out[name].append((time.perf_counter() - t0) * 1e3 / steps)
            r.truncate(PROMPT)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="a model directory (default: the embedded target)")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--loop", type=int, help="only run this many decode steps (for a profiler)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    from completer.engine.np_runner import NumpyRunner
    from completer.engine.runner import LlamaRunner
    from completer.engine.runner_factory import make_runner

    pair, one = _runner(a, 1)
    two = make_runner(pair.target, PROMPT + 64, True, 2)
    for r in (one, two):
        r.forward(list(range(10, 10 + PROMPT)))
    if a.loop:
        t0 = time.perf_counter()
        for i in range(a.loop):
            one.forward([100 + i % 50])
            one.truncate(PROMPT)
        print(f"{type(one).__name__} {a.quant}: {a.loop} steps, {(time.perf_counter() - t0) * 1e3 / a.loop:.3f} ms/step")
        return 0
    if not isinstance(one, NumpyRunner):
        raise SystemExit(f"{type(one).__name__}: this model does not take the NumPy step")

    print(f"target {a.target or 'embedded'} --quant {a.quant}: one cached decode step after {PROMPT} tokens, "
          f"median ms over {a.reps} turns")
    idle = _step_ms({"1 thread": one, "2 threads": two}, a.reps)
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        busy = _step_ms({"1 thread": one, "2 threads": two}, a.reps)
    finally:
        stop.set()
        spinner.join(timeout=10)
    for name in idle:
        print(f"  decode_threads={name[0]}: idle {idle[name]:8.3f}   one core busy {busy[name]:8.3f}")

    print(f"forward of T new tokens: NumPy step (1 thread) vs torch forward ({torch.get_num_threads()} threads), "
          "median ms")
    times: dict = {}
    for _ in range(a.reps):
        for T in range(1, 10):
            for name, fwd in (("numpy", one.forward), ("torch", lambda ids: LlamaRunner.forward(one, ids))):
                t0 = time.perf_counter()
                fwd(list(range(100, 100 + T)))
                times.setdefault((T, name), []).append((time.perf_counter() - t0) * 1e3)
                one.truncate(PROMPT)
    for T in range(1, 10):
        np_ms, th_ms = (statistics.median(times[(T, k)]) for k in ("numpy", "torch"))
        print(f"  T={T}: numpy {np_ms:7.3f}  torch {th_ms:7.3f}  torch/numpy {th_ms / np_ms:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
