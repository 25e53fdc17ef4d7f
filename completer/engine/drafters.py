"""Drafters (proposers): interchangeable producers of `Proposal(ids, probs | None)` for the verifier.

`probs` is the drafter's distribution for each proposed token, [k, V]; None means the proposal
is deterministic (a one-hot distribution), which is what the n-gram and fast-path drafters give.
A drafter sees the whole accepted sequence (prompt + generated, ending with the token the
target has not consumed yet) and proposes what follows it.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

import torch

from .adaptive import AdaptiveK
from .sampling import EMPTY, Proposal, Sampling, warp


class Drafter(Protocol):
    def propose(self, seq: list[int], k: int) -> Proposal: ...

    def take_catch_up_ms(self) -> float:
        """Milliseconds the last proposals spent catching a model up on tokens it missed (paid once
        per switch to drafting; generate() leaves them out of the rounds' times), reset on reading.
        0 for a drafter without a model."""
        return 0.0


class ModelDrafter(Drafter):
    """A small causal LM that proposes k tokens autoregressively over its own position-indexed
    KV cache (`runner`: anything with sync/forward/truncate, see completer.engine.runner). A
    runner with `head_rows` scores only those ids; proposals map back to vocabulary ids and
    their probabilities are zero elsewhere (rejection sampling stays exact: q is what we drew from).

    A catch-up of more than CATCH_UP tokens (the prompt, or the tokens of plain rounds, when the
    draft was left behind) is timed apart: `take_catch_up_ms` hands it to generate(), which leaves
    it out of the round's time. It is paid once per switch to drafting, not per token, and counted
    per token it made a try of drafting look slower than it runs (on the embedded pair a 384-token
    catch-up costs ~8 ms, a few rounds' worth), so tries lost and plain stuck."""

    CATCH_UP = 16  # more tokens to feed than a round leaves behind (accepted drafts + 1)

    def __init__(self, runner, sampling: Sampling, generator: torch.Generator | None = None):
        self.runner, self.sampling, self.gen = runner, sampling, generator
        self.rows = runner.head_rows
        self._rows_t = torch.tensor(self.rows) if self.rows is not None else None
        self.catch_up_ms = 0.0

    def take_catch_up_ms(self) -> float:
        ms, self.catch_up_ms = self.catch_up_ms, 0.0
        return ms

    def _sync(self, seq: list[int]) -> list[int]:
        feed = self.runner.sync(seq)
        if len(feed) > self.CATCH_UP:
            t0 = time.perf_counter()
            self.runner.forward(feed[:-1])
            self.catch_up_ms += (time.perf_counter() - t0) * 1e3
            feed = feed[-1:]
        return feed

    def propose(self, seq: list[int], k: int) -> Proposal:
        if k <= 0 or len(seq) + k > self.runner.max_len:
            return EMPTY
        if self.sampling.greedy and self.runner.greedy is not None:  # the native step: k picks in one call
            return Proposal(self.runner.greedy(self._sync(seq), k), None, "model")
        logits = self.runner.forward(self._sync(seq))[-1]  # [V] or [len(rows)]
        ids, probs = [], []
        for i in range(k):
            if self.sampling.greedy:
                j = int(logits.argmax())  # host sync: the next draft forward needs the id
            else:
                q = warp(logits, self.sampling)
                j = int(torch.multinomial(q, 1, generator=self.gen))  # host sync, as above
                if self._rows_t is not None:
                    q = torch.zeros(self.runner.vocab_size, dtype=q.dtype).index_copy_(0, self._rows_t, q)
                probs.append(q)
            t = self.rows[j] if self.rows is not None else j
            ids.append(t)
            if i + 1 < k:
                logits = self.runner.forward([t])[-1]
        return Proposal(ids, torch.stack(probs) if probs else None, "model")


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens
    (n = max_n..min_n) and propose what followed it. No model, ≈0 cost."""

    def __init__(self, max_n: int = 4, min_n: int = 2):
        self.max_n, self.min_n = max_n, min_n
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram → end position of its latest occurrence

    def _update(self, seq: list[int]) -> None:
        n0 = len(self._seq)
        if n0 > len(seq) or self._seq[-64:] != seq[max(0, n0 - 64):n0]:
            self._seq, self._index, n0 = [], {}, 0  # a different sequence: reindex
        # n-grams seq[end-n:end] with a following token; the tail (ending at len(seq)) is left out
        for end in range(max(1, n0), len(seq)):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    self._index[tuple(seq[end - n:end])] = end
        self._seq = list(seq)

    def propose(self, seq: list[int], k: int) -> Proposal:
        if k <= 0:
            return EMPTY
        self._update(seq)
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(seq) < n:
                continue
            end = self._index.get(tuple(seq[-n:]))
            if end is not None:
                ids = seq[end:end + k]
                if ids:
                    return Proposal(ids, None, "ngram")
        return EMPTY


class FastPathDrafter(Drafter):
    """Near-certain continuations mined from the corpus: (a, b) → c when P(c | a, b) ≥ 0.9
    over enough occurrences (mined by the recipe: `draft_models.fastpath`). Chains lookups, ≈0 cost."""

    def __init__(self, table: dict[tuple[int, int], int]):
        self.table = table

    @staticmethod
    def table_of(rows: list) -> dict[tuple[int, int], int]:
        return {(a, b): c for a, b, c in rows}


    def propose(self, seq: list[int], k: int) -> Proposal:
        ids: list[int] = []
        a, b = (seq[-2], seq[-1]) if len(seq) >= 2 else (-1, seq[-1] if seq else -1)
        while len(ids) < k:
            c = self.table.get((a, b))
            if c is None:
                break
            ids.append(c)
            a, b = b, c
        return Proposal(ids, None, "fastpath") if ids else EMPTY


def _one_hot(ids: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()  # [k, V]


class CombinedDrafter(Drafter):
    """Cheapest first, then the model for the rest of the k tokens: an n-gram match when the
    document repeats itself (≥ `min_ngram_tokens` of it), then fast-path tokens, then the draft
    model continuing after them."""

    def __init__(self, model: ModelDrafter | None, ngram: NgramDrafter | None,
                 fastpath: FastPathDrafter | None, vocab_size: int, min_ngram_tokens: int = 2):
        self.model, self.ngram, self.fastpath = model, ngram, fastpath
        self.vocab, self.min_ngram_tokens = vocab_size, min_ngram_tokens

    def propose(self, seq: list[int], k: int) -> Proposal:
        parts: list[Proposal] = []
        n = 0
        for d in (self.ngram, self.fastpath, self.model):
            if d is None or n >= k:
                continue
            p = d.propose(seq + [t for q in parts for t in q.ids] if parts else seq, k - n)
            if d is self.ngram and len(p.ids) < min(k, self.min_ngram_tokens):
                continue  # a one-token match is a guess
            if p.ids:
                parts.append(p)
                n += len(p.ids)
        if len(parts) <= 1:
            return parts[0] if parts else EMPTY
        probs = None
        if parts[-1].probs is not None:  # sampling: one-hot rows for the deterministic parts
            probs = torch.cat([q.probs if q.probs is not None else _one_hot(q.ids, parts[-1].probs.shape[-1])
                               for q in parts])
        return Proposal([t for q in parts for t in q.ids], probs, "+".join(q.source for q in parts))

    def take_catch_up_ms(self) -> float:
        return self.model.take_catch_up_ms() if self.model is not None else 0.0


class EditDrafter(Drafter):
    """Speculative edits: the original region is the draft of its rewrite. One per generation:
    the first call's sequence ends with the output's first token, and only output tokens are
    matched. Finds where the output stands in `original` — the longest n (max_n..1) for which
    the output's last n tokens end at some position p of the original, the p nearest the one
    expected from the previous draft (it advances with the output; the start at first) — and
    proposes original[p:p + k], up to its own `k`. While the output copies, nearly every draft
    is accepted, so `k` is far past max_draft_len's bound: generate() takes it from the AdaptiveK
    its caller passes (`adaptive_k()`), so the bound is per call and the default path keeps its
    own. After a divergence the last two or more generated tokens re-align it; one token only
    for the answer's first, at the region's start (else an answer that copies nothing keeps
    paying for verifies: 0.8× plain on the embedded pair, which never copies). No match: nothing.

    k = 32: on the embedded pair (AMD EPYC, 2 shared cores; bench/edit_drafter.py --new 192),
    verify(k) after a 64-token context = 1.7 / 2.6 / 3.2 / 4.7 × verify(0) for k = 8 / 16 / 32 /
    64, and decoding with the output itself as the original runs 4.0 / 5.4 / 6.7 × plain for
    k = 16 / 32 / 64 (τ = k); with 3 edits in it 3.5 / 3.8 / 3.6 × (τ 13-14)."""

    def __init__(self, original: list[int], k: int = 32, max_n: int = 8):
        self.original, self.k, self.max_n = list(original), k, max_n
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram → every p with original[p-n:p] equal
        for n in range(1, max_n + 1):
            for p in range(n, len(original) + 1):
                self._ends.setdefault(tuple(original[p - n:p]), []).append(p)
        self._start: int | None = None  # where the output begins in seq
        self._last = (0, 1, 0)  # (len(seq), p, proposed) of the previous draft; p: the expected one
        self._rejected: set[int] = set()  # original positions whose draft token the target rejected

    def adaptive_k(self, **kw) -> AdaptiveK:
        """The draft length for generate(): starts at this drafter's k and may go back up to it,
        or down to 0 where drafting measures slower than plain (an answer that does not copy its
        region; drafting is tried again now and then); a lookup costs no draft step (c = 0)."""
        return AdaptiveK(self.k, 0, self.k, **{"c": 0.0, **kw})

    def propose(self, seq: list[int], k: int) -> Proposal:
        if self._start is None:
            self._start = len(seq) - 1
            self._last = (len(seq), 1, 0)
        k = min(k, self.k)
        n0, p0, kp = self._last
        got = seq[n0:]  # the previous draft's accepted tokens + the target's token
        n = next((i for i, (a, b) in enumerate(zip(got, self.original[p0:p0 + kp])) if a != b), None)
        if n is not None:
            self._rejected.add(p0 + n)
        self._last = (len(seq), p0 + len(got), 0)
        if k <= 0:
            return EMPTY
        expect = p0 + len(got)
        for n in range(min(self.max_n, len(seq) - self._start), 0, -1):
            ends = self._ends.get(tuple(seq[-n:]))
            if ends and n == 1 and (expect not in ends or len(seq) - self._start > 1):
                break  # one token is chance (an answer that copies nothing shares "(" or "self" with any
                # region, here or elsewhere): its drafts only cost verifies. Only the answer's first
                # token, where the region starts, is taken on its own
            if ends:
                # among matches of one n: one with tokens after it, then one whose draft does not run
                # into a rejected token (in a run x x x … y, re-proposing y after each extra x
                # gains one token per forward), then the nearest to the expected position
                p = min(ends, key=lambda e: (e == len(self.original),
                                             any(e <= q < e + k for q in self._rejected), abs(e - expect)))
                # re-aligned elsewhere on n tokens: 2^n at most (a chance match of a common pair,
                # "self.", would otherwise cost a verify of k rows: 33 rows = 5.5 steps natively)
                ids = self.original[p:p + (k if p == expect else min(k, 2 ** n))]
                self._last = (len(seq), p, len(ids))
                return Proposal(ids, None, "edit") if ids else EMPTY
        return EMPTY


class DocDrafts:
    """One document's drafting state: its draft-length schedules (one, and one per kind of syntax
    node the caller names) and its n-gram drafter (prompt lookup over the document's tokens).
    Kept beside the document's KV caches (caches.DocCache) and dropped with them."""

    MAX_KINDS = 64

    def __init__(self, k: AdaptiveK, prior: AdaptiveK | None = None):
        """`k`: the document's schedule, starting from what `prior` (the last document's) learnt:
        acceptance and measured ms per token."""
        self.k = k
        if prior is not None:  # a new document starts where the engine's last one stood, not blind
            self.k.learnt_from(prior)
        self.by_kind: OrderedDict[str, AdaptiveK] = OrderedDict()  # per syntax-node kind (caller's)
        self.ngram = NgramDrafter()

    def active(self) -> bool:
        """Whether any of the schedules drafts now (else the draft's KV cache can wait: a try of
        drafting catches it up, ModelDrafter's sync)."""
        return any(k.drafting for k in (self.k, *self.by_kind.values()))

    def k_for(self, kind: str | None) -> AdaptiveK:
        """The draft-length schedule for a kind of syntax node (argument lists, blocks and strings
        accept drafts differently); a new kind starts from what the document has learnt."""
        if kind is None:
            return self.k
        k = self.by_kind.get(kind)
        if k is None:
            k = self.by_kind[kind] = self.k.fork()
            while len(self.by_kind) > self.MAX_KINDS:
                self.by_kind.popitem(last=False)
        self.by_kind.move_to_end(kind)
        return k

    def rebound(self, max_draft_len: int) -> None:
        """The max_draft_len option changed: every schedule takes the new bound."""
        self.k = self.k.resized(max_draft_len)
        for kind, k in self.by_kind.items():
            self.by_kind[kind] = k.resized(max_draft_len)
