"""A document's KV caches: one runner each for the target and the draft (weights shared by every
document), with the document's drafting state beside them (drafters.DocDrafts: the draft lengths
learnt on it, its n-gram drafter). The engine keeps them in LRU order under the kv_budget_mb byte
budget (engine.py, admission)."""
from __future__ import annotations

import torch

from ..config import EngineConfig
from .adaptive import AdaptiveK
from .drafters import DocDrafts
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
    """One document's KV caches (target and draft) and its drafting state (drafters.DocDrafts)."""

    def __init__(self, pair: Pair, ctx: int, cfg: EngineConfig,
                 step_costs: tuple[float, list[float] | None], prior: AdaptiveK | None = None):
        """Runners over `ctx` positions for the pair's models (weights shared); draft lengths
        from cfg, planned with this machine's `step_costs` (calibrate.py), starting from what
        `prior` (the last document's schedule) learnt."""
        self.target = make_runner(pair.target, ctx, cfg.lean, cfg.decode_threads, cfg.kv_cache)
        self.draft = make_runner(pair.draft, ctx, cfg.lean, kv_cache=cfg.kv_cache) if pair.draft is not None else None
        c, verify = step_costs
        # k falls to 0 (plain decoding, drafting tried now and then) where drafting measures more
        # ms per token than plain: over --no-speculative, speculation costs its tries
        self.drafts = DocDrafts(AdaptiveK(cfg.draft_len, 0, cfg.max_draft_len, c, verify=verify,
                                          settle_ms=AdaptiveK.SETTLE_MS if cfg.decode_threads > 1 else 0.0), prior)
