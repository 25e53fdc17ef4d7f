"""Which runner serves a model: the one place that knows every implementation (runner.py's lean
and HF runners, native_runner.py's native step, np_runner.py's NumPy step, cuda_graphs.py's graph
replay), so they import runner.py and never each other."""
from __future__ import annotations

import weakref

import torch

from .cuda_graphs import GraphRunner
from .native_lib import native_or_none
from .native_runner import NativeRunner
from .np_runner import NumpyRunner, eligible
from .runner import HFRunner, LlamaRunner, LlamaWeights, Runner, lean_supported

KV_DTYPES = {"f16": torch.float16, "f32": torch.float32}
# an HF model's lean weights, fused once and shared by every runner of that model
_LEAN: weakref.WeakKeyDictionary[torch.nn.Module, LlamaWeights] = weakref.WeakKeyDictionary()


def _lean_weights(model, lean: bool) -> LlamaWeights | None:
    """`model` as the lean runners' weights (an HF model's fused once, shared by every
    document's runners), or None: HF's own forward serves it."""
    if isinstance(model, LlamaWeights):
        return model
    if not (lean and lean_supported(model)):
        return None
    w = _LEAN.get(model)
    if w is None:
        w = _LEAN[model] = LlamaWeights.from_hf(model)
    return w


def _native_lib(w: LlamaWeights, lean: bool):
    return native_or_none() if lean and w.device.type == "cpu" and eligible(w, native=True) else None


def _native_kv(w: LlamaWeights, kv_cache: str) -> torch.dtype:
    return KV_DTYPES[kv_cache] if w.hd % 2 == 0 else torch.float32  # fp16 rows load by pairs


def kv_dtype(model, lean: bool = True, kv_cache: str = "f16") -> torch.dtype | None:
    """The dtype of the K/V cache make_runner gives `model`: `kv_cache` on the native step (float32
    for an odd head width), else None (the model's compute dtype)."""
    w = _lean_weights(model, lean)
    return None if w is None or _native_lib(w, lean) is None else _native_kv(w, kv_cache)


def make_runner(model, max_len: int | None = None, lean: bool = True, threads: int = 1,
                kv_cache: str = "f16") -> Runner:
    """A runner for `model`: LlamaWeights → lean; an HF model → lean when its config is in the
    family table (families.py) and its linears are plain, else HF.
    On the CPU, a plain Llama layer with float32 / fp16 / int8 weights (target or draft) decodes
    through native_runner.py's one-call step on `threads` threads (EngineConfig.decode_threads),
    its K/V cache in `kv_cache` (EngineConfig.kv_cache: f16 | f32), or np_runner.py's NumPy step
    where the native library is unavailable (logged once, with why)."""
    w = _lean_weights(model, lean)
    if w is None:
        return HFRunner(model, max_len)
    if w.device.type == "cuda":  # static shapes replayed as CUDA graphs (cuda_graphs.py)
        return GraphRunner(w, max_len)
    lib = _native_lib(w, lean)
    if lib is not None:
        return NativeRunner(w, lib, max_len, threads, _native_kv(w, kv_cache))
    if lean and eligible(w):
        return NumpyRunner(w, max_len, threads)
    return LlamaRunner(w, max_len)
