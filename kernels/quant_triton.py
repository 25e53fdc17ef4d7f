"""The Triton kernels behind kernels/quant.py's int8/int4 matmuls, and their launches. Imported
only when a kernel is about to run (a CUDA tensor, or TRITON_INTERPRET=1 in the CPU tests):
importing triton costs ~0.3 s of a CPU cold start, and the package is the `gpu` extra."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _int8_kernel(x_ptr, q_ptr, s_ptr, y_ptr, M, N, K,
                 sxm, sqn, sym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        q = tl.load(q_ptr + rn[None, :] * sqn + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0)
        acc += tl.dot(x.to(tl.float32), q.to(tl.float32))  # dequantized in registers
    s = tl.load(s_ptr + rn, mask=rn < N, other=0.0)
    acc = acc * s[None, :]
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))

@triton.jit
def _int4_kernel(x_ptr, p_ptr, s_ptr, z_ptr, y_ptr, M, N, K,
                 sxm, spn, ssn, sym, GROUP: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        x = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :], mask=(rm[:, None] < M) & kmask[None, :], other=0.0)
        byte = tl.load(p_ptr + rn[None, :] * spn + (rk[:, None] // 2),
                       mask=(rn[None, :] < N) & kmask[:, None], other=0)
        q = ((byte >> ((rk[:, None] % 2) * 4)) & 0xF).to(tl.float32)  # [BK, BN]
        g = rk[:, None] // GROUP
        s = tl.load(s_ptr + rn[None, :] * ssn + g, mask=(rn[None, :] < N) & kmask[:, None], other=0.0)
        z = tl.load(z_ptr + rn[None, :] * ssn + g, mask=(rn[None, :] < N) & kmask[:, None], other=0.0)
        acc += tl.dot(x.to(tl.float32), (q - z) * s)
    tl.store(y_ptr + rm[:, None] * sym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _blocks(M: int) -> tuple[int, int, int]:
    # tl.dot needs every block dim ≥ 16; decode batches are tiny, so BLOCK_M stays at 16.
    return 16 if M <= 16 else 32, 64, 64


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Shapes checked by the caller (completer_kernels.quant.int8_matmul)."""
    M, K = x.shape
    N = q.shape[0]
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    BM, BN, BK = _blocks(M)
    _int8_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
        x, q, scale, y, M, N, K, x.stride(0), q.stride(0), y.stride(0), BM, BN, BK)
    return y


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                group: int) -> torch.Tensor:
    """Shapes checked by the caller (completer_kernels.quant.int4_matmul)."""
    M, K = x.shape
    N = packed.shape[0]
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    BM, BN, BK = _blocks(M)
    _int4_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
        x, packed, scale, zero, y, M, N, K, x.stride(0), packed.stride(0), scale.stride(0), y.stride(0),
        group, BM, BN, BK)
    return y
