"""Batched steps over batch-1 runners: forward calls that several generation threads make at the
same time are collected by `StepBatcher` and run as one step.

For `LlamaRunner`s sharing weights, `batched_forward` concatenates the requests' new tokens so the
linear layers run once on [ΣT, D] (the weight read is paid once per step instead of once per
request), while rotary embedding, the K/V write and attention stay per sequence over each runner's
own cache. Other runners (HF, quantized) are stepped one after another inside the same step.
"""
from __future__ import annotations

import threading
import time

import torch
import torch.nn.functional as F

from .runner import LlamaRunner, _rotate_half


@torch.inference_mode()
def batched_forward(runners: list[LlamaRunner], feeds: list[list[int]]) -> list[torch.Tensor]:
    """Append feeds[i] to runners[i] (all sharing one model's weights); return each one's
    logits [T_i, V] (at least float32), as `runner.forward` would."""
    r0 = runners[0]
    H, Hkv, hd = r0.n_heads, r0.n_kv, r0.hd
    T = [len(f) for f in feeds]
    P = [len(r.ids) for r in runners]
    for p, t, r in zip(P, T, runners):
        if p + t > r.max_len:
            raise ValueError(f"context of {p + t} tokens exceeds the model's {r.max_len}")
    offs = [0]
    for t in T:
        offs.append(offs[-1] + t)
    S = offs[-1]
    dev = r0.device
    x = r0.embed[torch.tensor([i for f in feeds for i in f], device=dev)].to(r0.dtype)  # [ΣT, D]
    pos = torch.cat([torch.arange(p, p + t) for p, t in zip(P, T)]).to(dev)  # [ΣT]
    cos, sin = r0.cos[pos], r0.sin[pos]  # [ΣT, hd]
    masks = [torch.ones(t, p + t, dtype=torch.bool, device=dev).tril(p) if t > 1 else None
             for p, t in zip(P, T)]
    for li, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(r0.layers):
        qkv = r0._rms(x, w_in) @ wqkv.T  # [ΣT, (H+2Hkv)·hd]: one matmul for every request
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(S, H, hd).transpose(0, 1)  # [H, ΣT, hd]
        k = k.view(S, Hkv, hd).transpose(0, 1)  # [Hkv, ΣT, hd]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        v = v.view(S, Hkv, hd).transpose(0, 1)
        outs = []
        for i, r in enumerate(runners):  # attention: each sequence over its own cache
            a, b, p, t = offs[i], offs[i + 1], P[i], T[i]
            r.k[li, :, p:p + t] = k[:, a:b]
            r.v[li, :, p:p + t] = v[:, a:b]
            outs.append(F.scaled_dot_product_attention(
                q[:, a:b], r.k[li, :, : p + t], r.v[li, :, : p + t], attn_mask=masks[i],
                enable_gqa=Hkv != H))  # [H, T_i, hd]
        o = torch.cat(outs, dim=1)  # [H, ΣT, hd]
        x = x + o.transpose(0, 1).reshape(S, H * hd) @ wo.T
        g, u = (r0._rms(x, w_post) @ wgu.T).chunk(2, dim=-1)  # [ΣT, I] each
        x = x + (F.silu(g) * u) @ wdown.T
    for r, f in zip(runners, feeds):
        r.ids.extend(f)
    logits = r0._rms(x, r0.norm) @ r0.lm_head.T  # [ΣT, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # as runner.forward
    return [logits[offs[i]:offs[i + 1]] for i in range(len(runners))]


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
                outs = batched_forward([c.runner for c in group], [c.ids for c in group])
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

    def __init__(self, max_batch: int = 8, wait_s: float = 0.002):
        self.max_batch, self.wait_s = max_batch, wait_s
        self.cond = threading.Condition()
        self.pending: list[_Call] = []
        self.active = 1       # live generations that may submit (set by the scheduler)
        self.running = False
        self.steps = 0
        self.batched_calls = 0  # calls that shared a step with another call

    def set_active(self, n: int) -> None:
        with self.cond:
            self.active = max(1, n)
            self.cond.notify_all()

    def forward(self, runner, ids: list[int]) -> torch.Tensor:
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
    """A runner whose forward goes through the step batcher; everything else is the runner's."""

    def __init__(self, runner, batcher: StepBatcher):
        self.runner, self.batcher = runner, batcher
        self.max_len, self.vocab_size = runner.max_len, runner.vocab_size

    @property
    def ids(self) -> list[int]:
        return self.runner.ids

    def sync(self, seq: list[int]) -> list[int]:
        return self.runner.sync(seq)

    def truncate(self, n: int) -> None:
        self.runner.truncate(n)

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        return self.batcher.forward(self.runner, new_ids)
