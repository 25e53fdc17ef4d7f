"""The native CPU decode step: one C++ call per forward (completer_kernels.native; prefill in chunks), target
and draft alike (a draft's greedy proposal of k tokens is one call too), for the models
np_runner.py's NumPy step takes (Llama, Mistral's window, Qwen2's biases, Qwen3's q/k norm) with
float32, fp16-storage, int8 or int4 weights.

Why: the NumPy step spends more than half of its time outside arithmetic (perf: CPython, NumPy
dispatch, allocation), ~25 small operations per layer around 4 products; here embedding, norms,
products, RoPE, the K/V write into the runner's own cache, attention, the MLP and the LM head run
in one call (perf: 83 % of a step inside the library). Results equal the torch forward's up to
float32 summation order; int8 follows fbgemm's dynamic quantization step by step (per-tensor
uint8 activations, reduce_range), its products bit-equal to fbgemm's.

Long forwards (prompt prefill) run natively too, in chunks of CHUNK rows on torch's threads (as
prefill did on torch's forward, which the native step beat at every length tried, 33 to 400 rows,
on the embedded target and the 0.5B shape; `bench/steps.py` prints 33 and 64). Concurrent generations step
side by side on their own threads (batch.py): the call holds no GIL.

The library is compiled on first use for this CPU's vector extensions (kernels/native.py, ~1.5 s
once per machine). Where it cannot be (no compiler, no AVX2, COMPLETER_NATIVE=0) `make_runner`
keeps the NumPy step and logs why, once.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from completer_kernels import native

from .np_runner import NumpyRunner, eligible
from .quant import Fp16Weight, Int8Weight
from .runner import LlamaRunner, LlamaWeights


def _pack(m, bw: int, bias: torch.Tensor | None) -> native.Packed:
    b = None if bias is None else bias.float().numpy()
    p = getattr(m, "native", None)
    if p is not None:  # quantized into the native layout (quant.py): shared, or repacked for another build's
        return p.with_bias(b) if p.bw == bw else native.Packed(p.kind, bw, bias=b, **p.dense())
    if isinstance(m, Fp16Weight):  # packed for fbgemm while the library was off: unpack a copy
        w = torch.ops.quantized.linear_unpack_fp16(m._packed)[0]  # the fp16 values, widened
        return native.Packed("f16", bw, w.numpy(), b)
    if isinstance(m, Int8Weight):
        qw = torch.ops.quantized.linear_unpack(m._packed)[0]
        return native.Packed("int8", bw, bias=b, q=qw.int_repr().numpy(), scale=qw.q_per_channel_scales().float().numpy())
    return native.Packed("f32", bw, m.numpy(), b)


_EMBED_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# fp16 weights up to this size whose values are all bf16 (an fp16 pack of a bf16 checkpoint) also
# get the layout AMX-BF16 products read (step.cpp's rows_h_amx: from one row on one thread, from 8
# on more), as many bytes again: the embedded target's 20 MB take 20 MB more, a 0.5B model's 1 GB
# would take 1 GB, so it keeps the register path (its users run fast-int8: AMX int8, no copy).
BF16_PAIRS_MAX_BYTES = 256 << 20


def _add_bf16_pairs(w: LlamaWeights, lib: ctypes.CDLL) -> None:
    """Give `w`'s fp16 weights (quant.py's native packs, which prefill's products share) the
    AMX-BF16 layout, where this build multiplies on AMX-BF16 and they are within
    BF16_PAIRS_MAX_BYTES; those with a value that is not a bf16 keep the register path."""
    if lib.nstep_amxh_rows(-1) <= 0:
        return
    mats = [m for layer in w.layers for m in (layer[1], layer[2], layer[4], layer[5])] + [w.lm_head]
    packs = [(m, p) for m in mats if (p := getattr(m, "native", None)) is not None and p.kind == "f16"]
    if 0 < sum(p.w.nbytes for _, p in packs) <= BF16_PAIRS_MAX_BYTES:
        for m, p in packs:
            if getattr(p, "wbf", None) is None and p.bw == lib.nstep_block_width():
                m.native = p.with_bf16_pairs() or p


class NativeWeights:
    """A LlamaWeights in the kernels' layout (one copy per model, shared by its runners)."""

    def __init__(self, w: LlamaWeights, lib: ctypes.CDLL):
        bw = lib.nstep_block_width()
        lay = w.layout

        def vec(t: torch.Tensor | None) -> np.ndarray | None:
            return None if t is None else np.ascontiguousarray(t.float().numpy())

        self.keep: list = []  # every array a pointer below refers to

        def p(a):
            if a is None:
                return None
            self.keep.append(a)
            return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()

        _add_bf16_pairs(w, lib)
        layers = []
        for (w_in, qkv, o, w_post, gu, down), e in zip(w.layers, w.extra):
            mats = [_pack(qkv, bw, e.qkv_b), _pack(o, bw, e.o_b), _pack(gu, bw, e.gu_b), _pack(down, bw, e.down_b)]
            self.keep += mats
            layers.append(native.Layer(p(vec(w_in)), p(vec(w_post)), p(vec(e.q_norm)), p(vec(e.k_norm)),
                                       *(m.mat for m in mats)))
        self.layers = (native.Layer * len(layers))(*layers)
        head = _pack(w.lm_head, bw, None)
        self.keep.append(head)
        embed = w.embed.contiguous()
        inter = (w.layers[0][4].shape[0]) // 2  # gate and up stacked
        self.vocab = embed.shape[0]
        self.model = native.Model(embed.shape[1], w.n_heads, w.n_kv, w.hd, inter, len(layers),
                                  head.mat.N, lay.sliding_window or 0, _EMBED_KIND[embed.dtype], w.eps,
                                  p(embed), p(vec(w.norm)), self.layers, head.mat)


class NativeRunner(LlamaRunner):
    """A LlamaRunner whose forwards (decode steps, verifies, a draft's proposal, prefill in chunks)
    are calls into the native step over the same K/V memory."""

    SHORT = NumpyRunner.SHORT  # tokens a forward may have to run on `threads` (decode_threads); longer
    # ones (prefill) run on torch's threads, as prefill always did
    CHUNK = 512  # rows per native call of a longer forward (the scratch grows with the rows)

    def __init__(self, weights: LlamaWeights, lib: ctypes.CDLL, max_len: int | None = None, threads: int = 1,
                 kv_dtype: torch.dtype = torch.float16):
        if not eligible(weights, native=True):
            raise ValueError("NativeRunner needs a plain Llama layer on the CPU with float32, fp16 or int8 weights")
        if kv_dtype not in (torch.float16, torch.float32) or (kv_dtype == torch.float16 and weights.hd % 2):
            raise ValueError(f"NativeRunner keeps its K/V cache in float16 or float32 (even head widths for "
                             f"float16), not {kv_dtype} at head width {weights.hd}")
        super().__init__(weights, max_len, kv_dtype)
        self._kv16 = int(kv_dtype == torch.float16)
        w = weights
        self.nw = w.derive(("native", lib), lambda: NativeWeights(w, lib))
        self.lib, self.threads = lib, threads
        self._model = ctypes.byref(self.nw.model)
        self._rot = self.rot.contiguous()
        self._out_cols = self.nw.model.V
        self._rows = None if self.head_rows is None else np.array(self.head_rows, dtype=np.int64)

    def _check(self, new_ids: list[int], extra: int = 0) -> np.ndarray:
        p, T = len(self.ids), len(new_ids)
        if p + T + extra > self.max_len:
            raise ValueError(f"context of {p + T + extra} tokens exceeds the model's {self.max_len}")
        if min(new_ids) < 0 or max(new_ids) >= self.nw.vocab:
            raise IndexError(f"token id out of range 0..{self.nw.vocab - 1}")
        return np.array(new_ids, dtype=np.int64)

    def greedy(self, new_ids: list[int], k: int) -> list[int]:
        """Feed `new_ids`, then propose k tokens greedily (each fed but the last): a draft's whole
        proposal in one native call (ModelDrafter uses it when sampling is greedy)."""
        if len(new_ids) > self.SHORT:  # the prompt's catch-up: a prefill, then the proposal's call
            self.forward(new_ids[:-1])
            new_ids = new_ids[-1:]
        ids, out = self._check(new_ids, k - 1), np.empty(k, np.int64)
        rows = None if self._rows is None else self._rows.ctypes.data
        if self.lib.nstep_greedy(self._model, self.k.data_ptr(), self.v.data_ptr(), self._kv16, self.max_len,
                                 self._rot.data_ptr(), ids.ctypes.data, len(new_ids), len(self.ids), k, rows,
                                 out.ctypes.data, self.threads):
            raise RuntimeError("the native step refused a draft")
        picks = out.tolist()
        self.ids.extend(new_ids + picks[:-1])
        return picks

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        """Append `new_ids`; their logits [T, V] (or over `head_rows`) as a float32 tensor."""
        p, T = len(self.ids), len(new_ids)
        if T == 0:
            return super().forward(new_ids)
        if T > self.CHUNK:
            return torch.cat([self.forward(new_ids[i:i + self.CHUNK]) for i in range(0, T, self.CHUNK)])
        ids = self._check(new_ids)
        out = np.empty((T, self._out_cols), np.float32)
        nt = self.threads if T <= self.SHORT else max(self.threads, torch.get_num_threads())
        if self.lib.nstep_forward(self._model, self.k.data_ptr(), self.v.data_ptr(), self._kv16, self.max_len,
                                  self._rot.data_ptr(), ids.ctypes.data, T, p, out.ctypes.data, nt):
            raise RuntimeError("the native step refused a forward")
        self.ids.extend(new_ids)
        return torch.from_numpy(out)

