"""Sampling and verification, side by side: how the target's logits become a distribution
(temperature, top-p), and the verifier that accepts a drafter's proposal against them — greedy
argmax match, or rejection sampling (`min(1, p/q)`, residual `norm(max(p - q, 0))`) that keeps the
target's distribution exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


class Proposal(NamedTuple):
    ids: list[int]
    probs: torch.Tensor | None  # [k, V] or None (deterministic)
    source: str


EMPTY = Proposal([], None, "none")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def warp(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Logits [..., V] → sampling distribution (temperature, then top-p) [..., V]."""
    p = torch.softmax(logits / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sp, si = p.sort(dim=-1, descending=True)
        drop = sp.cumsum(-1) - sp > s.top_p  # keep the smallest head whose mass reaches top_p
        sp = sp.masked_fill(drop, 0.0)
        p = torch.zeros_like(p).scatter(-1, si, sp)
        p = p / p.sum(-1, keepdim=True)
    return p


def token_logprobs(logits: torch.Tensor, ids: list[int]) -> tuple[list[float], list[tuple[int, float]]]:
    """The model's log-probability (temperature 1, whatever the sampling) of `ids[i]` at row i of
    `logits` [>= len(ids), V]: how sure the target was of each token it emitted; and the runner-up
    at each row: the likeliest other token and its log-probability (where the completion could
    have gone instead: engine/alternatives.py branches there)."""
    if not ids:
        return [], []
    rows = logits[: len(ids)].float()  # [n, V]
    picked = torch.tensor(ids, device=rows.device)
    lse = torch.logsumexp(rows, -1)  # [n]
    top_v, top_i = rows.topk(2, -1)  # [n, 2]
    other = (top_i[:, 0] == picked).long()[:, None]  # the emitted token is the best: its runner-up is second
    alt_i, alt_v = top_i.gather(1, other)[:, 0], top_v.gather(1, other)[:, 0] - lse
    # one host sync: the loop cuts on them (ids < 2**24 are exact in float32)
    lps, alt, alt_lp = torch.stack([rows[torch.arange(len(ids), device=rows.device), picked] - lse, alt_i.float(),
                                    alt_v]).tolist()
    return lps, [(int(i), lp) for i, lp in zip(alt, alt_lp, strict=True)]


def verify(logits: torch.Tensor, prop: Proposal, s: Sampling,
           gen: torch.Generator | None = None) -> tuple[int, int]:
    """logits [k+1, V] of the target over [cur] + draft → (accepted count n, next token)."""
    k = len(prop.ids)
    if s.greedy:
        threads = torch.get_num_threads()  # one thread: a parallel argmax over [k+1, V] waits ~1 ms
        torch.set_num_threads(1)           # for a busy core (measured on 2 shared cores; np_runner.py)
        t = logits.argmax(-1)  # [k+1]
        torch.set_num_threads(threads)
        n = int((t[:k] == torch.tensor(prop.ids, dtype=t.dtype)).cumprod(0).sum()) if k else 0
        return n, int(t[n])  # host sync: the loop needs n and the token
    p = warp(logits, s)  # [k+1, V] target
    if k == 0:
        return 0, int(torch.multinomial(p[0], 1, generator=gen))
    d = torch.tensor(prop.ids)
    idx = torch.arange(k)
    q = prop.probs if prop.probs is not None else torch.nn.functional.one_hot(d, p.shape[-1]).float()
    u = torch.rand(k, generator=gen)
    ok = u * q[idx, d] <= p[idx, d]  # accept with min(1, p/q)
    n = int(ok.long().cumprod(0).sum())  # host sync: the number accepted
    if n == k:
        return n, int(torch.multinomial(p[k], 1, generator=gen))
    r = (p[n] - q[n]).clamp_min(0)  # residual norm(max(p - q, 0))
    r = r / r.sum() if r.sum() > 0 else p[n]
    return n, int(torch.multinomial(r, 1, generator=gen))
