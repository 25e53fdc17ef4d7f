"""The NumPy decode step (np_runner.py, the fallback where the native step is unavailable: these
tests turn it off) computes LlamaRunner's forward for every layout and weight storage it accepts,
generates HF's greedy ids as a target, and leaves the rest to LlamaRunner."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import random_llama
from helpers.engines import STORAGE
from test_families import family_model

from completer.engine.adaptive import AdaptiveK
from completer.engine.drafters import ModelDrafter
from completer.engine.np_runner import NumpyRunner, eligible
from completer.engine.quant import quantize_weights
from completer.engine.runner import LlamaRunner, LlamaWeights
from completer.engine.runner_factory import make_runner
from completer.engine.sampling import Sampling
from completer.engine.speculative import generate

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def numpy_step(monkeypatch):
    monkeypatch.setenv("COMPLETER_NATIVE", "0")  # make_runner's fallback (test_native_step.py)


def weights(case: str, storage: str, seed: int = 0) -> LlamaWeights:
    w = LlamaWeights.from_hf(family_model(case, seed=seed))
    if STORAGE[storage]:
        quantize_weights(w, STORAGE[storage])
    return w


@pytest.mark.parametrize("storage", list(STORAGE))
@pytest.mark.parametrize("case", ["llama-linear", "llama-yarn", "mistral", "qwen2", "qwen3"])
def test_step_matches_the_lean_runner(case, storage):
    """Prefill (torch, > SHORT tokens), single steps, verifies of several tokens, rollbacks, and
    a context past Mistral's 16-token window: the same logits as LlamaRunner on the same weights."""
    w = weights(case, storage)
    ref, got = LlamaRunner(w, 128), make_runner(w, 128)
    assert type(got) is NumpyRunner
    ids = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    feeds = [ids[:40], ids[40:41], ids[41:47], ids[47:48], ids[48:50]]
    for r in (ref, got):
        r.out = [r.forward(f) for f in feeds]
        r.truncate(44)  # drop "rejected" positions
        r.out += [r.forward(ids[44:53]), r.forward(ids[53:54]), r.forward(ids[54:90])]
    for a, b in zip(ref.out, got.out):
        assert a.shape == b.shape and b.dtype == torch.float32
        assert torch.allclose(a, b, atol=2e-4, rtol=1e-4), (a - b).abs().max()


@pytest.mark.parametrize("case", ["qwen2", "mistral", "llama-llama3"])
def test_greedy_speculative_target_equals_hf(case):
    """As the target (fp32) and as the draft: greedy ids equal HF generate()'s."""
    model = family_model(case, seed=3)
    draft = family_model(case, layers=1, seed=4)
    rng = random.Random(5)
    for trial in range(3):
        prompt = [rng.randrange(1, 256) for _ in range(rng.randint(1, 30))]
        x = torch.tensor([prompt])
        ref = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        target = make_runner(model, 128)
        assert type(target) is NumpyRunner
        for k in (None, AdaptiveK(3, 1, 6)):
            d = ModelDrafter(make_runner(draft, 128), Sampling()) if k else None
            out, _ = generate(make_runner(model, 128), prompt, 24, Sampling(), d, k)
            assert out == ref, (case, trial, k)


def test_runs_only_where_it_applies():
    assert type(make_runner(weights("qwen2", "fp32"))) is NumpyRunner
    int4 = LlamaWeights.from_hf(family_model("llama-linear"))
    quantize_weights(int4, "mlp=int4")  # no fast int4 GEMM on the CPU: the torch runner dequantizes
    for w in (int4, LlamaWeights.from_hf(random_llama(32, 1, seed=2)),  # float64
              LlamaWeights.from_hf(family_model("starcoder2")), LlamaWeights.from_hf(family_model("gemma"))):
        assert not eligible(w) and type(make_runner(w)) is LlamaRunner
        with pytest.raises(ValueError, match="NumpyRunner needs"):
            NumpyRunner(w)
