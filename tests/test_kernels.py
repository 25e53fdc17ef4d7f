"""Triton kernels against their PyTorch references (TRITON_INTERPRET=1 on the CPU: small, odd
shapes), and the quantization formats against the float weights."""
from __future__ import annotations

import pytest
import torch

from kernels import quant

SHAPES = [(1, 64, 32), (3, 96, 50), (7, 128, 129), (17, 64, 70)]  # (M, K, N): odd N, M > one block


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_int8_kernel_matches_reference(M, K, N, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(M * N)
    w, x = torch.randn(N, K, generator=g), torch.randn(M, K, generator=g)
    q, s = quant.quantize_int8(w)
    ref = quant.int8_matmul_ref(x, q, s)
    got = quant.int8_matmul(x, q, s)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # the format itself: within int8 rounding of the float product
    assert (ref - x @ w.T).abs().max() < 0.02 * (x @ w.T).abs().max()


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_int4_kernel_matches_reference(M, K, N, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g = torch.Generator().manual_seed(M + N)
    w, x = torch.randn(N, K, generator=g), torch.randn(M, K, generator=g)
    p, s, z = quant.quantize_int4(w, 32)
    ref = quant.int4_matmul_ref(x, p, s, z, 32)
    got = quant.int4_matmul(x, p, s, z, 32)
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)
    deq = quant.dequant_int4(p, s, z, 32)
    assert (deq - w).abs().max() <= (s.max() / 2) + 1e-5  # half a quantization step


def test_without_triton_driver_falls_back_to_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    x, w = torch.randn(2, 64), torch.randn(8, 64)
    q, s = quant.quantize_int8(w)
    assert torch.equal(quant.int8_matmul(x, q, s), quant.int8_matmul_ref(x, q, s))


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="int8_matmul"):
        quant.int8_matmul(torch.randn(2, 64), torch.zeros(8, 32, dtype=torch.int8), torch.ones(8))
    with pytest.raises(ValueError, match="multiple of the group"):
        quant.quantize_int4(torch.randn(8, 48), 32)
