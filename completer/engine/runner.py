"""Batch-1 model runners over a KV cache indexed by position.

A runner holds the token ids its cache covers (`ids`); `sync(seq)` keeps the longest common
prefix with `seq` and returns the ids still to be fed; `forward(new_ids)` appends them and returns
their logits; `truncate(n)` rolls back by moving the length pointer (rejected draft tokens cost
nothing to undo). `Runner` declares what every runner (and every wrapper: batch.Via) offers,
the optional abilities included, so callers never probe with hasattr. Two implementations here:

- `LlamaRunner`: a lean forward for the families of families.py (Llama, Mistral, Qwen2/3,
  StarCoder2, Gemma) over preallocated K/V tensors written by position; no `generate()` or
  per-layer module dispatch in the hot path.
- `HFRunner`: any HF causal LM through a `DynamicCache` (`crop` to roll back).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from .families import Unsupported, layout_of, max_positions


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (appending) compares in C
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@runtime_checkable
class Runner(Protocol):
    """A batch-1 model over a KV cache indexed by position: what the speculative loop, the
    drafters, warmup and calibration use. Every runner and every wrapper implements all of it;
    an ability a runner lacks is a declared None, never a missing attribute."""
    ids: list[int]              # the tokens the cache covers
    max_len: int                # positions the cache holds
    vocab_size: int
    head_rows: list[int] | None  # logits are over these ids, in this order (restrict_head); None: all
    # `greedy(new_ids, k)`: append `new_ids` and pick k tokens greedily in one call (the native
    # step's draft proposal); None where the runner has no such call
    greedy: Callable[[list[int], int], list[int]] | None

    @property
    def max_draft(self) -> int | None:
        """Draft tokens the next verify may carry (a batched step's share under load); None: no cap."""
        ...

    def sync(self, seq: list[int]) -> list[int]: ...
    def truncate(self, n: int) -> None: ...
    def forward(self, new_ids: list[int]) -> torch.Tensor: ...  # [T, V] or [T, len(head_rows)], at least float32
    def kv_bytes(self) -> int: ...
    def reserved_bytes(self) -> int: ...


class RunnerBase:
    """The shared part of the runners: `sync` over `truncate`, the declared defaults."""
    ids: list[int]
    max_len: int
    vocab_size: int
    head_rows: list[int] | None = None
    greedy: Callable[[list[int], int], list[int]] | None = None
    max_draft: int | None = None  # a lone runner has no cap (batch.Via has one under load)

    def sync(self, seq: list[int]) -> list[int]:
        """Keep the cached prefix shared with `seq`; return the ids of `seq` still to feed."""
        n = common_prefix_len(self.ids, seq)
        if n == len(seq) and n > 0:
            n -= 1  # something must be fed to get logits for the last position
        self.truncate(n)
        return seq[n:]

    def truncate(self, n: int) -> None:
        raise NotImplementedError

    def kv_bytes(self) -> int:
        """Bytes of K/V the cache holds for live tokens."""
        raise NotImplementedError

    def reserved_bytes(self) -> int:
        """Bytes of K/V memory the runner holds (preallocated or grown)."""
        return self.kv_bytes()


def _rope_table(inv_freq: torch.Tensor, max_len: int, scale: float = 1.0) -> torch.Tensor:
    """Rotations scale·e^{i·pos·θ_j} as complex64 [P, hd/2] (RoPE as one complex multiply;
    `scale` is YaRN's attention factor, which HF multiplies into cos and sin)."""
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq.float())
    if scale == 1.0:
        return torch.complex(freqs.cos(), freqs.sin())  # as HF rounds them (polar differs by an ulp)
    return torch.complex(freqs.cos() * scale, freqs.sin() * scale)


def _f32(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (float64 models stay float64: exactness tests must not see ties)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _pairs_adjacent(w: torch.Tensor, heads: int, hd: int) -> torch.Tensor:
    """Reorder a q/k projection's output rows (or its bias, or a per-head norm weight) per head
    from HF's half-split RoPE layout (i, i+hd/2) to adjacent pairs (2i, 2i+1). Scores q·k are
    unchanged (both sides move the same way) and RoPE becomes a complex multiply: one op
    instead of eight."""
    return w.reshape(heads, 2, hd // 2, -1).transpose(1, 2).reshape(w.shape)


def _linear(x: torch.Tensor, w, add: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ add: a residual [S, N] or a bias [N]). Dense weights keep w.T contiguous (see
    LlamaWeights), so this is one BLAS call fused with the add; quantized weights go through
    their own matmul and the add follows in float32 (biases are never quantized)."""
    wt = w.T
    if isinstance(wt, torch.Tensor):
        return x @ wt if add is None else torch.addmm(add, x, wt)
    return x @ wt if add is None else add + x @ wt


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF Llama computes it: normalised in float32, scaled in the model's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)  # one fused op on the hot path
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * w


def _norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm, or LayerNorm when the layout has norm biases (StarCoder2)."""
    return _rms(x, w, eps) if b is None else F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _t_contiguous(w):
    """The same [out, in] weight stored so that w.T is contiguous: ~30 % faster batch-1 GEMV."""
    return w.t().contiguous().t() if isinstance(w, torch.Tensor) else w


def lean_config_ok(cfg: dict) -> bool:
    """Whether a config (as a dict) is in the lean runner's family table (families.py)."""
    try:
        layout_of(cfg)
    except Unsupported:
        return False
    return True


def lean_supported(model) -> bool:
    if isinstance(model, LlamaWeights):
        return True
    return lean_config_ok(model.config.to_dict()) and all(
        type(m).__name__ == "Linear" for m in model.modules() if "Linear" in type(m).__name__)


class LayerExtra(NamedTuple):
    """A layer's tensors beyond Llama's six (None where its layout has none). Biases stay in
    the compute dtype whatever the matrices' quantization; q/k norms are in the adjacent-pair
    row order (see _pairs_adjacent)."""
    in_b: torch.Tensor | None = None    # LayerNorm biases (StarCoder2)
    post_b: torch.Tensor | None = None
    qkv_b: torch.Tensor | None = None   # [(H+2Hkv)·hd]
    o_b: torch.Tensor | None = None     # [D]
    gu_b: torch.Tensor | None = None    # [2I] (gated) or [I]
    down_b: torch.Tensor | None = None  # [D]
    q_norm: torch.Tensor | None = None  # [hd] (Qwen3)
    k_norm: torch.Tensor | None = None  # [hd]


class LlamaWeights:
    """One fused copy of a model's weights, shared by every document's runner, for every family of
    the layout table (families.py; `.layout`). `.layers` holds Llama's six tensors per layer,
    (in-norm, wqkv, wo, post-norm, wgu, wdown) — wgu is the gate and up projections stacked, or
    the up projection alone for a plain MLP (`layout.act == "gelu_mlp"`) — and `.extra` the rest
    (`LayerExtra`: biases, q/k norms). Gemma's x·(1+w) norms are stored as 1+w.

    `from_dir` reads config.json + safetensors directly — no transformers import, which is most of
    a cold start on CPU (importing the HF Llama module alone takes seconds)."""

    def __init__(self, cfg: dict, get):  # get(name) → tensor
        self.layout = lay = layout_of(cfg)
        nm = lay.names
        self.config = SimpleNamespace(**cfg)
        self.config.max_position_embeddings = max_positions(cfg)
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.hd = lay.head_dim
        self.eps = lay.norm_eps
        self.inv_freq, self.rope_scale = lay.rope.inv_freq(self.hd, self.config.max_position_embeddings)
        self.embed = get(nm.embed)
        self.lm_head = self.embed if lay.tied_embeddings else get(nm.head)

        def norm_w(name: str) -> torch.Tensor:
            w = get(name + ".weight")
            return 1.0 + w.float() if lay.norm == "rms_1p" else w  # HF Gemma: float32 (1 + w)

        def norm_b(name: str) -> torch.Tensor | None:
            return get(name + ".bias") if lay.norm == "layer" else None

        self.norm, self.norm_b = norm_w(nm.norm), norm_b(nm.norm)
        H, Hkv, hd = self.n_heads, self.n_kv, self.hd
        self.layers, self.extra = [], []
        for i in range(cfg["num_hidden_layers"]):
            def g(n: str, part: str = "weight", i: int = i) -> torch.Tensor:
                return get(f"model.layers.{i}.{n}.{part}")

            def b(n: str, on: bool) -> torch.Tensor | None:
                return g(n, "bias") if on else None

            wqkv = torch.cat([_pairs_adjacent(g(nm.q), H, hd), _pairs_adjacent(g(nm.k), Hkv, hd), g(nm.v)])
            bqkv = (torch.cat([_pairs_adjacent(g(nm.q, "bias"), H, hd), _pairs_adjacent(g(nm.k, "bias"), Hkv, hd),
                               g(nm.v, "bias")]) if lay.qkv_bias else None)
            gated = nm.gate is not None
            wgu = torch.cat([g(nm.gate), g(nm.up)]) if gated else g(nm.up)  # [2I, D] or [I, D]
            bgu = (torch.cat([g(nm.gate, "bias"), g(nm.up, "bias")]) if gated else g(nm.up, "bias")) \
                if lay.mlp_bias else None
            self.layers.append((norm_w(f"model.layers.{i}.{nm.in_norm}"), _t_contiguous(wqkv), _t_contiguous(g(nm.o)),
                                norm_w(f"model.layers.{i}.{nm.post_norm}"), _t_contiguous(wgu),
                                _t_contiguous(g(nm.down))))
            self.extra.append(LayerExtra(
                norm_b(f"model.layers.{i}.{nm.in_norm}"), norm_b(f"model.layers.{i}.{nm.post_norm}"),
                bqkv, b(nm.o, lay.o_bias), bgu, b(nm.down, lay.mlp_bias),
                _pairs_adjacent(g(nm.q_norm), 1, hd) if lay.qk_norm else None,
                _pairs_adjacent(g(nm.k_norm), 1, hd) if lay.qk_norm else None))
        self.dtype, self.device = self.embed.dtype, self.embed.device  # compute dtype (set before quantizing)
        if lay.norm == "rms_1p":  # back to the model's dtype after the float32 (1 + w)
            self.norm = self.norm.to(self.dtype)
            self.layers = [(a.to(self.dtype), q, o, p.to(self.dtype), gu, d) for a, q, o, p, gu, d in self.layers]
        self.head_rows: list[int] | None = None  # see restrict_head
        # forms of these weights that a runner kind computes once and its runners share (the NumPy
        # step's arrays, the native step's packs, a CUDA graph pool): derive(); restrict_head clears them
        self.derived: dict[object, object] = {}

    @classmethod
    def from_hf(cls, model) -> LlamaWeights:
        sd = dict(model.named_parameters())
        return cls(model.config.to_dict(), lambda n: sd[n].detach())

    @classmethod
    def from_dir(cls, path: str | Path, dtype: torch.dtype, device: torch.device) -> LlamaWeights:
        from safetensors.torch import load_file

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        sd: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("*.safetensors")):
            sd.update(load_file(str(f)))
        w = cls(cfg, lambda n: sd[n].to(device=device, dtype=dtype))
        w.source_dtype = sd[w.layout.names.embed].dtype  # the checkpoint's precision
        return w

    def restrict_head(self, rows: list[int]) -> None:
        """Score only these token ids (a draft's LM head over its most frequent tokens): the
        head is most of a small draft's step (its rows are read for every token), and a
        proposal outside the frequent set would rarely be accepted anyway. Logits come back
        over `rows` in this order; runners expose them as `head_rows`."""
        self.head_rows = [int(r) for r in rows]
        head = self.lm_head if isinstance(self.lm_head, torch.Tensor) else None
        if head is None:
            raise ValueError("restrict_head needs a dense LM head")
        self.lm_head = _t_contiguous(head[torch.tensor(self.head_rows, device=head.device)])
        self.derived.clear()  # the runners' forms hold the old head

    def derive(self, kind: object, build: Callable[[], object]) -> object:
        """The form `kind` of these weights, built once by `build` and shared by every runner."""
        if kind not in self.derived:
            self.derived[kind] = build()
        return self.derived[kind]

    def get_input_embeddings(self):  # the HF accessor, for code that sizes caches by dtype
        return SimpleNamespace(weight=self.embed)

    def parameters(self):
        """The float tensors (quantized weights are not parameters)."""
        seen = {}
        for t in [self.embed, self.lm_head, self.norm, self.norm_b] + [
                w for layer, e in zip(self.layers, self.extra) for w in (*layer, *e)]:
            if isinstance(t, torch.Tensor):
                seen[id(t)] = t
        return iter(seen.values())


class LlamaRunner(RunnerBase):
    """Lean batch-1 forward of a model of the layout table over its own K/V; weights are shared."""

    def __init__(self, weights: LlamaWeights, max_len: int | None = None, kv_dtype: torch.dtype | None = None):
        w = weights
        self.weights = w
        self.max_len = max_len or w.config.max_position_embeddings
        if w.layout.rope.kind == "dynamic" and self.max_len > w.config.max_position_embeddings:
            raise ValueError(f"dynamic NTK RoPE rescales past {w.config.max_position_embeddings} tokens (HF "
                             f"recomputes every position then); a {self.max_len}-token cache is not supported")
        self.n_heads, self.n_kv, self.hd, self.eps = w.n_heads, w.n_kv, w.hd, w.eps
        self.dtype, self.device = w.dtype, w.device
        self.embed, self.lm_head, self.norm, self.layers = w.embed, w.lm_head, w.norm, w.layers
        self.layout, self.extra, self.norm_b = w.layout, w.extra, w.norm_b
        self.rot = _rope_table(w.inv_freq, self.max_len, w.rope_scale).to(self.device)  # [P, hd/2] complex
        L = len(self.layers)
        self.k = torch.zeros(L, 1, self.n_kv, self.max_len, self.hd, dtype=kv_dtype or self.dtype, device=self.device)
        self.v = torch.zeros_like(self.k)  # [L, 1, Hkv, P, hd]
        self.ids: list[int] = []
        self.head_rows = w.head_rows  # logits are over these ids when set (see restrict_head)
        self.vocab_size = self.embed.shape[0]

    def truncate(self, n: int) -> None:
        del self.ids[n:]  # the K/V rows past n are dead: overwritten by the next forward

    def kv_bytes(self) -> int:
        return 2 * self.k.element_size() * self.k[..., : len(self.ids), :].numel()

    def reserved_bytes(self) -> int:
        return 2 * self.k.element_size() * self.k.numel()

    def forward(self, new_ids: list[int]) -> torch.Tensor:
        """Append `new_ids` at the cache's end; return their logits [T, V] (float32)."""
        return forward_many([self], [new_ids])[0]


def _attn_span(p: int, t: int, window: int | None, dev) -> tuple[int, torch.Tensor | None]:
    """Keys [lo, p+t) that t queries at positions p.. may see, and their mask [t, p+t-lo]
    (None: all of them). With a sliding window W, position q sees keys in (q-W, q]: the cache
    keeps every position (rollback stays a pointer move) and attention skips the older ones."""
    lo = 0 if window is None else max(0, p + 1 - window)
    if t == 1:
        return lo, None
    q = torch.arange(p, p + t, device=dev)[:, None]
    k = torch.arange(lo, p + t, device=dev)[None]
    m = k <= q
    return lo, m if window is None else m & (k > q - window)


_ACT = {"silu_gated": F.silu, "gelu_tanh_gated": partial(F.gelu, approximate="tanh")}


@torch.inference_mode()
def forward_many(runners: list[LlamaRunner], feeds: list[list[int]]) -> list[torch.Tensor]:
    """Append feeds[i] to runners[i] (all sharing one model's weights); return each one's logits
    [T_i, V] (at least float32). The linear layers run once over all new tokens [ΣT, D] (one
    weight read per step, however many requests); RoPE, the K/V write and attention run per
    sequence over its own cache. Batch-1 decoding is the one-runner case. The layout
    (families.py) picks norms, biases, q/k norm, MLP and window; a plain Llama skips them all."""
    r0 = runners[0]
    H, Hkv, hd, eps, lay = r0.n_heads, r0.n_kv, r0.hd, r0.eps, r0.layout
    T = [len(f) for f in feeds]
    P = [len(r.ids) for r in runners]
    for p, t, r in zip(P, T, runners):
        if p + t > r.max_len:
            raise ValueError(f"context of {p + t} tokens exceeds the model's {r.max_len}")
    offs = [0]
    for t in T:
        offs.append(offs[-1] + t)
    S, dev, dt = offs[-1], r0.device, r0.dtype
    x = r0.embed[torch.tensor([i for f in feeds for i in f], device=dev)].to(dt)  # [ΣT, D]
    if lay.embed_scale is not None:
        x = x * lay.embed_scale  # Gemma
    if len(runners) == 1:
        rot = r0.rot[P[0]:P[0] + S]
    else:
        rot = r0.rot[torch.cat([torch.arange(p, p + t) for p, t in zip(P, T)]).to(dev)]
    rot = rot.view(S, 1, hd // 2)
    spans = [_attn_span(p, t, lay.sliding_window, dev) for p, t in zip(P, T)]
    cplx = dt in (torch.float32, torch.float64)  # no complex bf16: rotate in fp32 then
    act = _ACT.get(lay.act)
    for li, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(r0.layers):
        e = r0.extra[li]
        qkv = _linear(_norm(x, w_in, e.in_b, eps), wqkv, e.qkv_b)  # [ΣT, (H+2Hkv)·hd]
        qk = qkv[:, :(H + Hkv) * hd].reshape(S, H + Hkv, hd)
        if e.q_norm is not None:
            qk = torch.cat([_rms(qk[:, :H], e.q_norm, eps), _rms(qk[:, H:], e.k_norm, eps)], dim=1)
        qk = qk.view(S, H + Hkv, hd // 2, 2)
        qk = torch.view_as_complex(qk if cplx else qk.float()) * rot
        qk = torch.view_as_real(qk).view(S, H + Hkv, hd).to(dt).transpose(0, 1)  # [H+Hkv, ΣT, hd]
        v = qkv[:, (H + Hkv) * hd:].view(S, Hkv, hd).transpose(0, 1)
        outs = []
        for i, r in enumerate(runners):  # attention: each sequence over its own cache
            a, b, p, t = offs[i], offs[i + 1], P[i], T[i]
            lo, mask = spans[i]
            r.k[li, 0, :, p:p + t] = qk[H:, a:b]
            r.v[li, 0, :, p:p + t] = v[:, a:b]
            ks, vs = r.k[li, :, :, lo:p + t], r.v[li, :, :, lo:p + t]
            if ks.dtype != dt:  # an fp16 cache (the native step's), widened for the product
                ks, vs = ks.to(dt), vs.to(dt)
            outs.append(F.scaled_dot_product_attention(  # 4-D: the fused CPU kernel
                qk[None, :H, a:b], ks, vs, attn_mask=mask, enable_gqa=Hkv != H)[0])  # [H, T_i, hd]
        o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [H, ΣT, hd]
        x = _linear(o.transpose(0, 1).reshape(S, H * hd), wo, x if e.o_b is None else x + e.o_b)
        h = _linear(_norm(x, w_post, e.post_b, eps), wgu, e.gu_b)  # [ΣT, 2I] gated, else [ΣT, I]
        if act is None:  # plain MLP (StarCoder2)
            h = F.gelu(h, approximate="tanh")
        else:
            g, u = h.chunk(2, dim=-1)  # [ΣT, I] each
            h = act(g).mul_(u)
        x = _linear(h, wdown, x if e.down_b is None else x + e.down_b)
    for r, f in zip(runners, feeds):
        r.ids.extend(f)
    logits = _f32(_linear(_norm(x, r0.norm, r0.norm_b, eps), r0.lm_head))  # [ΣT, V]
    return [logits[offs[i]:offs[i + 1]] for i in range(len(runners))]


class HFRunner(RunnerBase):
    """Any HF causal LM (quantized ones included) through a DynamicCache.

    The cache is built without the config, so every layer keeps all its positions: a
    config-built cache gives sliding-window layers (Mistral, StarCoder2) a ring of the last W
    tokens that cannot be cropped. The model still masks by its window."""

    def __init__(self, model, max_len: int | None = None):
        from transformers import DynamicCache

        self.model = model
        self.max_len = max_len or getattr(model.config, "max_position_embeddings", 2048)
        self.cache = DynamicCache()
        self.ids: list[int] = []
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    def truncate(self, n: int) -> None:
        if n < len(self.ids):
            if n == 0:
                from transformers import DynamicCache
                self.cache = DynamicCache()
            else:
                self.cache.crop(n - len(self.ids))  # 5.x: a negative count of tokens to drop
            del self.ids[n:]

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.cache.layers
                   for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                   if t is not None)

    @torch.inference_mode()
    def forward(self, new_ids: list[int]) -> torch.Tensor:
        p, T = len(self.ids), len(new_ids)
        if p + T > self.max_len:
            raise ValueError(f"context of {p + T} tokens exceeds the model's {self.max_len}")
        x = torch.tensor([new_ids], device=self.device)
        out = self.model(input_ids=x, cache=self.cache, use_cache=True,
                         position_ids=torch.arange(p, p + T, device=self.device)[None])
        self.ids.extend(new_ids)
        return _f32(out.logits[0])  # [T, V]
