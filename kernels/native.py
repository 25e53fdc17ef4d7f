"""The native decode step (native/step.cpp): built on this machine at first use, loaded by ctypes.

Why compiled here and not shipped: the kernels use the widest vector extensions the CPU reports
(AVX-512 + VNNI, or AVX2 + FMA + F16C), and one machine's binary can fault on the next (these VMs
alternate AMD AVX2-only, AMD AVX-512 and Intel AVX-512 with AMX). So the flags come from
/proc/cpuinfo at run time (never -march=native) and each set gets its own library in the cache,
keyed by the source, the flags and the compiler. Where the CPU reports AMX (amx_tile, amx_int8)
the AVX-512 VNNI build gets -DNSTEP_AMX ("avx512vnni+amx"): int8 products of 7+ rows (a verify
of 6+ drafts, prefill) on AMX tiles, once `load` has asked the kernel for the tile state
(nstep_amx_init: without that permission the first tile instruction faults, as it did for a
llama.cpp built -march=native here); refused, `load` says why and the caller takes the build
without AMX. With amx_bf16 too it gets -DNSTEP_AMX_BF16: fp16 weights whose values are bf16
(Packed.with_bf16_pairs) are multiplied on AMX-BF16 tiles. One translation unit, no torch or Python headers: ~1.5 s of g++ once per machine and
feature set. Without a compiler or AVX2 `load()` returns None and the reason, and callers keep
the NumPy step.

`pack(w, kind)` lays a weight out as the kernels read it (see step.cpp's header): blocks of BW
output columns, f32/f16 as [N/BW][K][BW], int8 as [N/BW][K/4][BW][4] with per-channel scales
and column sums for fbgemm's zero-point correction.
"""
from __future__ import annotations

import copy
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("native") / "step.cpp"
_lock = threading.Lock()
_loaded: dict[tuple, tuple[ctypes.CDLL | None, str]] = {}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (read once: every runner's construction asks)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


AMX = frozenset({"amx_tile", "amx_int8"})  # what /proc/cpuinfo reports for AMX's int8 tiles


def isa_flags(flags: set[str]) -> tuple[str, list[str]] | None:
    """(name, compiler flags) for the widest supported set, None below AVX2 + FMA + F16C. AMX
    only beside AVX-512 VNNI, and only as -DNSTEP_AMX: its functions carry their own target
    attribute, so nothing else in the library can use a tile instruction."""
    if not {"avx2", "fma", "f16c"} <= flags:
        return None
    base = ["-mavx2", "-mfma", "-mf16c"]
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        if "avx512_vnni" in flags:
            vnni = base + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"]
            if AMX <= flags:  # with amx_bf16 too, fp16 products of several rows on its tiles
                return "avx512vnni+amx", vnni + ["-DNSTEP_AMX"] + ["-DNSTEP_AMX_BF16"] * ("amx_bf16" in flags)
            return "avx512vnni", vnni
        return "avx512", base + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
    return "avx2", base


class Mat(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("N", ctypes.c_int32), ("K", ctypes.c_int32), ("Kp", ctypes.c_int32),
                ("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("colsum", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("gs", ctypes.c_void_p), ("gsz", ctypes.c_void_p),
                ("szsum", ctypes.c_void_p), ("G", ctypes.c_int32), ("wbf", ctypes.c_void_p)]


class Layer(ctypes.Structure):
    _fields_ = [("w_in", ctypes.c_void_p), ("w_post", ctypes.c_void_p), ("q_norm", ctypes.c_void_p),
                ("k_norm", ctypes.c_void_p), ("qkv", Mat), ("o", Mat), ("gu", Mat), ("down", Mat)]


class Model(ctypes.Structure):
    _fields_ = [("D", ctypes.c_int32), ("H", ctypes.c_int32), ("Hkv", ctypes.c_int32), ("hd", ctypes.c_int32),
                ("I", ctypes.c_int32), ("L", ctypes.c_int32), ("V", ctypes.c_int32), ("window", ctypes.c_int32),
                ("embed_kind", ctypes.c_int32), ("eps", ctypes.c_float), ("embed", ctypes.c_void_p),
                ("norm", ctypes.c_void_p), ("layers", ctypes.POINTER(Layer)), ("head", Mat)]


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build(cache: Path, cxx: str, name: str, flags: list[str]) -> Path:
    src = SOURCE.read_bytes()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(src + " ".join(flags).encode() + version.encode()).hexdigest()[:16]
    out = cache / f"step-{name}-{key}.so"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cxx, "-O3", "-shared", "-fPIC", "-fopenmp", *flags, str(SOURCE), "-o", str(tmp)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{cxx} failed: {r.stderr.strip()[-300:]}")
    tmp.replace(out)  # atomic: a concurrent process loads either nothing or the whole library
    for old in cache.glob(f"step-{name}-*.so"):  # earlier sources' builds (a process that has one
        if old != out:                           # loaded keeps its mapping)
            old.unlink(missing_ok=True)
    return out


def load(cache: Path, flags: set[str] | None = None) -> tuple[ctypes.CDLL | None, str]:
    """(the library, its ISA name) or (None, why not); built into `cache` on first use. `flags`:
    CPU flags to build for instead of this CPU's (tests build the AVX2 variant on AVX-512, and
    the one without AMX on an AMX machine). The AMX build is returned only with AMX granted."""
    key = (cache, None if flags is None else frozenset(flags))
    with _lock:
        if key not in _loaded:
            _loaded[key] = _load(cache, cpu_flags() if flags is None else flags)
        return _loaded[key]


def _load(cache: Path, flags: set[str]) -> tuple[ctypes.CDLL | None, str]:
    isa = isa_flags(flags)
    if isa is None:
        return None, "this CPU reports no AVX2/FMA/F16C (or no /proc/cpuinfo)"
    cxx = _compiler()
    if cxx is None:
        return None, "no C++ compiler (install g++)"
    import torch  # noqa: F401  (its libgomp first: the library then shares torch's OpenMP runtime)

    try:
        lib = ctypes.CDLL(str(_build(cache, cxx, *isa)))
    except (OSError, RuntimeError) as e:
        return None, f"building the native step failed: {e}"
    # (model, kc, vc, kv16, P, rot, ids, T, p, ...): kv16 says the cache holds fp16
    lib.nstep_forward.argtypes = [ctypes.POINTER(Model), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_int]
    lib.nstep_greedy.argtypes = [*lib.nstep_forward.argtypes[:9], ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_int]
    lib.nstep_matmul.argtypes = [ctypes.POINTER(Mat), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.nstep_attend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int] * 8,
                                 ctypes.c_void_p]
    if "-DNSTEP_AMX" in isa[1]:
        err = lib.nstep_amx_init()  # arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): 0 or an errno
        if err:
            why = os.strerror(err) if err > 0 else "granted but not reported"
            return None, f"the kernel refused AMX's tile state (arch_prctl: {why})"
    return lib, isa[0]


def ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


class Packed:
    """One weight in the kernels' layout, with the arrays its `Mat` points into (kept alive here)."""

    def __init__(self, kind: str, bw: int, w: np.ndarray | None = None, bias: np.ndarray | None = None, *,
                 q: np.ndarray | None = None, scale: np.ndarray | None = None, zero: np.ndarray | None = None):
        """kind f32 / f16: `w` [N, K] float; int8: `q` [N, K] int8 and `scale` [N]; int4: `q` [N, K]
        in 0..15 with `scale` and real-valued `zero` [N, K/G] (w = (q - zero)·scale per group)."""
        N, K = (w if q is None else q).shape
        Np = -(-N // bw) * bw
        self.kind, self.bw = kind, bw
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.scale = self.colsum = self.gs = self.gsz = self.szsum = None
        G = 0
        if kind == "int4":
            G = K // scale.shape[1]
            nb, ng = Np // bw, K // G
            qp = np.zeros((Np, K), np.uint8)
            qp[:N] = q
            sp, zp = np.zeros((Np, ng), np.float32), np.zeros((Np, ng), np.float32)
            sp[:N], zp[:N] = scale, zero
            a = qp.reshape(nb, bw, ng, G // 8, 2, 4).transpose(0, 2, 3, 1, 5, 4)  # (block, group, j, col, i, half)
            self.w = np.ascontiguousarray(a[..., 0] | (a[..., 1] << 4))
            self.gs = np.ascontiguousarray(sp.reshape(nb, bw, ng).transpose(0, 2, 1))
            self.gsz = np.ascontiguousarray((sp * zp).reshape(nb, bw, ng).transpose(0, 2, 1))
            qsum = qp.reshape(Np, ng, G).sum(-1, dtype=np.int64).astype(np.float32)
            self.scale = np.ascontiguousarray((sp * qsum).sum(1, dtype=np.float32))  # Σ_g s·Σq
            self.szsum = np.ascontiguousarray((sp * zp).sum(1, dtype=np.float32))
            Kp, code = K, 3
        elif kind == "int8":
            Kp = -(-K // 4) * 4
            qp = np.zeros((Np, Kp), np.int8)
            qp[:N, :K] = q
            self.w = np.ascontiguousarray(qp.reshape(Np // bw, bw, Kp // 4, 4).transpose(0, 2, 1, 3))
            self.scale = np.zeros(Np, np.float32)
            self.scale[:N] = scale
            self.colsum = qp.sum(1, dtype=np.int32)
            code = 2
        else:
            Kp = K
            dt = np.float16 if kind == "f16" else np.float32
            wp = np.zeros((Np, K), dt)
            wp[:N] = w
            self.w = np.ascontiguousarray(wp.reshape(Np // bw, bw, K).transpose(0, 2, 1))
            code = 1 if kind == "f16" else 0
        self.mat = Mat(code, N, K, Kp, ptr(self.w), ptr(self.scale), ptr(self.colsum), ptr(self.bias), ptr(self.gs),
                       ptr(self.gsz), ptr(self.szsum), G)

    def with_bf16_pairs(self) -> Packed | None:
        """An f16 weight that also carries the layout AMX-BF16 products read (step.cpp's rows_h_amx:
        per block [Kb/2][BW][2] bf16, Kb = K rounded up to 32; 2 more bytes a weight), or None when
        some value is not exactly a bf16 (a checkpoint saved in fp16: those keep the register path).
        An fp16 pack of a bf16 checkpoint always is: the conversion only drops bits."""
        assert self.kind == "f16"
        nb, K, bw = self.w.shape[0], self.mat.K, self.bw
        kb = -(-K // 32) * 32
        w = np.zeros((nb, kb, bw), np.float32)
        w[:, :K] = self.w  # [block][K][col], widened exactly
        bits = w.view(np.uint32)
        if (bits & 0xFFFF).any():
            return None
        new = copy.copy(self)
        new.wbf = np.ascontiguousarray((bits >> 16).astype(np.uint16).reshape(nb, kb // 2, 2, bw).transpose(0, 1, 3, 2))
        new.mat = Mat.from_buffer_copy(self.mat)
        new.mat.wbf = ptr(new.wbf)
        return new

    def dense(self) -> dict:
        """The weight as `Packed` took it: {w} or {q, scale} (to repack for another block width)."""
        N, K, nb = self.mat.N, self.mat.K, self.w.shape[0]
        if self.kind == "int4":
            ng, half = self.gs.shape[1], np.stack([self.w & 15, self.w >> 4], -1)  # (block, group, j, col, i, half)
            s = self.gs.transpose(0, 2, 1).reshape(nb * self.bw, ng)[:N]
            z = self.gsz.transpose(0, 2, 1).reshape(nb * self.bw, ng)[:N] / np.where(s == 0, 1, s)
            return {"q": half.transpose(0, 3, 1, 2, 5, 4).reshape(nb * self.bw, K)[:N], "scale": s, "zero": z}
        if self.kind == "int8":
            q = self.w.transpose(0, 2, 1, 3).reshape(nb * self.bw, -1)[:N, :K]
            return {"q": q, "scale": self.scale[:N]}
        return {"w": self.w.transpose(0, 2, 1).reshape(nb * self.bw, K)[:N]}

    def with_bias(self, bias: np.ndarray | None) -> Packed:
        """The same weight (arrays shared) with a bias added by the product's epilogue."""
        if bias is None:
            return self
        new = copy.copy(self)
        new.bias = np.ascontiguousarray(bias, dtype=np.float32)
        new.mat = Mat.from_buffer_copy(self.mat)
        new.mat.bias = ptr(new.bias)
        return new

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.w, self.scale, self.colsum, getattr(self, "wbf", None)) if a is not None)

