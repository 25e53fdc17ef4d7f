"""The decode step on its own: the native step vs the NumPy step vs torch, in one run.

    python bench/steps.py [--target DIR] [--quant auto] [--reps 15]
    python bench/steps.py --loop 2000 [--runner numpy] [--rows 9]   # only steps (or verifies), e.g. under `perf record`

1. Median ms of one cached decode step (after a 400-token prompt) on 1 and on 2 threads (and with
   the cache in float32 on 1), first on
   an idle machine, then with one core kept busy by a spinning process (an editor, a build): the
   measurement behind EngineConfig.decode_threads' default of 1.
2. Median ms of a forward of T new tokens (a verify of T-1 drafts) through the native step, the
   NumPy step (its fallback) and the torch forward (prefill's path, past SHORT tokens), and
   verify(k)/step = forward(k+1)/forward(1) per runner: what adaptive k plans with. Where the
   native step runs int8 products on AMX, "no-AMX" is the same step built without it (what
   COMPLETER_NATIVE_AMX=0 gives), side by side; "f32 K/V" is the native step with its cache in
   float32 (EngineConfig.kv_cache = f32; the default keeps fp16).
3. The draft's step (the embedded pair's, head restricted as the engine does) and c = draft
   step / target step per runner.
The methods take turns within each repetition, so a drifting machine hits them alike. The CPU's
name and vector extensions head the output: compare only within one run.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch

PROMPT = 400


def cpu_name() -> str:
    """The CPU's model name and the widest vector extension /proc/cpuinfo reports."""
    from record import cpu_model  # bench/, the script's directory

    from completer_kernels import native

    isa = native.isa_flags(native.cpu_flags())
    return f"{cpu_model()}, {isa[0] if isa else 'no AVX2'}, {torch.get_num_threads()} threads"


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


class _Registers:
    """A native runner whose fp16 products run in registers, not on AMX-BF16 tiles (the library's
    switch around each call), for side-by-side rows."""

    def __init__(self, runner, lib):
        self.runner, self.lib = runner, lib

    def forward(self, ids):
        before = self.lib.nstep_amxh_rows(0)
        try:
            return self.runner.forward(ids)
        finally:
            self.lib.nstep_amxh_rows(before)

    def truncate(self, n: int) -> None:
        self.runner.truncate(n)


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
    ap.add_argument("--runner", default="native", choices=["native", "numpy"], help="the runner --loop steps")
    ap.add_argument("--rows", type=int, default=1, help="tokens per forward in --loop (a verify of rows-1 drafts)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    from completer.engine.engine import Engine, EngineConfig
    from completer.engine.native_lib import cache_dir, library
    from completer.engine.native_runner import NativeRunner
    from completer.engine.np_runner import NumpyRunner
    from completer.engine.runner import LlamaRunner

    lib, isa = library()
    if lib is None:
        raise SystemExit(f"the native step is unavailable here: {isa}")
    # the engine's pair: no target = the embedded one, whose draft's head the engine restricts
    eng = Engine(EngineConfig(target=a.target, quant=a.quant, device="cpu"))
    pair = eng.pair
    os.environ["COMPLETER_NATIVE"] = "0"  # the same model packed for the NumPy step (fbgemm)
    np_pair = Engine(EngineConfig(target=a.target, quant=a.quant, device="cpu")).pair
    del os.environ["COMPLETER_NATIVE"]
    n = PROMPT + 64
    native = {t: NativeRunner(pair.target, lib, n, t) for t in (1, 2)}
    kv32 = NativeRunner(pair.target, lib, n, 1, kv_dtype=torch.float32)  # EngineConfig.kv_cache = f32
    numpy = {t: NumpyRunner(np_pair.target, n, t) for t in (1, 2)}
    for r in (*native.values(), kv32, *numpy.values()):
        r.forward(list(range(10, 10 + PROMPT)))
    if a.loop:
        one = native[1] if a.runner == "native" else numpy[1]
        t0 = time.perf_counter()
        for i in range(a.loop):
            one.forward([100 + (i + j) % 50 for j in range(a.rows)])
            one.truncate(PROMPT)
        print(f"{type(one).__name__} {a.quant}: {a.loop} forwards of {a.rows} tokens, "
              f"{(time.perf_counter() - t0) * 1e3 / a.loop:.3f} ms each")
        return 0

    print(f"CPU: {cpu_name()}; native step built for {isa}")
    print(f"target {a.target or 'embedded'} --quant {a.quant}: one cached decode step after {PROMPT} tokens, "
          f"median ms over {a.reps} turns")
    runners = {f"{kind} {t} thread{'s' * (t > 1)}": d[t] for kind, d in (("native", native), ("numpy", numpy))
               for t in (1, 2)}
    runners["native f32 K/V 1 thread"] = kv32
    amxh = lib.nstep_amxh_rows(-1)
    if amxh > 0:  # fp16 products on AMX-BF16 tiles here: the same runners with them in registers
        for t in (1, 2):
            runners[f"native {t} thread{'s' * (t > 1)}, fp16 in registers"] = _Registers(native[t], lib)
    idle = _step_ms(runners, a.reps)
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    try:
        busy = _step_ms(runners, a.reps)
    finally:
        stop.set()
        spinner.join(timeout=10)
    for name in idle:
        print(f"  {name:36s}: idle {idle[name]:8.3f}   one core busy {busy[name]:8.3f}")

    sizes = [1, 2, 3, 5, 9, 17, 33, 64]
    print(f"forward of T new tokens (a verify of T-1 drafts; past 32, prefill's), 1 thread (torch: "
          f"{torch.get_num_threads()}), median ms; v = forward(T) / forward(1)"
          + ("; 'registers' = the native step with fp16 products in registers instead of AMX-BF16 tiles" if amxh > 0 else ""))
    nat, nump = native[1], numpy[1]
    # torch: the prefill path (torch glue around the same native products)
    fwd = {"native": nat.forward, "f32 K/V": kv32.forward, "numpy": nump.forward,
           "torch": lambda ids: LlamaRunner.forward(nat, ids)}
    run_of = {"native": nat, "f32 K/V": kv32, "numpy": nump, "torch": nat}
    if isa.endswith("+amx"):
        from completer_kernels import native as kn

        vnni, why = kn.load(cache_dir(), kn.cpu_flags() - kn.AMX)
        if vnni is None:
            raise SystemExit(f"the build without AMX failed: {why}")
        run_of["no-AMX"] = NativeRunner(pair.target, vnni, n, 1)
        run_of["no-AMX"].forward(list(range(10, 10 + PROMPT)))
        fwd["no-AMX"] = run_of["no-AMX"].forward
    if amxh > 0:
        fwd["registers"], run_of["registers"] = _Registers(nat, lib).forward, nat
    times: dict = {}
    for _ in range(a.reps):
        for T in sizes:
            for name, f in fwd.items():
                r = run_of[name]
                t0 = time.perf_counter()
                f(list(range(100, 100 + T)))
                times.setdefault((T, name), []).append((time.perf_counter() - t0) * 1e3)
                r.truncate(PROMPT)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  {'T':>3s} " + " ".join(f"{n:>9s} {'v':>5s}" for n in fwd))
    for T in sizes:
        print(f"  {T:3d} " + " ".join(f"{med[(T, n)]:9.3f} {med[(T, n)] / med[(1, n)]:5.2f}" for n in fwd))

    if pair.draft is not None:
        d_nat, d_np = NativeRunner(pair.draft, lib, n, 1), NumpyRunner(np_pair.draft, n, 1)
        drafts, targets = {"native": d_nat, "numpy": d_np}, {"native": nat, "numpy": nump}
        if a.target is None:  # the engine stores the draft per draft_quant (int8 here): against the others
            from completer.engine.models import load_model, quantize_draft
            from draft_models import DEFAULT_DRAFT

            for q in ("fp16", "none"):
                dq = load_model(str(DEFAULT_DRAFT), torch.device("cpu"), torch.float32, "none")
                if pair.draft.head_rows:
                    dq.restrict_head(pair.draft.head_rows)
                quantize_draft(dq, q)
                name = f"native, {q if q != 'none' else 'float32'} weights"
                drafts[name], targets[name] = NativeRunner(dq, lib, n, 1), nat
        for r in drafts.values():
            r.forward(list(range(10, 10 + PROMPT)))
        d = _step_ms(drafts, a.reps)
        t = _step_ms(targets, a.reps)
        head = f"head over {len(pair.draft.head_rows)} rows" if pair.draft.head_rows else "full head"
        print(f"draft step ({head}; 'native': stored {eng.draft_quant}), 1 thread: " + ", ".join(
            f"{k} {d[k]:.3f} ms (c = {d[k] / t[k]:.3f} of its target step {t[k]:.3f})" for k in d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
