"""Triton kernels against their PyTorch references (TRITON_INTERPRET=1 on the CPU: small, odd
shapes), and the quantization formats against the float weights."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import missing

from completer_kernels import quant


@pytest.fixture
def interpret(monkeypatch):
    """The Triton path on the CPU: triton in interpreter mode. triton is the `gpu` extra (dev brings
    it); without it these tests would compare the reference with itself, so they skip (fail in CI)."""
    if importlib.util.find_spec("triton") is None:
        why = "the Triton kernels need triton: pip install -e '.[gpu]' (or '.[dev]')"
        missing(why)
    monkeypatch.setenv("TRITON_INTERPRET", "1")

SHAPES = [(1, 64, 32), (3, 96, 50), (7, 128, 129), (17, 64, 70)]  # (M, K, N): odd N, M > one block
# Activations in each dtype; the kernel accumulates in fp32 like the reference, so the gap is the
# output's rounding: ~1 ulp of the dtype at the output's magnitude (|y| up to ~40 here).
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-3), torch.bfloat16: (2e-1, 1.6e-2)}


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_int8_kernel_matches_reference(M, K, N, dtype, interpret):
    g = torch.Generator().manual_seed(M * N)
    w, x = torch.randn(N, K, generator=g), torch.randn(M, K, generator=g).to(dtype)
    q, s = quant.quantize_int8(w)
    ref = quant.int8_matmul_ref(x, q, s)
    assert quant.triton_kernels(x) is not None  # the kernel runs, not the reference again
    got = quant.int8_matmul(x, q, s)
    assert got.dtype == dtype and got.shape == (M, N)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    # the format itself: within int8 rounding of the float product
    exact = x.float() @ w.T
    assert (ref.float() - exact).abs().max() < 0.02 * exact.abs().max() + atol


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_int4_kernel_matches_reference(M, K, N, dtype, interpret):
    g = torch.Generator().manual_seed(M + N)
    w, x = torch.randn(N, K, generator=g), torch.randn(M, K, generator=g).to(dtype)
    p, s, z = quant.quantize_int4(w, 32)
    ref = quant.int4_matmul_ref(x, p, s, z, 32)
    assert quant.triton_kernels(x) is not None
    got = quant.int4_matmul(x, p, s, z, 32)
    assert got.dtype == dtype and got.shape == (M, N)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, ref, atol=10 * atol, rtol=10 * rtol)
    deq = quant.dequant_int4(p, s, z, 32)
    assert (deq - w).abs().max() <= (s.max() / 2) + 1e-5  # half a quantization step


def test_without_triton_driver_falls_back_to_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    assert quant.triton_kernels(torch.randn(2, 64)) is None
    x, w = torch.randn(2, 64), torch.randn(8, 64)
    q, s = quant.quantize_int8(w)
    assert torch.equal(quant.int8_matmul(x, q, s), quant.int8_matmul_ref(x, q, s))


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="int8_matmul"):
        quant.int8_matmul(torch.randn(2, 64), torch.zeros(8, 32, dtype=torch.int8), torch.ones(8))
    with pytest.raises(ValueError, match="multiple of the group"):
        quant.quantize_int4(torch.randn(8, 48), 32)
