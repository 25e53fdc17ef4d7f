"""Weight-only quantized matmuls for small-batch decoding: y[M, N] = x[M, K] @ dequant(W)[N, K]ᵀ.

At batch 1 a decode step reads every weight once: int8 halves the bytes of bf16, int4 quarters
them, and the speed follows the bytes when the kernel dequantizes in registers. Each kernel has
a PyTorch reference (`*_ref`) that is also the fallback on machines without a Triton driver;
tests compare them with TRITON_INTERPRET=1 on the CPU.

Formats
- int8: per-output-channel symmetric: W ≈ q[N, K] (int8) · scale[N].
- int4: per-group asymmetric, group G along K: W ≈ (q - zero) · scale with q in 0..15 packed
  two per byte along K (low nibble = even k): packed[N, K/2] uint8, scale/zero [N, K/G].
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is a dependency, but keep the references usable without it
    triton = None


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.float().abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [N]
    q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int8_matmul_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() @ q.float().T * scale).to(x.dtype)


def quantize_int4(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    N, K = w.shape
    if K % group or group % 2:
        raise ValueError(f"int4: K={K} must be a multiple of the group size {group}")
    g = w.float().view(N, K // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = (hi - lo).clamp_min(1e-8) / 15.0  # [N, K/G]
    zero = -lo / scale  # real-valued zero point: w = (q - zero) · scale
    q = torch.round(g / scale[..., None] + zero[..., None]).clamp(0, 15).to(torch.uint8).view(N, K)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)  # [N, K/2]
    return packed, scale, zero


def dequant_int4(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    N = packed.shape[0]
    q = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(N, -1).float()  # [N, K]
    K = q.shape[1]
    return ((q.view(N, K // group, group) - zero[..., None]) * scale[..., None]).view(N, K)


def int4_matmul_ref(x: torch.Tensor, packed, scale, zero, group: int) -> torch.Tensor:
    return (x.float() @ dequant_int4(packed, scale, zero, group).T).to(x.dtype)


if triton is not None:
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


def triton_available(t: torch.Tensor) -> bool:
    """Triton runs on CUDA tensors, or anywhere under TRITON_INTERPRET=1 (CPU tests)."""
    return triton is not None and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _blocks(M: int) -> tuple[int, int, int]:
    # tl.dot needs every block dim ≥ 16; decode batches are tiny, so BLOCK_M stays at 16.
    return 16 if M <= 16 else 32, 64, 64


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (fp32/bf16/fp16) @ (q [N, K] int8 · scale [N])ᵀ → [M, N] in x.dtype."""
    M, K = x.shape
    N, K2 = q.shape
    if K != K2 or scale.shape != (N,):
        raise ValueError(f"int8_matmul: x {tuple(x.shape)}, q {tuple(q.shape)}, scale {tuple(scale.shape)}")
    if not triton_available(x):
        return int8_matmul_ref(x, q, scale)
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    BM, BN, BK = _blocks(M)
    _int8_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
        x, q, scale, y, M, N, K, x.stride(0), q.stride(0), y.stride(0), BM, BN, BK)
    return y


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                group: int) -> torch.Tensor:
    """x [M, K] @ dequant(packed [N, K/2], scale/zero [N, K/group])ᵀ → [M, N] in x.dtype."""
    M, K = x.shape
    N = packed.shape[0]
    if packed.shape[1] * 2 != K or scale.shape != (N, K // group) or zero.shape != scale.shape:
        raise ValueError(f"int4_matmul: x {tuple(x.shape)}, packed {tuple(packed.shape)}, "
                         f"scale {tuple(scale.shape)}, group {group}")
    if not triton_available(x):
        return int4_matmul_ref(x, packed, scale, zero, group)
    x = x.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    BM, BN, BK = _blocks(M)
    _int4_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
        x, packed, scale, zero, y, M, N, K, x.stride(0), packed.stride(0), scale.stride(0), y.stride(0),
        group, BM, BN, BK)
    return y
