"""A document's KV caches: one runner each for the target and the draft (weights shared by every
document), the adaptive draft lengths learnt on it, and its n-gram drafter. The engine keeps
them in LRU order under the kv_budget_mb byte budget (engine.py, admission)."""
from __future__ import annotations

from collections import OrderedDict

import torch

from ..config import EngineConfig
from .adaptive import AdaptiveK
from .drafters import NgramDrafter
from .models import Pair
from .runner_factory import kv_dtype, make_runner


def kv_reserve_bytes(model, ctx: int, cfg: EngineConfig | None = None) -> int:
    """Bytes of K/V one runner can hold over `ctx` positions: what LlamaRunner preallocates, and
    the most an HFRunner's cache grows to (forward refuses past its max_len); in the dtype
    make_runner gives it under `cfg` (the native step's kv_cache), else the compute dtype."""
    c = model.config
    heads = c.num_attention_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    dtype = (kv_dtype(model, cfg.lean, cfg.kv_cache) if cfg is not None else None) or getattr(model, "dtype", None)
    elt = (torch.empty(0, dtype=dtype).element_size() if isinstance(dtype, torch.dtype)
           else model.get_input_embeddings().weight.element_size())
    return 2 * c.num_hidden_layers * kv * ctx * hd * elt


class DocCache:
    """One document's KV caches (target and draft) and its adaptive draft lengths."""

    def __init__(self, pair: Pair, ctx: int, cfg: EngineConfig,
                 step_costs: tuple[float, list[float] | None], prior: AdaptiveK | None = None):
        """Runners over `ctx` positions for the pair's models (weights shared); draft lengths
        from cfg, planned with this machine's `step_costs` (calibrate.py), starting from what
        `prior` (the last document's schedule) learnt: acceptance and measured ms per token."""
        self.target = make_runner(pair.target, ctx, cfg.lean, cfg.decode_threads, cfg.kv_cache)
        self.draft = make_runner(pair.draft, ctx, cfg.lean, kv_cache=cfg.kv_cache) if pair.draft is not None else None
        c, verify = step_costs
        # the document's; k falls to 0 (plain decoding, drafting tried now and then) where drafting
        # measures more ms per token than plain: over --no-speculative, speculation costs its tries
        self.k = AdaptiveK(cfg.draft_len, 0, cfg.max_draft_len, c, verify=verify,
                           settle_ms=AdaptiveK.SETTLE_MS if cfg.decode_threads > 1 else 0.0)
        if prior is not None:  # a new document starts where the engine's last one stood, not blind
            self.k.learnt_from(prior)
        self.by_kind: OrderedDict[str, AdaptiveK] = OrderedDict()  # per syntax-node kind (caller's)
        self.ngram = NgramDrafter()

    def drafting(self) -> bool:
        """Whether any of the document's schedules drafts now (else its draft cache can wait: a
        try of drafting catches it up, ModelDrafter's sync)."""
        return any(k.drafting for k in (self.k, *self.by_kind.values()))

    def k_for(self, kind: str | None) -> AdaptiveK:
        """The draft-length schedule for a kind of syntax node (argument lists, blocks and strings
        accept drafts differently); a new kind starts from what the document has learnt."""
        if kind is None:
            return self.k
        k = self.by_kind.get(kind)
        if k is None:
            k = self.by_kind[kind] = self.k.fork()
            while len(self.by_kind) > 64:
                self.by_kind.popitem(last=False)
        self.by_kind.move_to_end(kind)
        return k

    def rebound(self, max_draft_len: int) -> None:
        """The max_draft_len option changed: every draft-length schedule takes the new bound."""
        self.k = self.k.resized(max_draft_len)
        for kind, k in self.by_kind.items():
            self.by_kind[kind] = k.resized(max_draft_len)
