"""The native decode step (native_runner.py, kernels/native/step.cpp) computes LlamaRunner's forward
for every family and weight storage the NumPy step takes, for 1..32 new tokens, as the target and
as a draft; int8 products equal fbgemm's; batched steps over its caches stay exact; with the
library disabled the NumPy step serves and says why. The AVX2 build is checked too (machines
alternate AVX2 and AVX-512), and where the CPU has AMX its int8 products equal the VNNI build's
to the bit (COMPLETER_NATIVE_AMX=0 runs this file on the VNNI path)."""
from __future__ import annotations

import ctypes
import itertools
import logging
import random

import numpy as np
import pytest
import torch
from conftest import random_llama
from helpers.engines import STORAGE, engine
from test_families import family_model

from completer.engine import native_lib
from completer.engine.adaptive import AdaptiveK
from completer.engine.drafters import ModelDrafter
from completer.engine.models import Pair
from completer.engine.native_lib import cache_dir, library
from completer.engine.native_runner import NativeRunner
from completer.engine.np_runner import NumpyRunner
from completer.engine.quant import Fp16Weight, Int8Weight, quantize_weights
from completer.engine.runner import LlamaRunner, LlamaWeights, forward_many
from completer.engine.runner_factory import KV_DTYPES, make_runner
from completer.engine.sampling import Sampling
from completer.engine.speculative import generate
from completer_kernels import native
from completer_kernels import quant as kq

torch.set_num_threads(1)
CASES = ["llama-linear", "llama-yarn", "mistral", "qwen2", "qwen3"]  # biases, RoPE scalings, window, q/k norm
AVX2 = {"avx2", "fma", "f16c"}


@pytest.fixture(scope="module")
def lib():
    lib, why = library()
    if lib is None and native.isa_flags(native.cpu_flags()) is None:
        pytest.skip(why)  # a CPU below AVX2: the NumPy step is the only one
    assert lib is not None, why
    return lib


@pytest.fixture(scope="module", params=["this CPU", "avx2"])
def any_lib(request, lib):
    """This CPU's build, and the AVX2 build where this CPU runs it (an AVX-512 machine)."""
    if request.param == "this CPU":
        return lib
    if not AVX2 <= native.cpu_flags():
        pytest.skip("this CPU has no AVX2")
    avx2, why = native.load(cache_dir(), AVX2)
    assert avx2 is not None and why == "avx2", why
    return avx2


def weights(case: str, storage: str, hidden: int = 72, seed: int = 0) -> LlamaWeights:
    """hidden 72: head width 18 and products whose widths are not multiples of a vector, so every
    kernel's tail is exercised (Qwen3's head_dim is 32)."""
    w = LlamaWeights.from_hf(family_model(case, hidden=hidden, seed=seed))
    if STORAGE[storage]:
        quantize_weights(w, STORAGE[storage])
    return w


def close(a: torch.Tensor, b: torch.Tensor, kv16: bool = False) -> None:
    """Equal up to float32 summation order. With an fp16 cache a key or value an ulp apart in
    float32 can round to fp16 values an fp16 ulp apart (2^-11 relative), so logits agree to ~1e-3
    and greedy ids wherever the top two are further apart than that."""
    assert a.shape == b.shape and b.dtype == torch.float32
    atol, rtol = (2e-3, 1e-3) if kv16 else (2e-4, 1e-4)
    assert torch.allclose(a, b, atol=atol, rtol=rtol), (a - b).abs().max()
    top2 = a.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > (4 * atol if kv16 else 0)
    assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


def close_int8(outs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """fbgemm's int8 scales activations per tensor at 7 bits: a float32-rounding difference in the
    glue before a product (sum order) can move its range by an ulp and flip a few activations by one
    step, which moves logits by ~1 % of their range (and the K/V written then, so later forwards
    differ a little too). So: at least half the forwards equal to float32 rounding, none further
    than 5 % of the logits' range, greedy ids equal wherever the top two differ by more than that."""
    exact = 0
    for a, b in outs:
        assert a.shape == b.shape and b.dtype == torch.float32
        exact += torch.allclose(a, b, atol=2e-4, rtol=1e-4)
        tol = 0.05 * float(a.abs().max())
        assert float((a - b).abs().max()) <= tol
        top2 = a.topk(2, -1).values
        clear = (top2[:, 0] - top2[:, 1]) > tol
        assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])
    assert exact >= 0.5 * len(outs), f"{exact} of {len(outs)} forwards equal"


@pytest.mark.parametrize("storage, kv", [(st, torch.float16) for st in STORAGE]  # a float32 cache: one float
                         + [("fp32", torch.float32), ("int8", torch.float32)])  # and the int8 weights
@pytest.mark.parametrize("case", CASES)
def test_step_matches_the_lean_runner(lib, any_lib, case, storage, kv):
    """After a prefill (torch), forwards of T = 1..32 new tokens (each rolled back), then steps and
    a rollback past Mistral's 16-token window: LlamaRunner's logits and greedy ids, with the K/V
    cache in fp16 (the default: both round each row the same way) and in float32."""
    if any_lib is not lib and case not in ("mistral", "qwen3"):
        pytest.skip("the AVX2 build: one case with a window, one with q/k norm")
    w = weights(case, storage)
    ref, got = LlamaRunner(w, 128, kv), NativeRunner(w, any_lib, 128, kv_dtype=kv)
    assert got.k.dtype == kv and got.kv_bytes() == 0
    ids = torch.randint(0, 256, (128,), generator=torch.Generator().manual_seed(1)).tolist()
    for r in (ref, got):
        r.out = [r.forward(ids[:40])]
        for T in range(1, 33):
            r.out.append(r.forward(ids[40:40 + T]))
            r.truncate(40)
        r.out += [r.forward(ids[40:41]), r.forward(ids[41:47]), r.forward(ids[47:48])]
        r.truncate(44)
        r.out += [r.forward(ids[44:53]), r.forward(ids[53:54]), r.forward(ids[54:90])]
    if storage == "int8":
        close_int8(list(zip(ref.out, got.out)))
    else:
        for a, b in zip(ref.out, got.out):
            close(a, b, kv == torch.float16)


@pytest.mark.parametrize("storage", ["fp32", "fp16", "int8"])
@pytest.mark.parametrize("case", ["mistral", "qwen2", "qwen3"])
def test_greedy_ids_plain_and_speculative(lib, case, storage):
    """The engine's pick (make_runner) decodes the torch runner's greedy ids (its cache in fp16, as
    the native step's), plain and with a native draft proposing to a native target (adaptive k:
    verifies of 1..8 drafts)."""
    w, dw = weights(case, storage, seed=3), weights(case, "fp32", hidden=48, seed=4)
    dw.restrict_head(list(range(0, 256, 2)))  # a draft's restricted head
    rng = random.Random(5)
    for trial in range(3):
        prompt = [rng.randrange(1, 256) for _ in range(rng.randint(1, 30))]
        for k in (None, AdaptiveK(3, 1, 8)):
            outs = []
            for mk in (lambda m: LlamaRunner(m, 128, torch.float16), lambda m: make_runner(m, 128)):
                target, draft = mk(w), mk(dw)
                d = ModelDrafter(draft, Sampling()) if k else None
                kk = AdaptiveK(3, 1, 8) if k else None
                outs.append(generate(target, prompt, 40, Sampling(), d, kk)[0])
            assert type(target) is NativeRunner and type(draft) is NativeRunner
            assert outs[0] == outs[1], (case, storage, trial, k)


def test_batched_steps_stay_exact(lib):
    """batch.py steps runners of one model together through forward_many (torch) over the same
    caches the native step writes: interleaving the two gives each sequence's own logits."""
    w = weights("qwen2", "fp16")
    ids = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    refs = [LlamaRunner(w, 128, torch.float16) for _ in range(2)]
    got = [NativeRunner(w, lib, 128) for _ in range(2)]
    for r, s in zip(refs, (ids[:20], ids[5:31])):
        r.out = [r.forward(s)]
    for r, s in zip(got, (ids[:20], ids[5:31])):
        r.out = [r.forward(s)]
    feeds = [[ids[40]], ids[41:45]]
    for r, f in zip(refs, feeds):
        r.out.append(r.forward(f))
    for r, o in zip(got, forward_many(got, feeds)):
        r.out.append(o)
    for r in refs + got:
        r.out.append(r.forward(ids[50:53]))
    for a, b in zip(refs, got):
        for x, y in zip(a.out, b.out):
            close(x, y, kv16=True)


def packed_and_fbgemm(kind: str, w: torch.Tensor, bw: int):
    """w in the native layout, and the product it must equal: fbgemm's on the same int8 / fp16
    values, or a float32 matmul."""
    ops = torch.ops.quantized
    if kind == "int8":
        q, scale = kq.quantize_int8(w)
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros(len(q), dtype=torch.long), 0)
        fb = ops.linear_prepack(qw, None)
        return native.Packed("int8", bw, q=q.numpy(), scale=scale.numpy()), lambda x: ops.linear_dynamic(x, fb, True)
    if kind == "f16":
        fb16 = ops.linear_prepack_fp16(w.half().float(), None)
        return native.Packed("f16", bw, w.numpy()), lambda x: ops.linear_dynamic_fp16(x, fb16)
    return native.Packed("f32", bw, w.numpy()), lambda x: x @ w.T


@pytest.mark.parametrize("kind", ["int8", "f16", "f32"])
def test_products_equal_fbgemm(lib, kind):
    """int8: fbgemm's dynamic quantization step for step (per-tensor uint8 activations over all
    rows, reduce_range) on the same int8 weights: equal to the last bit. fp16 (fbgemm's fp16 GEMM)
    and float32: within float32 summation order."""
    bw = lib.nstep_block_width()
    g = torch.Generator().manual_seed(0)
    for N, K in ((64, 64), (100, 36), (200, 130), (33, 7)):
        pk, ref_of = packed_and_fbgemm(kind, torch.randn(N, K, generator=g), bw)
        for T in (1, 2, 5, 7, 13, 32, 100):
            x = torch.randn(T, K, generator=g) * 3
            y = np.empty((T, N), np.float32)
            lib.nstep_matmul(ctypes.byref(pk.mat), x.numpy().ctypes.data, T, y.ctypes.data, 1)
            if kind == "int8":
                assert torch.equal(torch.from_numpy(y), ref_of(x)), (N, K, T)
            else:
                assert torch.allclose(torch.from_numpy(y), ref_of(x), atol=1e-4, rtol=1e-4), (N, K, T)


def attention_ref(q, k, v, p, window):
    """q [T, H, hd] at positions p.. over k, v [Hkv, P, hd]: causal (and windowed) softmax attention
    in float64, the query heads of a group sharing their K/V head."""
    T, H, hd = q.shape
    g = H // k.shape[0]
    out = torch.empty(T, H, hd, dtype=torch.float64)
    for t in range(T):
        pos = p + t
        lo = max(0, pos - window + 1) if window > 0 else 0
        for h in range(H):
            kk, vv = k[h // g, lo:pos + 1].double(), v[h // g, lo:pos + 1].double()
            out[t, h] = torch.softmax(kk @ q[t, h].double() / hd ** 0.5, 0) @ vv
    return out


def test_attention_matches_torch(any_lib):
    """Attention over the cache alone (one row: attend_row; 2+: attend_group, which reads a head's
    K/V once for all its rows and sums a block of keys' scores together): random q/k/v, depths 0
    and around a block of keys (16 AVX-512, 8 AVX2), windows shorter than the rows, at a block and
    past the depth, GQA groups, head widths with and without a vector tail; the cache in float32 and
    in fp16 (its rows' tails loaded by pairs: the last key row ends the buffer)."""
    g = torch.Generator().manual_seed(3)
    for hd, H, Hkv in ((18, 4, 4), (72, 6, 2), (128, 2, 1)):
        for p in (0, 1, 7, 16, 17, 400):
            for T in (1, 2, 5, 9, 33):
                P = p + T + 3
                k, v = torch.randn(Hkv, P, hd, generator=g), torch.randn(Hkv, P, hd, generator=g)
                q = torch.randn(T, H, hd, generator=g) * 2
                for kv16, window in itertools.product((0, 1), (0, 7, 16, 300)):
                    kc, vc = (k.half(), v.half()) if kv16 else (k, v)
                    out = np.full((T, H, hd), np.nan, np.float32)
                    assert any_lib.nstep_attend(q.numpy().ctypes.data, kc.numpy().ctypes.data, vc.numpy().ctypes.data,
                                                kv16, P, p, T, H, Hkv, hd, window, out.ctypes.data) == 0
                    ref = attention_ref(q, kc.float(), vc.float(), p, window)
                    assert torch.allclose(torch.from_numpy(out).double(), ref, atol=2e-5, rtol=1e-4), \
                        (hd, H, Hkv, p, T, window, kv16)
    k = torch.zeros(1, 4, 17, dtype=torch.float16)  # an odd width has no whole pairs: refused
    assert any_lib.nstep_attend(torch.zeros(1, 1, 17).numpy().ctypes.data, k.numpy().ctypes.data,
                                k.numpy().ctypes.data, 1, 4, 0, 1, 1, 1, 17, 0, np.zeros(17, np.float32).ctypes.data) == 1


def test_quantized_weights_are_packed_once(lib):
    """With the library, fp16 / int8 weights hold only the native layout (no fbgemm copy), and
    the torch forward (prefill, batched steps) multiplies through it."""
    w = weights("qwen2", "int8")
    m = w.layers[0][1]
    assert isinstance(m, Int8Weight) and m.native is not None and m._packed is None and m.q is None
    x = torch.randn(3, m.shape[1])
    y = np.empty((3, m.shape[0]), np.float32)
    lib.nstep_matmul(ctypes.byref(m.native.mat), x.numpy().ctypes.data, 3, y.ctypes.data, 1)
    assert torch.equal(m.matmul(x), torch.from_numpy(y))
    assert isinstance(weights("qwen2", "fp16").layers[0][4], Fp16Weight)


def test_bad_input_is_refused(lib):
    r = NativeRunner(weights("qwen2", "fp32"), lib, 64)
    r.forward([1, 2, 3])
    with pytest.raises(IndexError):
        r.forward([256])
    with pytest.raises(ValueError, match="exceeds"):
        r.forward([1] * 30 + [2] * 32)
    assert r.ids == [1, 2, 3]  # nothing appended by a refused forward
    r.forward([4])


def test_fallback_is_taken_and_said(lib, monkeypatch, caplog):
    """COMPLETER_NATIVE=0 (read through config.env): the NumPy step, and one log line saying why."""
    monkeypatch.setenv("COMPLETER_NATIVE", "0")
    monkeypatch.setattr(native_lib, "_announced", set())
    w = weights("qwen2", "fp16")
    with caplog.at_level(logging.WARNING, logger="completer.engine.native_lib"):
        a, b = make_runner(w, 64), make_runner(w, 64)
    assert type(a) is NumpyRunner and type(b) is NumpyRunner
    said = [r.getMessage() for r in caplog.records if "native decode step unavailable" in r.getMessage()]
    assert said == ["native decode step unavailable (disabled by COMPLETER_NATIVE): using the NumPy step"]
    monkeypatch.delenv("COMPLETER_NATIVE")
    assert type(make_runner(w, 64)) is NativeRunner


def test_flags_come_from_the_cpu():
    """Built for what the CPU reports: AVX-512 (+VNNI) or AVX2, never -march=native; AMX's kernels
    (-DNSTEP_AMX, their own target attribute: no -mamx flag for the rest) only beside VNNI and
    only with both amx_tile and amx_int8."""
    assert native.isa_flags({"sse2", "avx"}) is None
    name, flags = native.isa_flags(AVX2 | native.AMX)
    assert name == "avx2" and not any("AMX" in f or "amx" in f or "march" in f for f in flags)
    base512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    assert native.isa_flags(base512)[0] == "avx512"
    name, flags = native.isa_flags(base512 | {"avx512_vnni", "amx_tile"})
    assert name == "avx512vnni" and "-mavx512vnni" in flags and not any("AMX" in f or "amx" in f for f in flags)
    name, flags = native.isa_flags(base512 | {"avx512_vnni"} | native.AMX)
    assert name == "avx512vnni+amx" and "-DNSTEP_AMX" in flags and not any("-mamx" in f or "march" in f for f in flags)
    assert "-DNSTEP_AMX_BF16" not in flags  # fp16 products on tiles need amx_bf16 as well
    name, flags = native.isa_flags(base512 | {"avx512_vnni", "amx_bf16"} | native.AMX)
    assert name == "avx512vnni+amx" and {"-DNSTEP_AMX", "-DNSTEP_AMX_BF16"} <= set(flags)
    assert "-DNSTEP_AMX_BF16" not in native.isa_flags(base512 | {"avx512_vnni", "amx_bf16", "amx_tile"})[1]


@pytest.fixture
def amx_and_vnni(lib):
    """(the AMX build with AMX from 2 rows on, the same source built without AMX); skipped where
    the CPU reports no AMX or the kernel refuses it."""
    flags = native.cpu_flags()
    if not native.AMX <= flags:
        pytest.skip("this CPU reports no AMX (amx_tile, amx_int8): the VNNI / AVX2 kernels are the only ones")
    amx, why = native.load(cache_dir(), flags)
    if amx is None:
        pytest.skip(f"no AMX build here: {why}")
    vnni, why = native.load(cache_dir(), flags - native.AMX)
    assert vnni is not None and why == "avx512vnni", why
    before = amx.nstep_amx_rows(2)
    assert before > 0 and vnni.nstep_amx_rows(2) == 0
    yield amx, vnni
    amx.nstep_amx_rows(before)


def test_amx_products_equal_vnni(amx_and_vnni):
    """TDPBUSD sums the same u8·s8 products into int32 as vpdpbusd, and the scaling after is the
    same code: equal to the last bit, for K with and without a tail past 64 bytes (the tail's B
    tile copied), 1..33 and 100 rows (A tiles of up to 16 rows, the last one padded), 1 and 2
    threads (each loads its own tile configuration)."""
    amx, vnni = amx_and_vnni
    g = torch.Generator().manual_seed(0)
    for N, K in ((64, 64), (100, 36), (200, 130), (33, 7), (130, 288), (64, 768)):
        q, scale = kq.quantize_int8(torch.randn(N, K, generator=g))
        pk = native.Packed("int8", amx.nstep_block_width(), q=q.numpy(), scale=scale.numpy())
        for T in [*range(1, 34), 100]:
            x = torch.randn(T, K, generator=g) * 3
            ys = []
            for lb, nt in ((vnni, 1), (amx, 1), (amx, 2)):
                ys.append(np.empty((T, N), np.float32))
                lb.nstep_matmul(ctypes.byref(pk.mat), x.numpy().ctypes.data, T, ys[-1].ctypes.data, nt)
            assert np.array_equal(ys[0], ys[1]) and np.array_equal(ys[0], ys[2]), (N, K, T)


@pytest.mark.parametrize("case", ["mistral", "qwen2", "qwen3"])
def test_amx_step_equals_vnni(amx_and_vnni, case):
    """Whole forwards of 1..32 rows with int8 weights on the AMX build equal the VNNI build's to
    the bit (so do their greedy ids), and so does a draft's greedy proposal."""
    amx, vnni = amx_and_vnni
    w = weights(case, "int8", seed=2)
    runners = [NativeRunner(w, lb, 128) for lb in (amx, vnni)]
    ids = torch.randint(0, 256, (128,), generator=torch.Generator().manual_seed(4)).tolist()
    for r in runners:
        r.out = [r.forward(ids[:30])]
        for T in range(1, 33):
            r.out.append(r.forward(ids[30:30 + T]))
            r.truncate(30)
        r.out.append(r.greedy(ids[30:39], 4))
    for a, b in zip(*(r.out for r in runners)):
        assert (a == b if isinstance(a, list) else torch.equal(a, b)), case


@pytest.fixture
def amx_bf16(lib):
    """(the AMX build with fp16 products on AMX-BF16 tiles from 2 rows on, the same source built
    without AMX); skipped where the CPU reports no AMX-BF16 or the kernel refuses it."""
    flags = native.cpu_flags()
    if not native.AMX | {"amx_bf16"} <= flags:
        pytest.skip("this CPU reports no AMX-BF16 (amx_tile, amx_bf16): fp16 products take the register path")
    amx, why = native.load(cache_dir(), flags)
    if amx is None:
        pytest.skip(f"no AMX build here: {why}")
    plain, why = native.load(cache_dir(), flags - native.AMX)
    assert plain is not None, why
    before = amx.nstep_amxh_rows(2)
    assert before > 0 and plain.nstep_amxh_rows(2) == 0
    yield amx, plain
    amx.nstep_amxh_rows(before)


def bf16_valued(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """An fp16 weight whose values are bf16s: what packing a bf16 checkpoint in fp16 gives."""
    return (torch.randn(n, k, generator=g) * 0.05).bfloat16().half()


def test_amx_bf16_products(amx_bf16):
    """fp16 weights whose values are all bf16 get a second layout (Packed.with_bf16_pairs) that
    AMX-BF16 multiplies, the activations split in two bf16: within the split's error bound of the
    float64 product (2^-16 relative per product, plus float32 accumulation), for K with and
    without a tail past 32, rows 2..33 and 100 (A tiles of up to 16 rows), 1 and 2 threads (each
    loads its own tile configuration), with a bias and without; one row keeps the register path
    (bit-equal to the build without AMX). A weight with any value that is not a bf16 gets no such
    layout."""
    amx, plain = amx_bf16
    g = torch.Generator().manual_seed(0)
    bw = amx.nstep_block_width()
    for N, K in ((64, 32), (100, 36), (200, 130), (33, 7), (130, 288), (64, 768)):
        w, bias = bf16_valued(N, K, g), torch.randn(N, generator=g)
        pk = native.Packed("f16", bw, w.numpy(), bias.numpy())
        pb = pk.with_bf16_pairs()
        assert pb is not None and pb.mat.wbf and pb.nbytes() == pk.nbytes() + 2 * N * K + 2 * (-N % bw) * K + 2 * (-N % bw + N) * (-K % 32)
        for T in [*range(1, 34), 100]:
            x = torch.randn(T, K, generator=g) * 3
            ref = (x.double() @ w.double().T + bias.double()).numpy()
            bound = (K * 2 ** -24) * (x.double().abs() @ w.double().abs().T).numpy() + 1e-6
            ys = []
            for lb, p, nt in ((plain, pk, 1), (amx, pb, 1), (amx, pb, 2)):
                ys.append(np.empty((T, N), np.float32))
                lb.nstep_matmul(ctypes.byref(p.mat), x.numpy().ctypes.data, T, ys[-1].ctypes.data, nt)
            if T == 1:
                assert np.array_equal(ys[0], ys[1]), (N, K)
            for y in ys:
                assert (np.abs(y - ref) <= bound).all(), (N, K, T, np.abs(y - ref).max())
    w = torch.randn(64, 64, generator=g).half()
    assert native.Packed("f16", bw, w.numpy()).with_bf16_pairs() is None


def test_amx_bf16_rows_alone(amx_bf16):
    """On AMX-BF16 from one row on (the default), a row's products are the same bits whatever rows
    share its tiles: a verify's row equals the lone step's."""
    amx, _ = amx_bf16
    amx.nstep_amxh_rows(1)
    g = torch.Generator().manual_seed(1)
    for N, K in ((130, 288), (64, 45)):
        pb = native.Packed("f16", amx.nstep_block_width(), bf16_valued(N, K, g).numpy()).with_bf16_pairs()
        x = torch.randn(33, K, generator=g)
        alone = np.empty((33, N), np.float32)
        for i in range(33):
            amx.nstep_matmul(ctypes.byref(pb.mat), x[i:i + 1].numpy().ctypes.data, 1, alone[i:].ctypes.data, 1)
        for T in (2, 5, 9, 16, 17, 33):
            y = np.empty((T, N), np.float32)
            amx.nstep_matmul(ctypes.byref(pb.mat), x[:T].numpy().ctypes.data, T, y.ctypes.data, 1)
            assert np.array_equal(y, alone[:T]), (N, K, T)


@pytest.mark.parametrize("case", ["llama-linear", "mistral", "qwen2", "qwen3"])
def test_amx_bf16_step(amx_bf16, case):
    """A bf16 checkpoint packed in fp16 (quant auto on a CPU): forwards of 1..32 rows with fp16
    products on AMX-BF16 agree with the build without AMX as closely as a verify's rows agree with
    lone steps (close(), greedy ids wherever the top two are clearly apart), prefill's products
    through the same layout; so does a draft's greedy proposal."""
    amx, plain = amx_bf16
    model = family_model(case, hidden=72, seed=2).to(torch.bfloat16).float()
    outs = []
    for lb in (amx, plain):
        w = LlamaWeights.from_hf(model)
        quantize_weights(w, STORAGE["fp16"])
        r = NativeRunner(w, lb, 128)
        assert (getattr(w.lm_head.native, "wbf", None) is not None) == (lb is amx)
        ids = torch.randint(0, 256, (128,), generator=torch.Generator().manual_seed(4)).tolist()
        out = [r.forward(ids[:30])]
        for T in range(1, 33):
            out.append(r.forward(ids[30:30 + T]))
            r.truncate(30)
        out.append(r.greedy(ids[30:39], 4))
        outs.append(out)
    for a, b in zip(*outs):
        if isinstance(a, list):
            assert a == b, case
        else:
            close(a, b, kv16=True)


def test_amx_choice_is_said(lib, monkeypatch, caplog):
    """One line says whether int8 products run on AMX, and if not, why: COMPLETER_NATIVE_AMX=0
    (read through config.env) takes the build without AMX."""
    amx_cpu = native.AMX <= native.cpu_flags()
    for off in (False, True):
        monkeypatch.setattr(native_lib, "_announced", set())
        if off:
            monkeypatch.setenv("COMPLETER_NATIVE_AMX", "0")
        with caplog.at_level(logging.INFO, logger="completer.engine.native_lib"):
            caplog.clear()
            got, again = native_lib.native_or_none(), native_lib.native_or_none()
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("native decode step")]
        assert got is again and len(said) == 1, said
        if amx_cpu and not off and got.nstep_amx_rows(-1) > 0:
            assert f"int8 products of {got.nstep_amx_rows(-1)}+ rows on AMX tiles" in said[0], said
            bf16 = f"fp16 products (bf16-valued weights) of {got.nstep_amxh_rows(-1)}+ rows on AMX-BF16"
            assert (bf16 in said[0]) == ("amx_bf16" in native.cpu_flags()) == (got.nstep_amxh_rows(-1) > 0), said
        else:
            why = "disabled by COMPLETER_NATIVE_AMX" if amx_cpu and off else "" if amx_cpu else "reports no AMX"
            assert "not AMX (" in said[0] and why in said[0] and got.nstep_amx_rows(-1) == 0, said


@pytest.mark.parametrize("restricted", [False, True])
def test_greedy_draft_in_one_call(lib, restricted):
    """NativeRunner.greedy (what ModelDrafter calls when sampling is greedy) proposes what a
    forward-and-argmax loop proposes, and leaves the cache holding the feed and k-1 picks."""
    w = weights("mistral", "fp32" if restricted else "fp16", seed=6)  # a restricted head is dense
    if restricted:
        w.restrict_head(list(range(255, 0, -3)))
    ref, got = LlamaRunner(w, 128, torch.float16), NativeRunner(w, lib, 128)
    ids = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    rows = w.head_rows or list(range(256))
    for feed, k in ((ids[:40], 5), (ids[40:41], 1), (ids[41:44], 8)):
        want, logits = [], ref.forward(feed)[-1]
        for i in range(k):
            want.append(rows[int(logits.argmax())])
            if i + 1 < k:
                logits = ref.forward(want[-1:])[-1]
        assert got.greedy(feed, k) == want and got.ids == ref.ids
    with pytest.raises(ValueError, match="exceeds"):
        got.greedy([1], 128)


def test_int4_products_and_step(lib, any_lib):
    """int4 (group 32, w = (q - zero)·scale): the native kernel equals the dequantized weights
    times the 7-bit dynamic activations it quantizes to (torch's quantize_per_tensor_dynamic with
    reduce_range: the same scheme), to float32 rounding; a model with int4 MLPs steps as the torch
    forward does through the same kernel."""
    bw, g = any_lib.nstep_block_width(), torch.Generator().manual_seed(0)
    for N, K in ((64, 64), (100, 96), (33, 256)):
        w = torch.randn(N, K, generator=g)
        packed, scale, zero = kq.quantize_int4(w, 32)
        q = torch.stack([packed & 15, packed >> 4], -1).view(N, K)
        pk = native.Packed("int4", bw, q=q.numpy(), scale=scale.numpy(), zero=zero.numpy())
        for T in (1, 2, 3, 9):
            x = torch.randn(T, K, generator=g)
            xd = torch.quantize_per_tensor_dynamic(x, torch.quint8, True).dequantize()
            wd = kq.dequant_int4(packed, scale, zero, 32)
            ref, mag = xd @ wd.T, (xd.abs() @ wd.abs().T).max()  # float32 rounding scales with Σ|x·w|
            y = np.empty((T, N), np.float32)
            any_lib.nstep_matmul(ctypes.byref(pk.mat), x.numpy().ctypes.data, T, y.ctypes.data, 1)
            assert (torch.from_numpy(y) - ref).abs().max() <= 2e-6 * mag, (N, K, T)
    wq = LlamaWeights.from_hf(family_model("qwen2", hidden=64, seed=1))
    quantize_weights(wq, "mlp=int4")
    ref, got = LlamaRunner(wq, 128, torch.float16), NativeRunner(wq, any_lib, 128)
    ids = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    outs = [(ref.forward(ids[:40]), got.forward(ids[:40]))]
    outs += [(ref.forward(ids[40 + i:41 + i]), got.forward(ids[40 + i:41 + i])) for i in range(5)]
    outs.append((ref.forward(ids[45:54]), got.forward(ids[45:54])))
    close_int8(outs)


def test_generations_step_side_by_side(lib):
    """Through the step batcher, NativeRunners are not batched but step concurrently (the native
    call releases the GIL; its scratch is per thread): each sequence still gets its own logits."""
    import threading

    from completer.engine.batch import StepBatcher, Via

    w = weights("qwen3", "fp16")
    ids = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(7)).tolist()
    feeds = [[ids[i:i + 30]] + [ids[i + 30 + j:i + 31 + j] for j in range(20)] + [ids[i + 50:i + 59]]
             for i in range(0, 12, 3)]
    want = []
    for f in feeds:
        r = LlamaRunner(w, 128, torch.float16)
        want.append([r.forward(x) for x in f])
    batcher, got = StepBatcher(max_batch=4), [None] * len(feeds)
    batcher.set_active(len(feeds))

    def run(i: int) -> None:
        v = Via(NativeRunner(w, lib, 128), batcher)
        got[i] = [v.forward(x) for x in feeds[i]]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batcher.batched_calls == 0
    for a, b in zip(want, got):
        for x, y in zip(a, b):
            close(x, y, kv16=True)


def test_kv_cache_option_reaches_the_runners(lib, tok):
    """EngineConfig.kv_cache picks the native runners' cache type (target and draft), the KV
    budget reserves what they hold, and a completion through either is greedy and complete; f16
    halves the bytes a cached token takes."""
    got, v = {}, tok.get_vocab_size()
    for kv in ("f16", "f32"):
        pair = Pair(random_llama(64, 2, 0, vocab=v, dtype=torch.float32),
                    random_llama(32, 1, 1, vocab=v, dtype=torch.float32), tok, "t", "d", torch.device("cpu"))
        e = engine(pair, kv_cache=kv)
        c = e.complete("def f(x):\n    return ", "\n", doc_key="a")
        cache = e.caches["a"]
        assert type(cache.target) is NativeRunner and cache.target.k.dtype == KV_DTYPES[kv]
        assert cache.draft.k.dtype == KV_DTYPES[kv]
        assert e.cache_bytes == cache.target.reserved_bytes() + cache.draft.reserved_bytes()  # the budget's unit
        got[kv] = (c.new_tokens, cache.target.kv_bytes() / len(cache.target.ids))
    assert got["f16"][1] * 2 == got["f32"][1] and got["f16"][0] > 0


def test_amx_threshold_is_where_tiles_stop_losing():
    """calibrate.amx_threshold: the fewest rows from which tiles never measured slower; one past
    the largest size when they lose there too."""
    from completer.engine.calibrate import amx_threshold

    regs = {1: 3.0, 2: 3.2, 3: 3.8, 5: 4.5, 9: 6.5, 17: 10.7}
    assert amx_threshold({t: v * 0.9 for t, v in regs.items()}, regs) == 1
    assert amx_threshold({1: 3.9, 2: 4.0, 3: 3.7, 5: 4.6, 9: 6.0, 17: 9.5}, regs) == 9  # 5 lost
    assert amx_threshold({t: v * 1.1 for t, v in regs.items()}, regs) == 18


def test_warm_start_chooses_the_amx_rows(amx_bf16):
    """Engine.warm_start measures the embedded target's forwards on tiles and in registers and sets
    the library's threshold to what it chose (stats: amx_rows); a target without fp16 products
    (fast-int8) leaves it alone. Either way the greedy ids are the same (the tests above)."""
    from completer.config import EngineConfig
    from completer.engine.calibrate import AMX_SIZES
    from completer.engine.engine import Engine

    lib = library()[0]
    before = lib.nstep_amxh_rows(-1)
    try:
        e = Engine(EngineConfig(device="cpu", quant="auto"))
        e.warm_start()
        rows = e.stats()["amx_rows"]
        assert rows in (*AMX_SIZES, max(AMX_SIZES) + 1) and lib.nstep_amxh_rows(-1) == rows
        lib.nstep_amxh_rows(before)
        q = Engine(EngineConfig(device="cpu", quant="fast-int8"))
        q.warm_start()
        assert q.stats()["amx_rows"] is None and lib.nstep_amxh_rows(-1) == before
    finally:
        lib.nstep_amxh_rows(before)
