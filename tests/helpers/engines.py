"""Engines in-process without the shipped weights: random Llama pairs on the tiny pair's
tokenizer (the `tok` fixture), an Engine over one, and the weight storages the decode steps take."""
from __future__ import annotations

import torch
from conftest import random_llama

from completer.engine.engine import Engine, EngineConfig
from completer.engine.models import Pair
from completer.engine.quant import MODE_GROUPS

# weight storage → quantize_weights' groups (None: as loaded), for the NumPy and native steps
STORAGE = {"fp32": None, "fp16": MODE_GROUPS["fp16"], "int8": MODE_GROUPS["fast-int8"],
           "bf16-embed": "embed=bf16"}


def random_pair(tok, seed: int = 0) -> Pair:
    v = tok.get_vocab_size()
    return Pair(random_llama(64, 2, seed, vocab=v), random_llama(32, 1, seed + 1, vocab=v), tok,
                "random-target", "random-draft", torch.device("cpu"))


def engine(pair: Pair, **kw) -> Engine:
    cfg = {"drafter": "model", "max_new_tokens": 8, "type_through": False, "prefetch": False, "warmup_chunk": 16, **kw}
    return Engine(EngineConfig(**cfg), pair=pair)
