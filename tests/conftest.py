"""Shared fixtures: a tiny model pair built by the project's own recipe (seconds), and random
tiny Llama pairs for exactness tests. Tests run torch on one thread to stay light."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Triton decides at @jit time whether to interpret: CPU-only tests need it set before any import.
os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests' own user config (every process they start reads it): the embedded pair's confidence
# gate off, so that tests of transports, protocols and editors get the model's text; the gate is
# tested where it is the subject (test_confidence.py, the embedded pair's defaults in test_cli.py),
# and a test that needs another user config points XDG_CONFIG_HOME elsewhere itself.
_USER = Path(tempfile.mkdtemp(prefix="completer-tests-xdg-"))
(_USER / "completer").mkdir()
(_USER / "completer" / "config.toml").write_text("min_confidence = 0.0\n")
os.environ["XDG_CONFIG_HOME"] = str(_USER)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): the `tiny` preset of draft_models.build, trained for a few steps."""
    import torch

    torch.set_num_threads(1)
    from draft_models.build import build

    root = tmp_path_factory.mktemp("tiny_pair")
    build("tiny", root / "out", root / "run", seed=0)
    return root / "out" / "target", root / "out" / "draft"


def random_llama(hidden: int, layers: int, seed: int, vocab: int = 64, ctx: int = 256,
                 heads: int = 4, kv_heads: int = 2, dtype=None):
    """A random Llama with a small vocabulary (float64 by default: no near-tie flips)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=ctx,
                      eos_token_id=0, bos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval().to(dtype or torch.float64)
