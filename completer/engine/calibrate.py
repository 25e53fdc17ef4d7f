"""Calibration: this machine's step costs for the adaptive draft length (drafters.AdaptiveK),
measured once at startup (Engine.warm_start), before requests share the cores and skew it."""
from __future__ import annotations

import statistics
import time

from ..config import EngineConfig
from .models import Pair
from .runner_factory import make_runner


def measure_step_costs(pair: Pair, ctx: int, cfg: EngineConfig, reps: int = 9) -> tuple[float, list[float]]:
    """(c, verify) in target-step units: c = one draft token; verify[k] = a target forward over
    k + 1 tokens (k = 0..max_draft_len), each after a context of 3/4 of the window, at most 512
    tokens: a prompt's usual depth, where attention over the cache is a real part of each verified
    row (the native step's products take up to 6 rows in one pass over the weights, so after a
    short context small verifies look free); medians of `reps` rounds, each round timing every size once (on a shared machine a burst of
    load then hits all sizes alike: timed one size after another, a slow first size squashed
    every ratio to 1). A max_draft_len raised later (Engine.reconfigure) has no measurement past
    this one's: AdaptiveK models those verifies linearly. A draft on the native step proposes
    greedily in one call (NativeRunner.greedy): c is that call's cost per token, about half of a
    Python loop's on the embedded draft."""
    tr = make_runner(pair.target, ctx, cfg.lean, cfg.decode_threads)
    calls = {k: (tr, lambda k=k: tr.forward([5] * (k + 1))) for k in range(cfg.max_draft_len + 1)}
    n = max(cfg.max_draft_len, 1)
    if pair.draft is not None:
        dr = make_runner(pair.draft, ctx, cfg.lean)
        one_call = hasattr(dr, "greedy") and cfg.temperature <= 0
        calls["draft"] = (dr, (lambda: dr.greedy([5], n)) if one_call else (lambda: dr.forward([5])))
    depth = max(1, min(512, 3 * ctx // 4))
    for r in {id(r): r for r, _ in calls.values()}.values():
        r.forward([3 + i % 64 for i in range(depth)])
    times: dict = {key: [] for key in calls}
    for _ in range(reps):
        for key, (r, call) in calls.items():
            t0 = time.perf_counter()
            call()
            times[key].append(time.perf_counter() - t0)
            r.truncate(depth)
    t = [statistics.median(times[k]) for k in range(cfg.max_draft_len + 1)]
    d1 = 0.0
    if "draft" in times:
        d1 = statistics.median(times["draft"]) / (n if one_call else 1)
    verify = [max(x / t[0], 1.0) for x in t]
    for i in range(1, len(verify)):  # a longer verify never costs less (timing noise)
        verify[i] = max(verify[i], verify[i - 1])
    return min(d1 / t[0], 1.0), verify
