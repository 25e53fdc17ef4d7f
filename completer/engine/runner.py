"""Batch-1 model runners over a KV cache indexed by position.

A runner holds the token ids its cache covers (`ids`); `sync(seq)` keeps the longest common
prefix with `seq` and returns the ids still to be fed; `forward(new_ids)` appends them and returns
their logits; `truncate(n)` rolls back by moving the length pointer (rejected draft tokens cost
nothing to undo). Two implementations:

- `LlamaRunner`: a lean forward for Llama-family checkpoints over preallocated K/V tensors written
  by position; no `generate()` or per-layer module dispatch in the hot path.
- `HFRunner`: any HF causal LM through its own `DynamicCache` (`crop` to roll back).
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F


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


class _Runner:
    ids: list[int]
    max_len: int

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


def _rope_tables(inv_freq: torch.Tensor, max_len: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(max_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())  # [P, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [P, hd]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _f32(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (float64 models stay float64: exactness tests must not see ties)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


_LEAN_TYPES = ("llama", "mistral")


def lean_config_ok(cfg: dict) -> bool:
    """Whether a config (as a dict) is plain Llama: default RoPE, no biases, full attention."""
    rope = cfg.get("rope_parameters") or {"rope_type": "default" if not cfg.get("rope_scaling") else "scaled"}
    return (cfg.get("model_type") in _LEAN_TYPES and rope.get("rope_type", "default") == "default"
            and not cfg.get("attention_bias") and not cfg.get("mlp_bias")
            and not cfg.get("sliding_window") and cfg.get("hidden_act", "silu") == "silu")


def lean_supported(model) -> bool:
    if isinstance(model, LlamaWeights):
        return True
    return lean_config_ok(model.config.to_dict()) and all(
        type(m).__name__ == "Linear" for m in model.modules() if "Linear" in type(m).__name__)


class LlamaWeights:
    """One fused copy of a Llama-family model's weights, shared by every runner (slot).

    `from_dir` reads config.json + safetensors directly — no transformers import, which is most of
    a cold start on CPU (importing the HF Llama module alone takes seconds)."""

    def __init__(self, cfg: dict, get):  # get(name) → tensor
        self.config = SimpleNamespace(**cfg)
        self.config.max_position_embeddings = cfg.get("max_position_embeddings", 2048)
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.n_heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.embed = get("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.get("tie_word_embeddings", False) else get("lm_head.weight")
        self.norm = get("model.norm.weight")
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            def g(n: str, i: int = i) -> torch.Tensor:
                return get(f"model.layers.{i}.{n}.weight")
            wqkv = torch.cat([g("self_attn.q_proj"), g("self_attn.k_proj"), g("self_attn.v_proj")])
            wgu = torch.cat([g("mlp.gate_proj"), g("mlp.up_proj")])  # [2I, D]
            self.layers.append((g("input_layernorm"), wqkv, g("self_attn.o_proj"),
                                g("post_attention_layernorm"), wgu, g("mlp.down_proj")))
        self.dtype, self.device = self.norm.dtype, self.norm.device  # compute dtype (embed may be narrower)

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
        return cls(cfg, lambda n: sd[n].to(device=device, dtype=dtype))

    def get_input_embeddings(self):  # the HF accessor, for code that sizes caches by dtype
        return SimpleNamespace(weight=self.embed)

    def parameters(self):
        """The float tensors (quantized weights are not parameters)."""
        seen = {}
        for t in [self.embed, self.lm_head, self.norm] + [w for layer in self.layers for w in layer]:
            if isinstance(t, torch.Tensor):
                seen[id(t)] = t
        return iter(seen.values())


class LlamaRunner(_Runner):
    """Lean batch-1 forward of a Llama-family model over its own K/V; weights are shared."""

    def __init__(self, weights: LlamaWeights, max_len: int | None = None):
        w = weights
        self.weights = w
        self.max_len = max_len or w.config.max_position_embeddings
        self.n_heads, self.n_kv, self.hd, self.eps = w.n_heads, w.n_kv, w.hd, w.eps
        self.dtype, self.device = w.dtype, w.device
        self.embed, self.lm_head, self.norm, self.layers = w.embed, w.lm_head, w.norm, w.layers
        self.cos, self.sin = _rope_tables(w.inv_freq, self.max_len, self.dtype)
        L = len(self.layers)
        self.k = torch.zeros(L, self.n_kv, self.max_len, self.hd, dtype=self.dtype, device=self.device)
        self.v = torch.zeros_like(self.k)  # [L, Hkv, P, hd]
        self.ids: list[int] = []
        self.vocab_size = self.lm_head.shape[0]

    def truncate(self, n: int) -> None:
        del self.ids[n:]  # the K/V rows past n are dead: overwritten by the next forward

    def kv_bytes(self) -> int:
        return 2 * self.k.element_size() * self.k[:, :, : len(self.ids)].numel()

    def reserved_bytes(self) -> int:
        return 2 * self.k.element_size() * self.k.numel()

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    @torch.inference_mode()
    def forward(self, new_ids: list[int]) -> torch.Tensor:
        """Append `new_ids` at the cache's end; return their logits [T, V] (float32)."""
        p, T = len(self.ids), len(new_ids)
        if p + T > self.max_len:
            raise ValueError(f"context of {p + T} tokens exceeds the model's {self.max_len}")
        H, Hkv, hd = self.n_heads, self.n_kv, self.hd
        x = self.embed[torch.tensor(new_ids, device=self.device)].to(self.dtype)  # [T, D]
        cos, sin = self.cos[p:p + T], self.sin[p:p + T]  # [T, hd]
        mask = None
        if T > 1:  # query i sits at p+i and sees keys 0..p+i
            mask = torch.ones(T, p + T, dtype=torch.bool, device=self.device).tril(p)
        for li, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(self.layers):
            qkv = self._rms(x, w_in) @ wqkv.T  # [T, (H+2Hkv)·hd]
            q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
            q = q.view(T, H, hd).transpose(0, 1)  # [H, T, hd]
            k = k.view(T, Hkv, hd).transpose(0, 1)  # [Hkv, T, hd]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.k[li, :, p:p + T] = k
            self.v[li, :, p:p + T] = v.view(T, Hkv, hd).transpose(0, 1)
            o = F.scaled_dot_product_attention(
                q, self.k[li, :, : p + T], self.v[li, :, : p + T], attn_mask=mask,
                enable_gqa=Hkv != H)  # [H, T, hd]
            x = x + o.transpose(0, 1).reshape(T, H * hd) @ wo.T
            g, u = (self._rms(x, w_post) @ wgu.T).chunk(2, dim=-1)  # [T, I] each
            x = x + (F.silu(g) * u) @ wdown.T
        self.ids.extend(new_ids)
        return _f32(self._rms(x, self.norm) @ self.lm_head.T)  # [T, V]


class HFRunner(_Runner):
    """Any HF causal LM (quantized ones included) through its DynamicCache."""

    def __init__(self, model, max_len: int | None = None):
        from transformers import DynamicCache

        self.model = model
        self.max_len = max_len or getattr(model.config, "max_position_embeddings", 2048)
        self.cache = DynamicCache(config=model.config)
        self.ids: list[int] = []
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    def truncate(self, n: int) -> None:
        if n < len(self.ids):
            if n == 0:
                from transformers import DynamicCache
                self.cache = DynamicCache(config=self.model.config)
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


def make_runner(model, max_len: int | None = None, lean: bool = True) -> _Runner:
    """A runner for `model`: LlamaWeights → lean; an HF model → lean when plain Llama, else HF."""
    if isinstance(model, LlamaWeights):
        return LlamaRunner(model, max_len)
    if lean and lean_supported(model):
        w = getattr(model, "_lean_weights", None)
        if w is None:
            w = model._lean_weights = LlamaWeights.from_hf(model)  # fused once, shared by slots
        return LlamaRunner(w, max_len)
    return HFRunner(model, max_len)
