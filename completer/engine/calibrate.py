"""Calibration: this machine's step costs for the adaptive draft length (drafters.AdaptiveK),
measured once at startup (Engine.warm_start), before requests share the cores and skew it."""
from __future__ import annotations

import statistics
import time

from ..config import EngineConfig
from .models import Pair
from .runner_factory import make_runner


def measure_step_costs(pair: Pair, ctx: int, cfg: EngineConfig, reps: int = 5) -> tuple[float, list[float]]:
    """(c, verify) in target-step units: c = one draft token; verify[k] = a target forward over
    k + 1 tokens (k = 0..max_draft_len), each after a 64-token context (the ratios barely move
    with depth: verify(8) / step 2.2-2.6 after 64, 256 and 400 tokens on the embedded target);
    medians of `reps`. A max_draft_len raised later (Engine.reconfigure) has no measurement past
    this one's: AdaptiveK models those verifies linearly. A draft on the native step proposes
    greedily in one call (NativeRunner.greedy): c is that call's cost per token, about half of a
    Python loop's on the embedded draft."""

    def timed(runner, n: int, fn=None) -> float:
        if not runner.ids:
            runner.forward(list(range(3, 67)))
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn() if fn else runner.forward([5] * n)
            ts.append(time.perf_counter() - t0)
            runner.truncate(64)
        return statistics.median(ts)

    tr = make_runner(pair.target, ctx, cfg.lean, cfg.decode_threads)
    t = [timed(tr, k + 1) for k in range(cfg.max_draft_len + 1)]
    d1 = 0.0
    if pair.draft is not None:
        dr = make_runner(pair.draft, ctx, cfg.lean)
        k = max(cfg.max_draft_len, 1)
        d1 = (timed(dr, 1, lambda: dr.greedy([5], k)) / k if hasattr(dr, "greedy") and cfg.temperature <= 0
              else timed(dr, 1))
    verify = [max(x / t[0], 1.0) for x in t]
    for i in range(1, len(verify)):  # a longer verify never costs less (timing noise)
        verify[i] = max(verify[i], verify[i - 1])
    return min(d1 / t[0], 1.0), verify
