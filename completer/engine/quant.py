"""Our quantized weights for the lean runner (every family of families.py): per-module-group
precision. Only matrices are quantized: biases, norms and q/k norms stay in the compute dtype and
are added after the quantized matmul (runner._linear).

Groups: embed (token embedding), attn (q/k/v/o), mlp (gate/up/down), head (LM head). Precisions:
- embed: fp32 | bf16 | fp16 — stored at that width, cast to the compute dtype on lookup;
- attn/mlp/head: none | fp16 | int8 | int4. fp16 = half-width storage, fp32 math (exact for
  16-bit checkpoints, see Fp16Weight); int8 = per-channel symmetric; on CPU fbgemm's
  dynamic-int8 scheme (int8 activations × int8 weights) through the native step's kernels
  (native_runner.py; fbgemm's own where they are unavailable), on CUDA the Triton weight-only
  kernel in kernels/quant.py. int4 = group-32 asymmetric, packed two per byte; CUDA: Triton kernel,
  CPU: the native step's int4 kernel (Int4Weight), else dequantized per call.

A quantized weight `w` works wherever the runner writes `x @ w.T`: `w.T` is an object whose
`__rmatmul__` applies the quantized matmul, so runner code (and the batcher) stays unchanged.

Modes (`--quant`): fp16 = attn/mlp/head fp16; fast-int8 = attn/mlp/head int8; mixed = `--quant-groups` (default
embed=fp16,attn=int8,mlp=int4,head=int8). int8/nf4 are bitsandbytes (see models.py).
"""
from __future__ import annotations

import ctypes

import torch

from completer_kernels import native
from completer_kernels import quant as kq

from .native_lib import native_or_none

DEFAULT_GROUPS = "embed=fp16,attn=int8,mlp=int4,head=int8"
MODE_GROUPS = {"fp16": "embed=fp16,attn=fp16,mlp=fp16,head=fp16",
               "fast-int8": "embed=fp32,attn=int8,mlp=int8,head=int8",
               # group-32 4-bit weights for every layer's products (llama.cpp's q4_0 keeps 8 bits for
               # the output layer too); needs widths that are multiples of 32
               "int4": "embed=fp16,attn=int4,mlp=int4,head=int8"}
_EMBED = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_LINEAR = ("none", "fp16", "int8", "int4")


def parse_groups(spec: str) -> dict[str, str]:
    out = {"embed": "fp32", "attn": "none", "mlp": "none", "head": "none"}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, val = part.partition("=")
        if key not in out:
            raise ValueError(f"--quant-groups: unknown group {key!r} (embed, attn, mlp, head)")
        allowed = _EMBED if key == "embed" else _LINEAR
        if val not in allowed:
            raise ValueError(f"--quant-groups: {key}={val!r}; expected one of {', '.join(allowed)}")
        out[key] = val
    return out


class _T:
    """The transpose of a quantized weight: `x @ w.T` calls back into the weight."""

    def __init__(self, w):
        self.w = w

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.matmul(x)


class Int8Weight:
    """CPU: the native step's int8 layout (native_runner.py; fbgemm's dynamic-int8 scheme, faster
    at every row count), or fbgemm's own packing where the native library is unavailable; one
    int8 copy either way."""

    def __init__(self, w: torch.Tensor):
        self.shape, self.dtype = w.shape, w.dtype
        self.q, self.scale = kq.quantize_int8(w)  # [N, K] int8, [N] fp32
        self.T = _T(self)
        self._packed = self.native = None
        if not w.is_cuda:
            self.native = native_pack("int8", q=self.q.numpy(), scale=self.scale.numpy())
            if self.native is None:
                qw = torch.quantize_per_channel(w.float(), self.scale.double(),
                                                torch.zeros_like(self.scale, dtype=torch.long), 0, torch.qint8)
                self._packed = torch.ops.quantized.linear_prepack(qw, None)
            self.q = None  # the packed copy is the only one

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return native_matmul(self.native, x)
        if self._packed is not None:
            y = torch.ops.quantized.linear_dynamic(x.float().reshape(-1, x.shape[-1]), self._packed, True)
            return y.reshape(*x.shape[:-1], -1).to(x.dtype)
        return kq.int8_matmul(x.reshape(-1, x.shape[-1]), self.q, self.scale).reshape(*x.shape[:-1], -1)

    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] + 4 * self.shape[0]


class Fp16Weight:
    """Half-width storage, fp32 arithmetic (weights widened in registers, fp32 accumulate). CPU:
    the native step's kernels (fbgemm's fp16 GEMM without them; both read the weights once for
    up to 6-8 rows, where MKL's fp32 GEMM cost 2-3x more for a 7-token verify). Exact for weights that came
    from an fp16 checkpoint; from bf16, values under fp16's normal range (|w| < 6.1e-5) keep
    fewer bits (logits move by ~1e-6, the size of fp32 summation-order noise)."""

    def __init__(self, w: torch.Tensor):
        self.shape, self.dtype = w.shape, w.dtype
        self.T = _T(self)
        self.w16 = self._packed = self.native = None
        if w.is_cuda:
            self.w16 = w.half()
        else:  # the native step's layout, else fbgemm's (as Int8Weight)
            self.native = native_pack("f16", w=w.float().contiguous().numpy())
            if self.native is None:
                self._packed = torch.ops.quantized.linear_prepack_fp16(w.float().contiguous(), None)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return native_matmul(self.native, x)
        if self._packed is None:
            return (x.half() @ self.w16.T).to(x.dtype)
        y = torch.ops.quantized.linear_dynamic_fp16(x.float().reshape(-1, x.shape[-1]), self._packed)
        return y.reshape(*x.shape[:-1], -1).to(x.dtype)

    def nbytes(self) -> int:
        """What it keeps: the native layout (with the AMX-BF16 pairs native_runner adds where it
        multiplies on them: as many bytes again), else fbgemm's fp16 pack."""
        return self.native.nbytes() if self.native is not None else 2 * self.shape[0] * self.shape[1]


def native_pack(kind: str, **arrays):
    """A CPU weight in the native step's layout (kernels/native.py), None without the library."""
    lib = native_or_none()
    if lib is None:
        return None
    p = native.Packed(kind, lib.nstep_block_width(), **arrays)
    p.lib = lib
    return p


def native_matmul(p, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T through the native kernels on torch's threads (prefill, batched steps)."""
    x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
    y = torch.empty(x2.shape[0], p.mat.N)
    if x2.shape[0]:
        p.lib.nstep_matmul(ctypes.byref(p.mat), x2.data_ptr(), x2.shape[0], y.data_ptr(), torch.get_num_threads())
    return y.reshape(*x.shape[:-1], -1).to(x.dtype)


class Int4Weight:
    """CPU: the native step's int4 kernel (nibbles unpacked in registers, integer dot products
    against the same 7-bit dynamic activations as int8), else dequantized per call."""
    GROUP = 32

    def __init__(self, w: torch.Tensor):
        self.shape, self.dtype = w.shape, w.dtype
        self.packed, self.scale, self.zero = kq.quantize_int4(w, self.GROUP)
        self.T = _T(self)
        self.native = None
        if not w.is_cuda:
            q = torch.stack([self.packed & 0xF, self.packed >> 4], -1).view(w.shape[0], -1)
            self.native = native_pack("int4", q=q.numpy(), scale=self.scale.numpy(), zero=self.zero.numpy())
            if self.native is not None:
                self.packed = self.scale = self.zero = None  # one copy

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return native_matmul(self.native, x)
        x2 = x.reshape(-1, x.shape[-1])
        return kq.int4_matmul(x2, self.packed, self.scale, self.zero, self.GROUP).reshape(*x.shape[:-1], -1)

    def nbytes(self) -> int:
        N, K = self.shape
        return N * K // 2 + 8 * N * (K // self.GROUP)


def _q(w: torch.Tensor, prec: str):
    if prec == "none":
        return w
    w = w.contiguous()  # dense weights are kept transposed in memory (runner.py); pack row-major
    if prec == "int4" and w.shape[1] % Int4Weight.GROUP:
        raise ValueError(f"int4 needs input widths that are multiples of {Int4Weight.GROUP}; got {w.shape[1]}")
    return {"fp16": Fp16Weight, "int8": Int8Weight, "int4": Int4Weight}[prec](w)


def quantize_weights(weights, spec: str):
    """Replace `weights`' matrices in place by quantized ones per group; returns the groups."""
    g = parse_groups(spec)
    compute = weights.norm.dtype
    head = weights.lm_head
    weights.lm_head = _q(head, g["head"])
    weights.embed = weights.embed.to(_EMBED[g["embed"]])
    weights.layers = [(w_in, _q(wqkv, g["attn"]), _q(wo, g["attn"]), w_post, _q(wgu, g["mlp"]),
                       _q(wdown, g["mlp"])) for (w_in, wqkv, wo, w_post, wgu, wdown) in weights.layers]
    weights.dtype = compute
    weights.quant_groups = g
    weights.derived.clear()  # runners' forms of the old matrices
    return g


def model_bytes(model) -> int:
    """Bytes of a model's weights: an HF module's footprint, or lean weights' packed size."""
    return int(model.get_memory_footprint()) if isinstance(model, torch.nn.Module) else weight_bytes(model)


def weight_bytes(weights) -> int:
    """Bytes of all weights (quantized ones at their packed size; a tied head counted once)."""
    seen, total = set(), 0
    for t in [weights.embed, weights.lm_head, weights.norm, weights.norm_b] + [
            w for layer, e in zip(weights.layers, weights.extra) for w in (*layer, *e)]:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        total += t.nbytes() if isinstance(t, (Fp16Weight, Int8Weight, Int4Weight)) else t.numel() * t.element_size()
    return total
