"""The language server's options: one frozen dataclass read from `initializationOptions`, with the
CLI flag names (dashes → underscores) for the engine and LSP-only ones after them. An invalid
or unknown option keeps its default and produces a warning for window/showMessage."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from completer.pipeline import CompletionOptions
from completer.syntax import SyntaxOptions


@dataclass(frozen=True)
class ServerOptions:
    # -- engine: the `completer` CLI flags ----------------------------------------------------
    target: str | None = None         # HF model dir or hub id; None = the embedded default pair
    draft: str | None = None          # draft model sharing the target's tokenizer
    device: str = "auto"              # auto | cpu | cuda[:N]
    dtype: str = "auto"               # auto | float32 | bfloat16 | float16
    quant: str = "auto"               # auto | none | fp16 | int8 | nf4 (bitsandbytes) | fast-int8 | mixed
    quant_groups: str = "embed=fp16,attn=int8,mlp=int4,head=int8"  # per-group precision for mixed
    drafter: str = "combined"         # combined | model | ngram | fastpath | none
    draft_len: int = 4                # initial draft length k (adapted per document)
    max_new_tokens: int = 64
    temperature: float = 0.0          # 0 = greedy
    top_p: float = 1.0
    kv_budget_mb: float = 256.0
    seed: int = 0
    engine: str | None = None         # ws://HOST:PORT of a running `completer serve` instead
    # -- LSP only ----------------------------------------------------------------------------
    debounce_ms: int = 75             # a newer request for the same document cancels the older
    warmup: bool = True               # prefill the KV cache on syntax triggers while typing
    multiline: bool = True
    complete_in_comments: bool = False
    complete_in_strings: bool = False
    complete_in_docstrings: bool = False
    max_lines: int = 16               # of a multi-line completion
    enable: bool = True               # completions on; false answers every request empty (no restart)
    ready_wait_ms: int = 30_000       # a request that arrives while the models load waits this long

    def engine_config(self) -> dict:
        """Keyword arguments for completer.pipeline.make_engine."""
        keys = ("target", "draft", "device", "dtype", "quant", "quant_groups", "drafter", "draft_len",
                "max_new_tokens", "temperature", "top_p", "kv_budget_mb", "seed")
        return {"engine": self.engine, **{k: getattr(self, k) for k in keys}}

    def completion(self) -> CompletionOptions:
        syn = SyntaxOptions(multiline=self.multiline, complete_in_comments=self.complete_in_comments,
                            complete_in_strings=self.complete_in_strings,
                            complete_in_docstrings=self.complete_in_docstrings, max_lines=self.max_lines)
        return CompletionOptions(max_new_tokens=self.max_new_tokens, syntax=syn)


_CHOICES = {
    "quant": ("auto", "none", "fp16", "int8", "nf4", "fast-int8", "mixed"),
    "drafter": ("combined", "model", "ngram", "fastpath", "none"),
    "dtype": ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"),
}
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "device": (lambda v: v in ("auto", "cpu", "cuda") or v.startswith("cuda:"), "auto, cpu or cuda[:N]"),
    "draft_len": (lambda v: 1 <= v <= 16, "in 1..16"),
    "max_new_tokens": (lambda v: 1 <= v <= 4096, "in 1..4096"),
    "temperature": (lambda v: 0 <= v <= 10, "in 0..10"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "kv_budget_mb": (lambda v: v > 0, "> 0"),
    "engine": (lambda v: v is None or v.startswith(("ws://", "wss://")), "a ws:// or wss:// URL"),
    "debounce_ms": (lambda v: 0 <= v <= 10_000, "in 0..10000"),
    "max_lines": (lambda v: 1 <= v <= 1000, "in 1..1000"),
    "ready_wait_ms": (lambda v: 0 <= v <= 600_000, "in 0..600000"),
}


def _typed(value: Any, default: Any, optional: bool) -> bool:
    if value is None:
        return optional
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, int):
        return isinstance(value, int)
    return isinstance(value, str)


def parse_options(raw: Any) -> tuple[ServerOptions, list[str]]:
    """ServerOptions from initializationOptions (any JSON value), and one warning per option
    that was ignored."""
    opts, warnings = ServerOptions(), []
    if raw is None:
        return opts, warnings
    if not isinstance(raw, dict):
        return opts, [f"initializationOptions must be an object, not {type(raw).__name__}: using defaults"]
    known = {f.name: f for f in fields(ServerOptions)}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            warnings.append(f"unknown option {key!r} ignored")
            continue
        default = getattr(opts, name)
        optional = "None" in str(known[name].type)
        if not _typed(value, default, optional):
            warnings.append(f"option {key!r}: expected {type(default).__name__ if default is not None else 'str'},"
                            f" got {value!r}; using the default {default!r}")
            continue
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        ok = value in _CHOICES[name] if name in _CHOICES else _CHECKS.get(name, (lambda v: True, ""))[0](value)
        if not ok:
            want = " | ".join(_CHOICES[name]) if name in _CHOICES else _CHECKS[name][1]
            warnings.append(f"option {key!r}={value!r} is invalid (expected {want}); using the default {default!r}")
            continue
        opts = replace(opts, **{name: value})
    return opts, warnings
