"""Batched steps over batch-1 runners: forward calls that several generation threads make at the
same time are collected by `StepBatcher` and run as one step.

For `LlamaRunner`s sharing weights, `forward_many` (runner.py) concatenates the requests' new tokens
so the linear layers run once on [ΣT, D] (the weight read is paid once per step instead of once per
request), while rotary embedding, the K/V write and attention stay per sequence over each runner's
own cache. Other runners (HF) are stepped one after another inside the same step.
`NativeRunner`s' short forwards skip the barrier: each generation steps on its own thread, side
by side (StepBatcher.forward).

A batched step runs at the pace of its widest member, so under load the live generations share a
per-step token budget: `max_draft_now()` caps each one's draft length (read by the speculative
loop through `Via.max_draft`) so that no member waits on a much longer verify.
"""
from __future__ import annotations

import threading
import time

import torch

from .native_runner import NativeRunner
from .runner import LlamaRunner, Runner, forward_many


class _Call:
    __slots__ = ("done", "err", "ids", "out", "runner", "t")

    def __init__(self, runner, ids: list[int]):
        self.runner, self.ids, self.t = runner, ids, time.perf_counter()
        self.out, self.err, self.done = None, None, False


def _run_calls(calls: list[_Call]) -> None:
    groups: dict[int, list[_Call]] = {}
    for c in calls:  # lean runners of one model batch together; anything else runs alone
        key = id(c.runner.layers[0][1]) if isinstance(c.runner, LlamaRunner) else id(c)
        groups.setdefault(key, []).append(c)
    for group in groups.values():
        try:
            if len(group) == 1:
                group[0].out = group[0].runner.forward(group[0].ids)
            else:
                outs = forward_many([c.runner for c in group], [c.ids for c in group])
                for c, o in zip(group, outs):
                    c.out = o
        except Exception as e:  # noqa: BLE001 - delivered to each caller's own thread
            for c in group:
                c.err = e


class StepBatcher:
    """Leader/follower step barrier. A forward call waits until every live generation has
    submitted its next call, `max_batch` calls are pending, or the oldest call has waited
    `wait_s`; then the oldest caller runs the whole step for everyone. One step runs at a time,
    so the model never sees two concurrent forwards."""

    def __init__(self, max_batch: int = 8, wait_s: float = 0.002, step_tokens: int = 32):
        self.max_batch, self.wait_s = max_batch, wait_s
        self.step_tokens = step_tokens  # verify tokens a shared step aims at (0 = no cap)
        self.cond = threading.Condition()
        self.pending: list[_Call] = []
        self.active = 1       # live generations that may submit (set by the scheduler)
        self.running = False
        self.steps = 0
        self.batched_calls = 0  # calls that shared a step with another call

    def configure(self, max_batch: int, wait_s: float, step_tokens: int) -> None:
        """New limits from the next step on (the options changed)."""
        with self.cond:
            self.max_batch, self.wait_s, self.step_tokens = max_batch, wait_s, step_tokens
            self.cond.notify_all()

    def set_active(self, n: int) -> None:
        with self.cond:
            self.active = max(1, n)
            self.cond.notify_all()

    def max_draft_now(self) -> int | None:
        """Draft tokens a generation may verify in its next step: the step budget shared by the
        generations stepping together (each verifies its draft + 1), at least 1; None alone."""
        n = min(self.active, self.max_batch)  # read without the lock: a stale value only shifts one step
        if n < 2 or self.step_tokens <= 0:
            return None
        return max(self.step_tokens // n - 1, 1)

    def forward(self, runner, ids: list[int]) -> torch.Tensor:
        if type(runner) is NativeRunner:
            # no barrier: the native step holds no GIL and no shared state (its scratch is per
            # thread), so generations step side by side, one core each, rather than taking turns
            # in one batched call (bench/concurrency.py: batching lost 3-12 % of requests/s)
            return runner.forward(ids)
        call = _Call(runner, ids)
        with self.cond:
            self.pending.append(call)
            self.cond.notify_all()
            while True:
                if call.done:
                    break
                if not self.running and self.pending[0] is call:
                    left = call.t + self.wait_s - time.perf_counter()
                    if len(self.pending) >= min(self.active, self.max_batch) or left <= 0:
                        batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch:]
                        self.running = True
                        break
                    self.cond.wait(left)
                else:
                    self.cond.wait()
        if not call.done:  # this thread leads the step
            try:
                _run_calls(batch)
            finally:
                with self.cond:
                    for c in batch:
                        c.done = True
                    self.steps += 1
                    self.batched_calls += len(batch) if len(batch) > 1 else 0
                    self.running = False
                    self.cond.notify_all()
        if call.err is not None:
            raise call.err
        return call.out


class Via:
    """A runner (runner.Runner) whose forward goes through the step batcher and whose drafts are
    capped by its share of a step (max_draft); everything else is the runner's."""

    def __init__(self, runner: Runner, batcher: StepBatcher):
        self.runner, self.batcher = runner, batcher
        self.max_len, self.vocab_size, self.head_rows = runner.max_len, runner.vocab_size, runner.head_rows
        # the native one-call proposal, unbatched as the native forward is (StepBatcher.forward):
        # without it every product request drafted token by token (issue 37)
        self.greedy = runner.greedy

    @property
    def ids(self) -> list[int]:
        return self.runner.ids

    def sync(self, seq: list[int]) -> list[int]:
        return self.runner.sync(seq)

    def truncate(self, n: int) -> None:
        self.runner.truncate(n)

    def kv_bytes(self) -> int:
        return self.runner.kv_bytes()

    def reserved_bytes(self) -> int:
        return self.runner.reserved_bytes()

    @property
    def max_draft(self) -> int | None:
        """The draft-length cap under load (StepBatcher.max_draft_now)."""
        return self.batcher.max_draft_now()

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        return self.batcher.forward(self.runner, new_ids)
