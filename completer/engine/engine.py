"""The engine: a model pair, per-document KV-cache slots (LRU under a byte budget), drafters,
and the speculative loop. One generation runs at a time (the models are single-stream);
callers in other threads queue on the lock and cancel through their `cancel` event."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from draft_models import DEFAULT_DIR
from draft_models.drafters import (AdaptiveK, CombinedDrafter, FastPathDrafter, ModelDrafter,
                                   NgramDrafter, Sampling)

from .models import ModelError, Pair, load_pair
from .prompt import FimFormat, build_prompt
from .runner import make_runner
from .speculative import GenStats, generate

DRAFTERS = ("combined", "model", "ngram", "fastpath", "none")


@dataclass(frozen=True)
class EngineConfig:
    target: str | None = None      # HF model dir or hub id; None = the embedded default pair
    draft: str | None = None       # must share the target's tokenizer
    device: str = "auto"           # auto | cpu | cuda[:N]
    dtype: str = "auto"            # auto = fp32 on CPU, bf16 on CUDA
    quant: str = "none"            # none | int8 | nf4 | mixed (target only)
    drafter: str = "combined"      # combined | model | ngram | fastpath | none
    draft_len: int = 4             # initial k; adapted per document from acceptance
    max_draft_len: int = 8
    max_new_tokens: int = 64
    temperature: float = 0.0       # 0 = greedy (exactly the target's greedy output)
    top_p: float = 1.0
    kv_budget_mb: float = 256.0    # all per-document KV slots together
    lean: bool = True              # lean Llama runner when the architecture allows
    seed: int = 0

    def validate(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ModelError(f"--drafter {self.drafter}: expected one of {', '.join(DRAFTERS)}")
        if not 1 <= self.draft_len <= self.max_draft_len <= 16:
            raise ModelError("--draft-len must be in 1..max_draft_len (≤ 16)")
        if self.max_new_tokens < 1:
            raise ModelError("--max-new-tokens must be ≥ 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ModelError("--temperature must be ≥ 0 and --top-p in (0, 1]")


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    stats: GenStats
    speculative: bool
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        st = self.stats
        return {"text": self.text, "token_ids": self.token_ids, "new_tokens": st.new_tokens,
                "target_forwards": st.target_forwards,
                "accepted_per_forward": round(st.accepted_per_forward, 4),
                "ttft_ms": round(st.ttft_ms, 3), "total_ms": round(st.total_ms, 3),
                "speculative": self.speculative, "prompt_tokens": st.prompt_tokens,
                "prefill_tokens": st.prefill_tokens, "proposed": st.proposed,
                "accepted": st.accepted, "by_source": st.by_source,
                "stop_reason": st.stop_reason, **self.extra}


class Slot:
    """One document's KV caches (target and draft) and its adaptive draft length."""

    def __init__(self, engine: "Engine"):
        self.target = make_runner(engine.pair.target, engine.ctx, engine.cfg.lean)
        self.draft = (make_runner(engine.pair.draft, engine.ctx, engine.cfg.lean)
                      if engine.pair.draft is not None else None)
        self.k = AdaptiveK(engine.cfg.draft_len, 1, engine.cfg.max_draft_len)
        self.ngram = NgramDrafter()

    def nbytes(self) -> int:
        return sum(r.reserved_bytes() for r in (self.target, self.draft) if r is not None)


class Engine:
    def __init__(self, cfg: EngineConfig = EngineConfig(), pair: Pair | None = None):
        cfg.validate()
        self.cfg = cfg
        self.pair = pair or load_pair(cfg.target, cfg.draft, device=cfg.device, dtype=cfg.dtype,
                                      quant=cfg.quant, use_draft=cfg.drafter in ("combined", "model"))
        self.tok = self.pair.tokenizer
        self.fim = FimFormat.detect(self.tok)
        self.ctx = min(getattr(self.pair.target.config, "max_position_embeddings", 2048), 4096)
        fp = DEFAULT_DIR / "fastpath.json"
        self.fastpath = (FastPathDrafter.load(fp) if fp.is_file() and cfg.target is None
                         and cfg.drafter in ("combined", "fastpath") else None)
        self.sampling = Sampling(cfg.temperature, cfg.top_p)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.slots: OrderedDict[str, Slot] = OrderedDict()
        self.lock = threading.Lock()
        self.counters = {"requests": 0, "cache_hits": 0, "tokens_reused": 0, "evictions": 0,
                         "warmups": 0}

    # -- slots -------------------------------------------------------------------------------
    def _slot(self, key: str) -> Slot:
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        slot = Slot(self)
        budget = self.cfg.kv_budget_mb * 2**20
        while self.slots and sum(s.nbytes() for s in self.slots.values()) + slot.nbytes() > budget:
            self.slots.popitem(last=False)  # least recently used
            self.counters["evictions"] += 1
        self.slots[key] = slot
        return slot

    def kv_bytes(self) -> int:
        return sum(s.nbytes() for s in self.slots.values())

    # -- prompts -----------------------------------------------------------------------------
    def prompt_budget(self, max_new: int | None = None) -> int:
        room = self.ctx - (max_new or self.cfg.max_new_tokens) - self.cfg.max_draft_len - 1
        return max(room, self.ctx // 2)  # a long generation stops at the context end instead

    def count_tokens(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def fim_prompt(self, prefix: str, suffix: str, max_new: int | None = None) -> list[int]:
        return build_prompt(self.tok, self.fim, prefix, suffix, self.prompt_budget(max_new))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    # -- generation --------------------------------------------------------------------------
    def _drafter(self, slot: Slot, kind: str):
        model = (ModelDrafter(slot.draft, self.sampling, self.gen)
                 if slot.draft is not None and kind in ("combined", "model") else None)
        if kind == "model":
            return model
        if kind == "ngram":
            return slot.ngram
        if kind == "fastpath":
            return self.fastpath
        if kind == "combined":
            return CombinedDrafter(model, slot.ngram, self.fastpath, slot.target.vocab_size)
        return None

    def complete_ids(self, prompt: list[int], *, doc_key: str = "_default", max_new: int | None = None,
                     drafter: str | None = None, stop: Callable[[list[int]], bool] | None = None,
                     cancel: threading.Event | None = None,
                     on_tokens: Callable[[list[int]], None] | None = None) -> tuple[list[int], GenStats]:
        max_new = max_new or self.cfg.max_new_tokens
        if len(prompt) + 1 > self.ctx:
            raise ModelError(f"prompt of {len(prompt)} tokens does not fit the model's context of {self.ctx}")
        if not prompt:
            raise ModelError("empty prompt")
        with self.lock:
            slot = self._slot(doc_key)
            d = self._drafter(slot, drafter or self.cfg.drafter)
            ids, st = generate(slot.target, prompt, max_new, self.sampling, d,
                               slot.k if d is not None else None, self.fim.eos, stop, cancel,
                               on_tokens, self.gen)
        self.counters["requests"] += 1
        reused = st.prompt_tokens - st.prefill_tokens
        self.counters["tokens_reused"] += reused
        self.counters["cache_hits"] += reused > 0
        return ids, st

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: Callable[[str], int | None] | None = None,
                 cancel: threading.Event | None = None,
                 on_text: Callable[[str], None] | None = None) -> Completion:
        """Complete at the cursor between `prefix` and `suffix`. `stop_text(text)` returns the
        length to keep once the completion is finished (e.g. its syntax node closed), else None."""
        t0 = time.perf_counter()
        prompt = self.fim_prompt(prefix, suffix, max_new)
        cut: list[int | None] = [None]
        sent = [0]

        def stop(ids: list[int]) -> bool:
            if stop_text is None:
                return False
            cut[0] = stop_text(self.decode(ids))
            return cut[0] is not None

        def on_tokens(ids_step: list[int]) -> None:
            if on_text is None:
                return
            text = self.decode(out_ids + ids_step)
            out_ids.extend(ids_step)
            if len(text) > sent[0]:
                on_text(text[sent[0]:])
                sent[0] = len(text)

        out_ids: list[int] = []
        ids, st = self.complete_ids(prompt, doc_key=doc_key, max_new=max_new, stop=stop,
                                    cancel=cancel, on_tokens=on_tokens if on_text else None)
        text = self.decode(ids)
        if cut[0] is not None:
            text = text[: cut[0]]
        st.total_ms = (time.perf_counter() - t0) * 1e3
        return Completion(text, ids, st, self.pair.draft is not None or self.cfg.drafter in ("ngram", "fastpath"))

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default") -> int:
        """Prefill the document's cache for this context without generating; returns the number
        of tokens computed (0 when the cache already held them)."""
        prompt = self.fim_prompt(prefix, suffix)
        with self.lock:
            slot = self._slot(doc_key)
            feed = slot.target.sync(prompt)
            if feed:
                slot.target.forward(feed)
            if slot.draft is not None:
                dfeed = slot.draft.sync(prompt)
                if dfeed:
                    slot.draft.forward(dfeed)
        self.counters["warmups"] += 1
        return len(feed)

    def info(self) -> dict:
        return {"target": self.pair.target_name, "draft": self.pair.draft_name,
                "device": str(self.pair.device), "ctx": self.ctx, "fim": self.fim.layout,
                "config": asdict(self.cfg), "kv_bytes": self.kv_bytes(), **self.counters}
