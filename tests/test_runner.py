"""Runners match the HF forward, and rolling back is a pointer move."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import random_llama

from completer.engine.runner import HFRunner, LlamaRunner, LlamaWeights, common_prefix_len
from completer.engine.runner_factory import make_runner

torch.set_num_threads(1)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_lean_runner_matches_hf_forward_with_rollbacks(kv_heads):
    model = random_llama(64, 2, seed=kv_heads, vocab=300, kv_heads=kv_heads)
    ids = torch.randint(0, 300, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = model(input_ids=torch.tensor([ids])).logits[0]
    for runner in (make_runner(model), HFRunner(model)):
        got = [runner.forward(ids[:10]), runner.forward(ids[10:11]), runner.forward(ids[11:20])[:4]]
        runner.truncate(15)  # drop 5 "rejected" positions
        got.append(runner.forward(ids[15:60]))
        assert torch.allclose(torch.cat(got), ref, atol=1e-9)


def test_weights_from_dir_match_hf(tiny_pair):
    from transformers import AutoModelForCausalLM

    target, _ = tiny_pair
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    lean = make_runner(LlamaWeights.from_dir(target, torch.float32, torch.device("cpu")))
    ids = list(range(5, 45))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0]
    got = lean.forward(ids)
    # the native step's K/V cache holds fp16 (2^-11 relative): within 2e-3, float32 caches 1e-4
    assert torch.allclose(got, ref, atol=2e-3 if lean.k.dtype == torch.float16 else 1e-4), (got - ref).abs().max()


def test_slots_share_one_copy_of_weights():
    model = random_llama(32, 1, seed=0)
    a, b = make_runner(model), make_runner(model)
    assert a.layers[0][1].data_ptr() == b.layers[0][1].data_ptr()


def test_sync_keeps_longest_common_prefix():
    model = random_llama(32, 1, seed=1)
    r = make_runner(model)
    r.forward(list(range(1, 21)))
    assert r.sync(list(range(1, 11)) + [50, 51]) == [50, 51] and len(r.ids) == 10
    assert r.sync(list(range(1, 11))) == [10] and len(r.ids) == 9  # always feed ≥ 1 for logits
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = [rng.randrange(3) for _ in range(rng.randrange(12))]
        n = common_prefix_len(a, b)
        assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_numpy_draft_runner_matches_the_lean_runner(kv_heads, monkeypatch):
    """The draft's NumPy runner computes the same forward (float32 rounding), through prefill,
    single steps, rollbacks and a restricted LM head."""
    from completer.engine.np_runner import NumpyRunner

    monkeypatch.setenv("COMPLETER_NATIVE", "0")  # the NumPy step (the native one: test_native_step.py)
    model = random_llama(64, 2, seed=40 + kv_heads, vocab=300, kv_heads=kv_heads, dtype=torch.float32)
    w = LlamaWeights.from_hf(model)
    w.restrict_head(list(range(299, 0, -3)))
    ref, got = LlamaRunner(w), make_runner(w)
    assert isinstance(got, NumpyRunner) and got.head_rows == ref.head_rows
    ids = torch.randint(0, 300, (60,), generator=torch.Generator().manual_seed(kv_heads)).tolist()
    for r in (ref, got):
        r.out = [r.forward(ids[:20]), r.forward(ids[20:21]), r.forward(ids[21:30])]
        r.truncate(25)
        r.out.append(r.forward(ids[25:60]))
    for a, b in zip(ref.out, got.out):
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="exceeds"):
        got.forward(list(range(250)))


def test_numpy_runner_only_where_it_applies(monkeypatch):
    from completer.engine.native_runner import NativeRunner
    from completer.engine.np_runner import NumpyRunner
    from completer.engine.quant import quantize_weights

    f32 = LlamaWeights.from_hf(random_llama(32, 1, seed=2, dtype=torch.float32))
    assert isinstance(make_runner(f32), NativeRunner)
    monkeypatch.setenv("COMPLETER_NATIVE", "0")
    assert isinstance(make_runner(f32), NumpyRunner)
    assert isinstance(make_runner(f32), LlamaRunner)  # targets stay on the torch runner
    assert isinstance(make_runner(random_llama(32, 1, seed=2)), LlamaRunner)  # float64
    quantize_weights(f32, "attn=int8")
    assert isinstance(make_runner(f32), LlamaRunner)
