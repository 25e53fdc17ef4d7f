"""The CPU decode step: NumPy for everything between the matrix products, the fastest kernel
per weight for the products themselves. Target and draft alike; the same forward as
`LlamaRunner` over the same K/V memory.

At batch 1 a decode step is ~25 small operations per layer around 4 matrix products. Eager
torch spends ~5 µs dispatching each small op, NumPy ~1 µs, so the glue (norms, RoPE, the K/V
write, attention, SiLU, residuals) runs in NumPy on zero-copy views. The products go to whichever
kernel measured fastest for the weight's storage (bench/peers.py; 2 AVX2/AVX-512 cores):

- float32: NumPy (OpenBLAS): GEMV per row up to 3 rows, GEMM beyond (one thread, torch's MKL
  GEMM measured no faster at 1-16 rows);
- fp16 storage (`--quant fp16`, `auto`): fbgemm's fp16 GEMM (half the bytes read, fp32 math),
  whose cost barely grows from 1 to 9 rows;
- int8 (`--quant fast-int8`): fbgemm's dynamic int8 GEMM.

Long forwards (prompt prefill, > SHORT tokens) stay on torch's batched path (`LlamaRunner`),
whose fused attention wins there.

The step runs on `decode_threads` torch threads (default 1; NumPy's OpenBLAS always on one): at
these sizes worker threads mostly wait on each other, and while another process holds a core a
parallel region stalls (a 2-token forward took 8 ms instead of 0.9 with a training job on the
second core); more threads pay only on an otherwise idle machine (the note at SHORT).

Eligible (`eligible`): CPU, float32 compute, each matrix dense float32 or fbgemm-packed fp16 /
int8, and a layout (families.py) with RMSNorm and a gated SiLU MLP: Llama (RoPE scaling lives in
the shared rotation table), Mistral (sliding window), Qwen2 (q/k/v biases), Qwen3 (q/k norm).
StarCoder2 and Gemma run on `LlamaRunner`. Shares `LlamaWeights` (zero-copy views of its
transposed-contiguous tensors), including the q/k row order that makes RoPE pairs adjacent and a
restricted LM head (`head_rows`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from .quant import Fp16Weight, Int4Weight, Int8Weight
from .runner import LlamaRunner, LlamaWeights

_BLAS_LIMITED = False


def _one_blas_thread() -> None:
    global _BLAS_LIMITED
    if not _BLAS_LIMITED:
        from threadpoolctl import ThreadpoolController

        ThreadpoolController().select(internal_api="openblas").limit(limits=1)
        _BLAS_LIMITED = True


def _kernel_ok(m, native: bool) -> bool:
    if isinstance(m, torch.Tensor):
        return m.dtype == torch.float32
    if native and isinstance(m, (Fp16Weight, Int8Weight, Int4Weight)) and m.native is not None:
        return True
    return isinstance(m, (Fp16Weight, Int8Weight)) and m._packed is not None


def eligible(w, native: bool = False) -> bool:
    """Whether this step (or with `native`, native_runner.py's) runs `w`: quantized matrices
    packed for fbgemm (or, native, in the native step's layout)."""
    if not (isinstance(w, LlamaWeights) and w.device.type == "cpu" and w.dtype == torch.float32):
        return False
    lay = w.layout
    if lay.norm != "rms" or lay.act != "silu_gated" or lay.embed_scale is not None:
        return False  # LayerNorm, GELU MLPs and Gemma's scaled embeddings stay on LlamaRunner
    if w.embed.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    mats = [w.lm_head] + [m for layer in w.layers for m in layer[1:3] + layer[4:6]]
    return all(_kernel_ok(m, native) for m in mats)


MatMul = Callable[[np.ndarray], np.ndarray]  # x [T, in] float32 → x @ W.T [T, out] float32


def _matmul(w) -> MatMul:
    """x @ w.T with the fastest kernel for w's storage (see the module docstring)."""
    if isinstance(w, Fp16Weight):
        op, packed = torch.ops.quantized.linear_dynamic_fp16, w._packed
        return lambda x: op(torch.from_numpy(np.ascontiguousarray(x)), packed).numpy()
    if isinstance(w, Int8Weight):
        op, packed = torch.ops.quantized.linear_dynamic, w._packed
        return lambda x: op(torch.from_numpy(np.ascontiguousarray(x)), packed, True).numpy()
    wn = w.T.contiguous().numpy()  # [in, out]: a view when stored transposed-contiguous (runner.py)

    def dense(x: np.ndarray) -> np.ndarray:
        if 1 < x.shape[0] <= 3:  # OpenBLAS's GEMM at 2-3 rows costs 2-4x as many GEMVs (measured)
            return np.stack([row @ wn for row in x])
        return x @ wn
    return dense


def _embedding(e: torch.Tensor) -> Callable[[list[int]], np.ndarray]:
    """Rows of the token embedding as float32 [T, D], read from its stored width."""
    if e.dtype == torch.bfloat16:  # NumPy has no bfloat16: widen the bit pattern
        bits = e.view(torch.int16).numpy().view(np.uint16)
        return lambda ids: (bits[ids].astype(np.uint32) << 16).view(np.float32)
    en = e.numpy()
    if en.dtype == np.float32:
        return lambda ids: en[ids]
    return lambda ids: en[ids].astype(np.float32)


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy()


class _Layer(NamedTuple):
    """One layer as the step uses it: norms and biases as NumPy vectors (None where the layout
    has none), each matrix as its matmul kernel."""
    w_in: np.ndarray
    qkv: MatMul
    qkv_b: np.ndarray | None
    o: MatMul
    o_b: np.ndarray | None
    w_post: np.ndarray
    gu: MatMul
    gu_b: np.ndarray | None
    down: MatMul
    down_b: np.ndarray | None
    q_norm: np.ndarray | None
    k_norm: np.ndarray | None


class _NpWeights:
    """The step's view of a LlamaWeights, built once and shared by every runner of that model."""

    def __init__(self, w: LlamaWeights):
        self.embed = _embedding(w.embed)
        self.norm = w.norm.numpy()
        self.head = _matmul(w.lm_head)
        self.layers = [_Layer(a.numpy(), _matmul(qkv), _np(e.qkv_b), _matmul(o), _np(e.o_b), b.numpy(),
                              _matmul(gu), _np(e.gu_b), _matmul(down), _np(e.down_b), _np(e.q_norm), _np(e.k_norm))
                       for (a, qkv, o, b, gu, down), e in zip(w.layers, w.extra)]


class NumpyRunner(LlamaRunner):
    """A LlamaRunner whose short forwards (decode steps, verifies, catching up on a few accepted
    tokens) run the NumPy step over the same K/V memory; long ones (prompt prefill) stay on
    torch, whose batched kernels win there."""

    SHORT = 32  # tokens; NumPy (1 thread) ≈ torch at 64 on 2 AVX2 cores; prefill goes to torch
    # A short forward is ~35 small products, each a parallel region on more than one torch thread:
    # faster on an idle machine, slower when another process holds a core (the region waits for
    # the thread it lost). `python bench/steps.py` on 2 cores, median step ms, 1 vs 2 threads:
    # 0.5B fast-int8 idle 31.4 vs 24.2, one core busy 30.8 vs 85.4; embedded target idle 2.80 vs
    # 2.62, busy 3.15 vs 5.92. Hence `threads` (EngineConfig.decode_threads) defaults to 1.
    # Prefill keeps torch's threads.

    def __init__(self, weights: LlamaWeights, max_len: int | None = None, threads: int = 1):
        w = weights
        self.threads = threads  # torch threads for a short forward: see the note at SHORT
        if not eligible(w):
            raise ValueError("NumpyRunner needs a plain Llama layer on the CPU with float32, fp16 or int8 weights")
        super().__init__(w, max_len)
        _one_blas_thread()
        self.np = w.derive("numpy", lambda: _NpWeights(w))
        self.H = self.n_heads
        self.Hkv = self.n_kv
        self.rot_np = self.rot.numpy()[:, None, :]  # [P, 1, hd/2] complex64
        self.k_np, self.v_np = self.k.numpy()[:, 0], self.v.numpy()[:, 0]  # views [L, Hkv, P, hd]

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if x.shape[0] == 1:  # the decode step: a dot product is 3x cheaper than a reduction
            return x * (w * np.float32(1.0 / np.sqrt(np.dot(x[0], x[0]) / x.shape[1] + self.eps)))
        return x * (1.0 / np.sqrt((x * x).sum(1, keepdims=True) / x.shape[1] + self.eps)) * w

    def _head_rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """RMSNorm over the last axis of [..., hd] (Qwen3's per-head q/k norm)."""
        return x * (1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps)) * w

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        """Append `new_ids`; their logits [T, V] (or over `head_rows`) as a float32 tensor."""
        p, T = len(self.ids), len(new_ids)
        if T > self.SHORT:
            return super().forward(new_ids)
        if p + T > self.max_len:
            raise ValueError(f"context of {p + T} tokens exceeds the model's {self.max_len}")
        W, P = self.np, p + T
        win = self.layout.sliding_window
        lo = 0 if win is None else max(0, p + 1 - win)  # keys [lo, P) are visible (see _attn_span)
        x = W.embed(new_ids)  # [T, D]
        mask = None  # added to the scores' last columns: [T, T] causal, or [T, P-lo] with a window
        if win is None and T > 1:
            mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        elif win is not None and (T > 1 or lo > 0):
            q, k = np.arange(p, P)[:, None], np.arange(lo, P)[None]
            mask = np.where((k <= q) & (k > q - win), np.float32(0), np.float32(-np.inf))
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with np.errstate(over="ignore"):  # SiLU: exp(-gate) = inf gives its limit, 0
                x = self._layers(x, p, T, lo, mask, self.rot_np[p:P])
            logits = W.head(self._rms(x, W.norm))
        finally:
            torch.set_num_threads(threads)
        self.ids.extend(new_ids)
        return torch.from_numpy(logits)

    def _layers(self, x: np.ndarray, p: int, T: int, lo: int, mask: np.ndarray | None,
                rot: np.ndarray) -> np.ndarray:
        H, Hkv, hd, W = self.H, self.Hkv, self.hd, self.np
        g, P = H // Hkv, p + T
        scale = np.float32(hd ** -0.5)
        for li, L in enumerate(W.layers):
            qkv = L.qkv(self._rms(x, L.w_in))  # [T, (H+2Hkv)·hd]
            if L.qkv_b is not None:
                qkv += L.qkv_b
            qk = np.ascontiguousarray(qkv[:, : (H + Hkv) * hd]).reshape(T, H + Hkv, hd)
            if L.q_norm is not None:
                qk = np.concatenate([self._head_rms(qk[:, :H], L.q_norm), self._head_rms(qk[:, H:], L.k_norm)], 1)
            qk = (qk.view(np.complex64) * rot).view(np.float32)  # RoPE: adjacent pairs as complex
            self.k_np[li, :, p:P] = qk[:, H:].transpose(1, 0, 2)
            self.v_np[li, :, p:P] = qkv[:, (H + Hkv) * hd:].reshape(T, Hkv, hd).transpose(1, 0, 2)
            q = qk[:, :H].transpose(1, 0, 2).reshape(Hkv, g, T, hd)  # query heads grouped by KV head
            s = (q @ self.k_np[li, :, None, lo:P].swapaxes(-1, -2)) * scale  # [Hkv, g, T, P-lo]
            if mask is not None:
                s[..., P - lo - mask.shape[1]:] += mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = (s @ self.v_np[li, :, None, lo:P]).reshape(H, T, hd).transpose(1, 0, 2).reshape(T, H * hd)
            x = x + L.o(o)
            if L.o_b is not None:
                x += L.o_b
            gu = L.gu(self._rms(x, L.w_post))
            if L.gu_b is not None:
                gu += L.gu_b
            gate, up = np.split(gu, 2, axis=1)
            x = x + L.down(gate / (1 + np.exp(-gate)) * up)
            if L.down_b is not None:
                x += L.down_b
        return x
