"""The draft model's CPU runner in NumPy: the same Llama forward as `LlamaRunner`, with a fraction
of the per-operation cost.

A small draft at batch 1 is all overhead: its matrices are a few hundred KB and sit in cache, so
a decode step is ~25 tensor operations whose dispatch costs more than their arithmetic. PyTorch
spends ~5 µs per eager op here, NumPy ~1 µs, so the draft's step drops ~2.5x
(`bench/speculative.py` prints the measured step-time ratio c = draft/target). Speculative
decoding only pays off when c is small: the verify step is exact whatever the draft computes, so
the draft may use a different kernel library (its proposals, and their probabilities when
sampling, are what the verifier sees).

NumPy's OpenBLAS is held to one thread: at these sizes its worker threads only wait on each
other and on torch's, and while another process holds a core a 2-token forward took 8 ms instead
of 0.9 (measured with a training job on the second core).

Eligible: CPU, float32, dense weights (`eligible`). Shares `LlamaWeights` (zero-copy views of
its transposed-contiguous tensors), including the q/k row order that makes RoPE pairs adjacent
and a restricted LM head (`head_rows`).
"""
from __future__ import annotations

import numpy as np
import torch

from .runner import LlamaRunner, LlamaWeights

_BLAS_LIMITED = False


def _one_blas_thread() -> None:
    global _BLAS_LIMITED
    if not _BLAS_LIMITED:
        from threadpoolctl import ThreadpoolController

        ThreadpoolController().select(internal_api="openblas").limit(limits=1)
        _BLAS_LIMITED = True


def eligible(w) -> bool:
    if not (isinstance(w, LlamaWeights) and w.device.type == "cpu" and w.dtype == torch.float32):
        return False
    mats = [w.lm_head] + [m for layer in w.layers for m in layer]
    return all(isinstance(m, torch.Tensor) and m.dtype == torch.float32 for m in mats)


class _NpWeights:
    """NumPy views of a LlamaWeights' tensors ([in, out] for matrices: x @ W), built once and
    shared by every runner of that model."""

    def __init__(self, w: LlamaWeights):
        def mat(t: torch.Tensor) -> np.ndarray:
            return t.T.contiguous().numpy()  # a view when stored transposed-contiguous (runner.py)

        self.embed = w.embed.float().numpy()
        self.norm = w.norm.numpy()
        self.head = mat(w.lm_head)
        self.layers = [(a.numpy(), mat(qkv), mat(o), b.numpy(), mat(gu), mat(down))
                       for a, qkv, o, b, gu, down in w.layers]


class NumpyRunner(LlamaRunner):
    """A LlamaRunner whose short forwards (decode steps, catching up on a few accepted tokens)
    run in NumPy over the same K/V memory; long ones (prompt prefill) stay on torch, whose
    batched kernels win there."""

    SHORT = 32  # tokens; NumPy (1 thread) ≈ torch at 64 on 2 AVX2 cores; prefill goes to torch

    def __init__(self, weights: LlamaWeights, max_len: int | None = None):
        w = weights
        if not eligible(w):
            raise ValueError("NumpyRunner needs dense float32 weights on the CPU")
        super().__init__(w, max_len)
        _one_blas_thread()
        cached = getattr(w, "_np", None)
        if cached is None or cached[0] is not w.lm_head:  # (re)built after restrict_head
            cached = w._np = (w.lm_head, _NpWeights(w))
        self.np = cached[1]
        self.H = self.n_heads
        self.Hkv = self.n_kv
        self.rot_np = self.rot.numpy()[:, None, :]  # [P, 1, hd/2] complex64
        self.k_np, self.v_np = self.k.numpy()[:, 0], self.v.numpy()[:, 0]  # views [L, Hkv, P, hd]

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if x.shape[0] == 1:  # the decode step: a dot product is 3x cheaper than a reduction
            return x * (w * np.float32(1.0 / np.sqrt(np.dot(x[0], x[0]) / x.shape[1] + self.eps)))
        return x * (1.0 / np.sqrt((x * x).sum(1, keepdims=True) / x.shape[1] + self.eps)) * w

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        """Append `new_ids`; their logits [T, V] (or over `head_rows`) as a float32 tensor."""
        p, T = len(self.ids), len(new_ids)
        if T > self.SHORT:
            return super().forward(new_ids)
        if p + T > self.max_len:
            raise ValueError(f"context of {p + T} tokens exceeds the model's {self.max_len}")
        W, P = self.np, p + T
        x = W.embed[new_ids]  # [T, D]
        rot = self.rot_np[p:P]
        mask = np.triu(np.full((T, P), -np.inf, dtype=np.float32), p + 1) if T > 1 else None
        with np.errstate(over="ignore"):  # SiLU: exp(-gate) = inf gives its limit, 0
            x = self._layers(x, p, T, mask, rot)
        self.ids.extend(new_ids)
        return torch.from_numpy(self._rms(x, W.norm) @ W.head)

    def _layers(self, x: np.ndarray, p: int, T: int, mask: np.ndarray | None, rot: np.ndarray) -> np.ndarray:
        H, Hkv, hd, W = self.H, self.Hkv, self.hd, self.np
        g, P = H // Hkv, p + T
        scale = np.float32(hd ** -0.5)
        for li, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(W.layers):
            qkv = self._rms(x, w_in) @ wqkv  # [T, (H+2Hkv)·hd]
            qk = np.ascontiguousarray(qkv[:, : (H + Hkv) * hd]).reshape(T, H + Hkv, hd)
            qk = (qk.view(np.complex64) * rot).view(np.float32)  # RoPE: adjacent pairs as complex
            self.k_np[li, :, p:P] = qk[:, H:].transpose(1, 0, 2)
            self.v_np[li, :, p:P] = qkv[:, (H + Hkv) * hd:].reshape(T, Hkv, hd).transpose(1, 0, 2)
            q = qk[:, :H].transpose(1, 0, 2).reshape(Hkv, g, T, hd)  # query heads grouped by KV head
            s = (q @ self.k_np[li, :, None, :P].swapaxes(-1, -2)) * scale  # [Hkv, g, T, P]
            if mask is not None:
                s += mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = (s @ self.v_np[li, :, None, :P]).reshape(H, T, hd).transpose(1, 0, 2).reshape(T, H * hd)
            x = x + o @ wo
            gu = self._rms(x, w_post) @ wgu
            gate, up = np.split(gu, 2, axis=1)
            x = x + (gate / (1 + np.exp(-gate)) * up) @ wdown
        return x
