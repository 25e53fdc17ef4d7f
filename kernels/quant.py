"""Weight-only quantized matmuls for small-batch decoding: y[M, N] = x[M, K] @ dequant(W)[N, K]ᵀ.

At batch 1 a decode step reads every weight once: int8 halves the bytes of bf16, int4 quarters
them, and the speed follows the bytes when the kernel dequantizes in registers. Each kernel has
a PyTorch reference (`*_ref`) that is also the fallback on machines without a Triton driver or
without triton installed (it is the `gpu` extra); tests compare them with TRITON_INTERPRET=1 on the
CPU. The kernels themselves live in quant_triton.py, imported on the first launch.

Formats
- int8: per-output-channel symmetric: W ≈ q[N, K] (int8) · scale[N].
- int4: per-group asymmetric, group G along K: W ≈ (q - zero) · scale with q in 0..15 packed
  two per byte along K (low nibble = even k): packed[N, K/2] uint8, scale/zero [N, K/G].
"""
from __future__ import annotations

import logging
import os
from functools import cache

import torch

log = logging.getLogger(__name__)


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


def triton_kernels(t: torch.Tensor):
    """The Triton launchers (module quant_triton) for a tensor they can run on, else None (the
    caller uses the reference). Triton runs on CUDA tensors, or anywhere under TRITON_INTERPRET=1
    (CPU tests); only then is triton imported."""
    if not (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    return _import_kernels()


@cache
def _import_kernels():
    try:
        from . import quant_triton
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        log.warning("triton is not installed: int8/int4 matmuls use the PyTorch reference, which "
                    "dequantizes the weights on every call; install the GPU extra: pip install -e '.[gpu]'")
        return None
    return quant_triton


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (fp32/bf16/fp16) @ (q [N, K] int8 · scale [N])ᵀ → [M, N] in x.dtype."""
    K = x.shape[1]
    N, K2 = q.shape
    if K != K2 or scale.shape != (N,):
        raise ValueError(f"int8_matmul: x {tuple(x.shape)}, q {tuple(q.shape)}, scale {tuple(scale.shape)}")
    kern = triton_kernels(x)
    return int8_matmul_ref(x, q, scale) if kern is None else kern.int8_matmul(x, q, scale)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                group: int) -> torch.Tensor:
    """x [M, K] @ dequant(packed [N, K/2], scale/zero [N, K/group])ᵀ → [M, N] in x.dtype."""
    K = x.shape[1]
    N = packed.shape[0]
    if packed.shape[1] * 2 != K or scale.shape != (N, K // group) or zero.shape != scale.shape:
        raise ValueError(f"int4_matmul: x {tuple(x.shape)}, packed {tuple(packed.shape)}, "
                         f"scale {tuple(scale.shape)}, group {group}")
    kern = triton_kernels(x)
    return int4_matmul_ref(x, packed, scale, zero, group) if kern is None else \
        kern.int4_matmul(x, packed, scale, zero, group)
