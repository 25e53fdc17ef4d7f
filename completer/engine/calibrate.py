"""Calibration, measured once at startup (Engine.warm_start), before requests share the cores and
skew it: from how many rows the native step's fp16 products run on AMX-BF16 tiles
(choose_amx_rows), then this machine's step costs for the adaptive draft length
(drafters.AdaptiveK)."""
from __future__ import annotations

import statistics
import time

from ..config import EngineConfig
from .models import Pair
from .runner_factory import make_runner


def measure_step_costs(pair: Pair, ctx: int, cfg: EngineConfig, reps: int = 9) -> tuple[float, list[float]]:
    """(c, verify) in target-step units, as the speculative loop meets them. The unit: a plain step
    taken right after another (what decoding without drafts costs); verify[k]: a target forward
    over k + 1 tokens (k = 0..max_draft_len) taken right after a draft's proposal, whose weights
    and cache displace some of the target's (on the embedded pair with the native step, a verify
    of 4 drafts measured 1.0-1.1 steps timed after other target forwards, 1.4-1.6 after a draft);
    c: one draft token (a greedy proposal is one native call,
    NativeRunner.greedy). All after a context of 3/4 of the window, at most 512 tokens: a
    prompt's usual depth, where attention over the cache is part of each verified row. Medians
    of `reps` rounds, each timing every measurement once (a burst of load on a shared machine
    then hits all alike). A max_draft_len raised later (Engine.reconfigure) has no measurement
    past this one's: AdaptiveK models those verifies linearly."""
    tr = make_runner(pair.target, ctx, cfg.lean, cfg.decode_threads, cfg.kv_cache)
    dr = make_runner(pair.draft, ctx, cfg.lean, kv_cache=cfg.kv_cache) if pair.draft is not None else None
    n = max(cfg.max_draft_len, 1)
    one_call = dr is not None and dr.greedy is not None and cfg.temperature <= 0
    depth = max(1, min(512, 3 * ctx // 4))
    for r in (tr, dr):
        if r is not None:
            r.forward([3 + i % 64 for i in range(depth)])
    times: dict = {"step": [], "draft": [], **{k: [] for k in range(cfg.max_draft_len + 1)}}

    def timed(key, runner, fn) -> None:
        t0 = time.perf_counter()
        fn()
        times[key].append(time.perf_counter() - t0)
        runner.truncate(depth)

    for _ in range(reps):
        tr.forward([5])  # warm: the timed step follows a step, as in plain decoding
        tr.truncate(depth)
        timed("step", tr, lambda: tr.forward([5]))
        for k in range(cfg.max_draft_len + 1):
            if dr is not None:
                timed("draft", dr, (lambda: dr.greedy([5], n)) if one_call else (lambda: dr.forward([5])))
            timed(k, tr, lambda k=k: tr.forward([5] * (k + 1)))
    t0 = statistics.median(times["step"])
    d1 = statistics.median(times["draft"]) / (n if one_call else 1) if dr is not None else 0.0
    verify = [max(statistics.median(times[k]) / t0, 1.0) for k in range(cfg.max_draft_len + 1)]
    for i in range(1, len(verify)):  # a longer verify never costs less (timing noise)
        verify[i] = max(verify[i], verify[i - 1])
    return min(d1 / t0, 1.0), verify


AMX_SIZES = (1, 2, 3, 5, 9, 17)  # forward rows tried: a step, verifies of 1..16 drafts


def amx_threshold(tiles: dict[int, float], registers: dict[int, float]) -> int:
    """The fewest rows from which tiles are never slower than registers at any size measured
    (one past the largest when they lose there too; prefill's longer forwards stay on tiles)."""
    sizes = sorted(tiles)
    start = max(sizes) + 1
    for t in reversed(sizes):
        if tiles[t] > registers[t]:
            break
        start = t
    return start


def choose_amx_rows(pair: Pair, ctx: int, cfg: EngineConfig, reps: int = 5) -> int | None:
    """Where the native step multiplies the target's fp16 weights on AMX-BF16 tiles: time its
    forwards of AMX_SIZES rows both ways, interleaved (medians of `reps`), and set the library's
    threshold (process-wide: a one-thread forward of at least that many rows uses tiles; more
    threads never below 8) to amx_threshold. Why measured, not fixed: on the Intel Xeon VMs a
    lone step was cheaper on tiles in most runs (2.49 vs 3.45 ms/token) and dearer in others
    (3.88 vs 3.13), while from 9 rows tiles won in every run. Returns the threshold, or None
    where it does not apply (no such build, other weights). Results are equal either way up to
    float32 summation order (tests/test_native_amx.py)."""
    from .native_lib import library
    from .native_runner import NativeRunner

    lib = library()[0]
    before = lib.nstep_amxh_rows(-1) if lib is not None else 0
    if before <= 0:
        return None
    tr = make_runner(pair.target, ctx, cfg.lean, cfg.decode_threads, cfg.kv_cache)
    if not isinstance(tr, NativeRunner) or not any(
            getattr(getattr(m, "native", None), "wbf", None) is not None for m in pair.target.layers[0]):
        return None
    depth = max(1, min(512, 3 * ctx // 4) - max(AMX_SIZES))
    tr.forward([3 + i % 64 for i in range(depth)])
    times: dict = {(t, on): [] for t in AMX_SIZES for on in (True, False)}
    try:
        for _ in range(reps):
            for t in AMX_SIZES:
                for on in (True, False):
                    lib.nstep_amxh_rows(1 if on else 0)
                    t0 = time.perf_counter()
                    tr.forward([5] * t)
                    times[(t, on)].append(time.perf_counter() - t0)
                    tr.truncate(depth)
    finally:
        lib.nstep_amxh_rows(before)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = amx_threshold({t: med[(t, True)] for t in AMX_SIZES}, {t: med[(t, False)] for t in AMX_SIZES})
    lib.nstep_amxh_rows(rows)
    return rows
