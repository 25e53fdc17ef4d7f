"""The model families of the lean runner, as data: one table of layer variants.

`layout_of(config_dict)` reads a checkpoint's config.json (or an HF config's `to_dict()`) into a
`Layout`: which norm, which MLP, which biases, q/k norm, tied embeddings, the embedding scale,
RoPE (θ and scaling, computed as HF's rope init functions do), the sliding window, and the tensor
names to load. `runner.LlamaWeights` loads by it and `runner.forward_many` follows it: one
forward for every family, the way llama.cpp's model table or vLLM's registry describe variants.

A config this table does not describe raises `Unsupported` (a ValueError) with one sentence; the
caller then uses the generic HF path.

| family     | norm                 | MLP                      | biases               | other                          |
|------------|----------------------|--------------------------|----------------------|--------------------------------|
| llama      | RMS                  | gated SiLU               | attention_bias, mlp_bias | RoPE scaling (linear, dynamic, llama3, yarn) |
| mistral    | RMS                  | gated SiLU               | none                 | sliding window                 |
| qwen2      | RMS                  | gated SiLU               | q/k/v                | tied embeddings (0.5B–3B), θ=1e6 |
| qwen3      | RMS                  | gated SiLU               | attention_bias       | per-head RMSNorm on q and k    |
| starcoder2 | LayerNorm (bias)     | c_fc → GELU(tanh) → c_proj | all linears (use_bias) | sliding window, tied       |
| gemma      | RMS × (1 + w)        | gated GELU(tanh)         | attention_bias       | embeddings × √d, tied          |
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class Unsupported(ValueError):
    """A config outside the lean runner's table (the generic HF path still runs it)."""


@dataclass(frozen=True)
class Rope:
    """RoPE frequencies: θ and a scaling rule with its parameters (HF's `rope_parameters`)."""
    kind: str = "default"  # default | linear | dynamic | llama3 | yarn
    theta: float = 10000.0
    factor: float | None = 1.0
    original_max: int | None = None  # llama3, yarn: the pretraining context
    low_freq_factor: float = 1.0     # llama3
    high_freq_factor: float = 4.0    # llama3
    beta_fast: float = 32.0          # yarn
    beta_slow: float = 1.0           # yarn
    attention_factor: float | None = None  # yarn: cos/sin scale (derived from factor when None)
    mscale: float | None = None      # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True            # yarn

    def inv_freq(self, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
        """(inverse frequencies [dim/2] float32, cos/sin scale), as HF's `_compute_*_parameters`
        compute them at init. Dynamic NTK equals the default below `max_pos` tokens (HF only
        rescales past it; runners refuse longer contexts for it, see LlamaRunner)."""
        exps = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        if self.kind == "dynamic":  # HF's formula at seq_len = max_pos (≈ θ, to the last ulp)
            base = self.theta * ((self.factor * max_pos / max_pos) - (self.factor - 1)) ** (dim / (dim - 2))
            return 1.0 / (base ** exps), 1.0
        inv = 1.0 / (self.theta ** exps)
        if self.kind == "default":
            return inv, 1.0
        if self.kind == "linear":
            return inv / self.factor, 1.0
        if self.kind == "llama3":
            return self._llama3(inv), 1.0
        if self.kind == "yarn":
            return self._yarn(dim, max_pos)
        raise Unsupported(f"RoPE type {self.kind!r} is not on the lean path")

    def _llama3(self, inv: torch.Tensor) -> torch.Tensor:
        old = self.original_max
        low_wl, high_wl = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > low_wl, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * out / self.factor + smooth * out
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return torch.where(medium, smoothed, out)

    def _yarn(self, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
        factor = self.factor if self.factor is not None else max_pos / self.original_max

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = self.attention_factor
        if att is None:
            att = (float(get_mscale(factor, self.mscale) / get_mscale(factor, self.mscale_all_dim))
                   if self.mscale and self.mscale_all_dim else get_mscale(factor))

        def corr_dim(rot: float) -> float:
            return (dim * math.log(self.original_max / (rot * 2 * math.pi))) / (2 * math.log(self.theta))

        low, high = corr_dim(self.beta_fast), corr_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = self.theta ** (torch.arange(0, dim, 2).float() / dim)
        extra = 1 - ramp  # the share of each frequency kept as is (extrapolated)
        inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
        return inv, att


@dataclass(frozen=True)
class Names:
    """Tensor names in a checkpoint: globals in full, per-layer ones after `model.layers.{i}.`
    (a module path: `.weight` / `.bias` are appended). `gate` is None for a plain MLP."""
    embed: str = "model.embed_tokens.weight"
    head: str = "lm_head.weight"
    norm: str = "model.norm"
    in_norm: str = "input_layernorm"
    post_norm: str = "post_attention_layernorm"
    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    o: str = "self_attn.o_proj"
    q_norm: str = "self_attn.q_norm"
    k_norm: str = "self_attn.k_norm"
    gate: str | None = "mlp.gate_proj"
    up: str = "mlp.up_proj"
    down: str = "mlp.down_proj"


@dataclass(frozen=True)
class Layout:
    """One model's layer variant: what `forward_many` computes for it."""
    family: str
    norm: str               # "rms" | "rms_1p" (Gemma: x·(1+w), folded into w at load) | "layer" (with bias)
    act: str                # "silu_gated" | "gelu_tanh_gated" | "gelu_mlp" (up → GELU(tanh) → down)
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool           # Qwen3: RMSNorm over each head of q and k, before RoPE
    tied_embeddings: bool
    embed_scale: float | None  # Gemma: embeddings × √d (rounded to float32, as HF does)
    rope: Rope
    sliding_window: int | None  # attend to the last W positions (the query's own included)
    norm_eps: float
    head_dim: int
    names: Names


@dataclass(frozen=True)
class Family:
    """How one `model_type` maps onto a Layout. A flag is fixed (bool) or read from the config
    as (key, default); defaults are HF's config-class defaults, for config.json files that omit
    a key."""
    norm: str = "rms"
    acts: tuple[tuple[str, str], ...] = (("silu", "silu_gated"), ("gelu_pytorch_tanh", "gelu_tanh_gated"))
    default_act: str = "silu"
    eps: tuple[str, float] = ("rms_norm_eps", 1e-6)
    qkv_bias: bool | tuple[str, bool] = ("attention_bias", False)
    o_bias: bool | tuple[str, bool] = ("attention_bias", False)
    mlp_bias: bool | tuple[str, bool] = ("mlp_bias", False)
    qk_norm: bool = False
    tied: bool = False  # default of tie_word_embeddings
    embed_scale: bool = False
    window: tuple[str, int | None] | None = None  # (config key, default); None: full attention only
    head_dim: int | None = None  # default when config has none (else hidden / heads)
    max_pos: int = 2048
    names: Names = Names()


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(qkv_bias=False, o_bias=False, mlp_bias=False, window=("sliding_window", 4096), max_pos=131072),
    "qwen2": Family(qkv_bias=True, o_bias=False, mlp_bias=False, max_pos=32768),
    "qwen3": Family(mlp_bias=False, qk_norm=True, max_pos=32768),
    "starcoder2": Family(norm="layer", acts=(("gelu_pytorch_tanh", "gelu_mlp"),), default_act="gelu_pytorch_tanh",
                         eps=("norm_epsilon", 1e-5), qkv_bias=("use_bias", True), o_bias=("use_bias", True),
                         mlp_bias=("use_bias", True), tied=True, window=("sliding_window", None), max_pos=4096,
                         names=Names(gate=None, up="mlp.c_fc", down="mlp.c_proj")),
    "gemma": Family(norm="rms_1p", acts=(("gelu_pytorch_tanh", "gelu_tanh_gated"), ("gelu", "gelu_tanh_gated")),
                    default_act="gelu_pytorch_tanh", mlp_bias=False, tied=True, embed_scale=True, head_dim=256,
                    max_pos=8192),
}
ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")


def _flag(cfg: dict, f: bool | tuple[str, bool]) -> bool:
    return f if isinstance(f, bool) else bool(cfg.get(f[0], f[1]))


def rope_of(cfg: dict) -> Rope:
    """RoPE from either spelling: `rope_parameters` (transformers 5) or `rope_theta` +
    `rope_scaling` (older config.json files)."""
    p = dict(cfg.get("rope_scaling") or {})
    p.update(cfg.get("rope_parameters") or {})
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise Unsupported(f"RoPE type {kind!r} is not on the lean path (supported: {', '.join(ROPE_KINDS)})")
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported("partial rotary embeddings are not on the lean path")
    theta = p.get("rope_theta") or cfg.get("rope_theta") or 10000.0
    orig = p.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if kind in ("llama3", "yarn"):
        orig = orig or cfg.get("max_position_embeddings")
        if orig is None:
            raise Unsupported(f"RoPE {kind} needs original_max_position_embeddings")
    try:
        kw = {k: p[k] for k in ("low_freq_factor", "high_freq_factor", "attention_factor", "mscale",
                                 "mscale_all_dim", "truncate") if p.get(k) is not None}
        if kind == "llama3":
            kw.update(low_freq_factor=p["low_freq_factor"], high_freq_factor=p["high_freq_factor"])
        kw.update({k: p[k] for k in ("beta_fast", "beta_slow") if p.get(k)})  # HF: falsy → default
        factor = p.get("factor")  # yarn: None means max_position_embeddings / original_max
        if kind in ("linear", "dynamic", "llama3") and factor is None:
            raise KeyError("factor")
        return Rope(kind, float(theta), factor=1.0 if kind == "default" else factor, original_max=orig, **kw)
    except KeyError as e:
        raise Unsupported(f"RoPE {kind} needs {e.args[0]}") from None


def layout_of(cfg: dict) -> Layout:
    """The Layout of a config dict, or `Unsupported` with the reason."""
    mt = cfg.get("model_type")
    fam = FAMILIES.get(mt)
    if fam is None:
        raise Unsupported(f"model type {mt!r} is not on the lean path (it has: {', '.join(FAMILIES)})")
    acts = dict(fam.acts)
    act = cfg.get("hidden_act") or cfg.get("hidden_activation") or fam.default_act
    if act not in acts:
        raise Unsupported(f"{mt} with hidden_act {act!r} is not on the lean path")
    if cfg.get("use_sliding_window"):
        raise Unsupported(f"{mt} with per-layer sliding windows (use_sliding_window) is not on the lean path")
    types = set(cfg.get("layer_types") or [])
    if len(types) > 1 or types - {"full_attention", "sliding_attention"} or (
            types == {"sliding_attention"} and fam.window is None):
        raise Unsupported(f"{mt} with layer types {sorted(types)} is not on the lean path (one window for all layers)")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or fam.head_dim or cfg["hidden_size"] // heads
    window = cfg.get(fam.window[0], fam.window[1]) if fam.window else None
    rope = rope_of(cfg)
    return Layout(
        family=mt, norm=fam.norm, act=acts[act],
        qkv_bias=_flag(cfg, fam.qkv_bias), o_bias=_flag(cfg, fam.o_bias), mlp_bias=_flag(cfg, fam.mlp_bias),
        qk_norm=fam.qk_norm, tied_embeddings=bool(cfg.get("tie_word_embeddings", fam.tied)),
        embed_scale=float(torch.tensor(cfg["hidden_size"] ** 0.5)) if fam.embed_scale else None,
        rope=rope, sliding_window=int(window) if window else None,
        norm_eps=float(cfg.get(fam.eps[0]) or fam.eps[1]), head_dim=int(head_dim), names=fam.names)


def max_positions(cfg: dict) -> int:
    """max_position_embeddings, with the family's default when config.json omits it."""
    fam = FAMILIES.get(cfg.get("model_type"))
    return int(cfg.get("max_position_embeddings") or (fam.max_pos if fam else 2048))
