"""Each quantization mode loads and generates; unsupported combinations fail clearly."""
from __future__ import annotations

import re

import pytest
import torch
from conftest import random_llama

from completer.engine.engine import Engine, EngineConfig
from completer.engine.models import ModelError, load_pair
from completer.engine.quant import parse_groups, quantize_weights, weight_bytes
from completer.engine.runner import LlamaRunner, LlamaWeights

torch.set_num_threads(1)


@pytest.mark.parametrize("quant", ["none", "fp16", "int8", "nf4", "fast-int8", "int4", "mixed"])
def test_each_mode_loads_and_generates(tiny_pair, quant):
    target, draft = tiny_pair
    """Speculative decoding stays greedy-exact over each mode's own target: every drafter gives
    the ids plain decoding gives, and a mode that quantizes stores its weights smaller.
    fast-int8, int4 and mixed quantize activations per call with one scale over all rows (fbgemm's
    dynamic GEMM), so a (k+1)-row verify rounds differently from a 1-row step and may flip a
    near-tie: there the two agree on a leading run, not on every token."""
    eng = Engine(EngineConfig(target=str(target), draft=str(draft), quant=quant, max_new_tokens=12))
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    plain, st = eng.complete_ids(prompt, doc_key="plain", max_new=12, drafter="none")
    assert len(plain) == st.new_tokens == 12
    for drafter in ("model", "ngram", "combined"):
        ids, _ = eng.complete_ids(prompt, doc_key=drafter, max_new=12, drafter=drafter)
        if quant in ("fast-int8", "int4", "mixed"):
            same = next((i for i, (a, b) in enumerate(zip(ids, plain)) if a != b), len(plain))
            assert same >= len(plain) // 2, (quant, drafter, ids, plain)
        else:
            assert ids == plain, (quant, drafter)
    if quant != "none":
        ref = Engine(EngineConfig(target=str(target), draft=str(draft), quant="none"))
        # fp16 weights the native step also multiplies on AMX-BF16 keep that layout besides (as
        # many bytes again: about fp32's, with the blocks' padding), and the stats count it
        layer = (getattr(eng.pair.target, "layers", None) or [()])[0]  # lean weights (HF modules: none)
        pairs = any(getattr(getattr(m, "native", None), "wbf", None) is not None for m in layer)
        limit = 1.25 if pairs else 1.0
        assert eng.stats()["target_weight_bytes"] < limit * ref.stats()["target_weight_bytes"], quant


@pytest.mark.parametrize("spec", ["embed=fp32,attn=int8,mlp=int8,head=int8",
                                  "embed=fp16,attn=int8,mlp=int4,head=int8"])
def test_lean_quantization_is_close_and_smaller(spec):
    m = random_llama(64, 2, seed=0, vocab=300, dtype=torch.float32)
    ids = list(range(1, 40))
    ref = LlamaRunner(LlamaWeights.from_hf(m)).forward(ids)
    w = LlamaWeights.from_hf(m)
    before = weight_bytes(w)
    quantize_weights(w, spec)
    out = LlamaRunner(w).forward(ids)
    assert weight_bytes(w) < before / 2.5
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


def test_fp16_weights_are_exact_for_a_16_bit_checkpoint():
    """fp16 storage of weights that are fp16 values already loses nothing: logits match the
    fp32 runner to fp32 rounding, for one token and for a 7-token verify."""
    m = random_llama(64, 2, seed=2, vocab=300, dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.half().float())
    ids = list(range(1, 40))
    ref = LlamaRunner(LlamaWeights.from_hf(m))
    w = LlamaWeights.from_hf(m)
    quantize_weights(w, "embed=fp32,attn=fp16,mlp=fp16,head=fp16")
    assert weight_bytes(w) < 0.6 * weight_bytes(LlamaWeights.from_hf(m))
    run = LlamaRunner(w)
    for feed in (ids[:32], ids[32:33], ids[33:40]):
        a, b = ref.forward(feed), run.forward(feed)
        assert (a - b).abs().max() < 1e-4 * a.abs().max()
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_bad_modes_and_groups_fail_clearly(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ModelError, match="expected one of"):
        load_pair(str(target), str(draft), quant="int3")
    with pytest.raises(ModelError, match="unknown group"):
        load_pair(str(target), str(draft), quant="mixed", quant_groups="attn=int8,ffn=int4")
    with pytest.raises(ValueError, match="expected one of"):
        parse_groups("mlp=int2")


def test_nf4_on_the_cpu_refuses_widths_its_kernel_cannot_pack(tmp_path):
    """bitsandbytes' CPU 4-bit kernel fails at the first forward with a reshape error when a
    layer's input width is not a multiple of its block (64; the embedded target's is 288): the
    load says so and names what works instead."""
    from completer.engine.models import load_model

    random_llama(96, 1, seed=0, vocab=300, dtype=torch.float32).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r"nf4 on the CPU needs layer input widths divisible by 64.*fast-int8"):
        load_model(str(tmp_path), torch.device("cpu"), torch.float32, "nf4")


def test_modes_dtypes_and_devices_are_the_schemas():
    """What the engine accepts is exactly what the option schema offers (config.py), no more."""
    from completer.config import OPTIONS
    from completer.engine.models import QUANT_MODES, resolve_device, resolve_dtype

    assert QUANT_MODES == OPTIONS["quant"].meta["choices"]
    cpu = torch.device("cpu")
    for name in OPTIONS["dtype"].meta["choices"]:
        assert isinstance(resolve_dtype(name, cpu), torch.dtype)
    for bad in ("float64", "int8"):  # not options: the engine refuses them too
        with pytest.raises(ModelError, match="expected one of auto, float32"):
            resolve_dtype(bad, cpu)
    valid, allowed = OPTIONS["device"].meta["check"]
    for dev in ("tpu", "cpu:0", "gpu"):
        assert not valid(dev)
        with pytest.raises(ModelError, match=re.escape(f"expected {allowed}")):
            resolve_device(dev)
