"""One option schema. Every option is a field of a frozen dataclass whose metadata carries its
help, choices and bounds; the CLI flags, the language server's `initializationOptions`, the TOML
config files and the JSON Schema that the editors' settings are checked against are generated
from these fields, so an option is added in exactly one place.

Precedence: CLI flag > initialization option > project `.completer.toml` (nearest parent
directory of the file, or the workspace root) > user `$XDG_CONFIG_HOME/completer/config.toml`
(else `~/.config/completer/config.toml`) > default. An unknown key or an invalid value from any
source produces one warning naming the option, the value and what is allowed, and the value
from the next source down is used. No torch here.
"""
from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from .engine.prompt import FIM_FORMATS  # torch-free: the table of model families' FIM spellings


def opt(default: Any, help: str, *, choices: tuple[str, ...] | None = None, lo: float | None = None,
        hi: float | str | None = None, lo_open: bool = False, check: tuple[Callable[[str], bool], str] | None = None,
        reload: bool = False, secret: bool = False) -> Any:
    """A schema field: `hi` may name another option (draft_len ≤ max_draft_len); `check` is
    (predicate, what is allowed) for strings; `reload`: changing it needs new models; `secret`:
    never printed."""
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "check": check,
            "reload": reload, "secret": secret}
    return field(default=default, metadata=meta)


ENGINE_URL_SCHEMES = ("ws://", "wss://", "llamacpp:http://", "llamacpp:https://", "openai:http://",
                      "openai:https://")


@dataclass(frozen=True)
class EngineConfig:
    """The in-process engine: models, quantization, decoding, cache, scheduler."""
    target: str | None = opt(None, "target model: HF model directory or hub id (default: the embedded pair)",
                             reload=True)
    draft: str | None = opt(None, "draft model sharing the target's tokenizer (default: the embedded pair)",
                            reload=True)
    device: str = opt("auto", "auto (CUDA when present) | cpu | cuda[:N]", reload=True,
                      check=(lambda v: v in ("auto", "cpu", "cuda") or v.startswith("cuda:"), "auto, cpu or cuda[:N]"))
    dtype: str = opt("auto", "compute dtype; auto = fp32 on CPU, bf16 on CUDA", reload=True,
                     choices=("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"))
    quant: str = opt("auto", "target weights: auto (fp16 storage for a 16-bit checkpoint on CPU, else none) | "
                     "none | fp16 | fast-int8 | mixed (ours) | int8 | nf4 (bitsandbytes)", reload=True,
                     choices=("auto", "none", "fp16", "int8", "nf4", "fast-int8", "mixed"))
    quant_groups: str = opt("embed=fp16,attn=int8,mlp=int4,head=int8",
                            "per-module-group precision for quant=mixed (embed, attn, mlp, head)", reload=True)
    drafter: str = opt("combined", "combined (n-gram, fast path, then the draft model) | model | ngram | "
                       "fastpath | none (plain decoding)", reload=True,
                       choices=("combined", "model", "ngram", "fastpath", "none"))
    draft_len: int = opt(4, "initial draft length k, then adapted per document and syntax node", lo=1,
                         hi="max_draft_len")
    max_draft_len: int = opt(8, "the longest draft adaptive k may choose", lo=1, hi=16)
    draft_vocab: int = opt(2048, "the draft scores only the N most frequent tokens (embedded pair; 0 = all)",
                           lo=0, hi=1 << 20)
    max_new_tokens: int = opt(64, "most tokens one completion generates", lo=1, hi=4096)
    temperature: float = opt(0.0, "0 = greedy; sampling keeps the target's distribution exactly", lo=0.0, hi=10.0)
    top_p: float = opt(1.0, "nucleus sampling mass", lo=0.0, hi=1.0, lo_open=True)
    kv_budget_mb: float = opt(256.0, "all per-document KV caches together (LRU, never exceeded)", lo=0.0,
                              hi=1 << 20, lo_open=True)
    lean: bool = opt(True, "the lean runner where the architecture allows (else HF's forward)", reload=True)
    seed: int = opt(0, "sampling seed", lo=0, hi=2**63 - 1)
    fim_format: str = opt("auto", "FIM prompt format: auto (from the tokenizer and model type) or a family's "
                          "format; 'suffix' lets an OpenAI-compatible server build it", reload=True,
                          choices=("auto", *FIM_FORMATS, "suffix"))
    max_batch: int = opt(8, "live generations whose forwards step together; 1 = serial", lo=1, hi=256)
    batch_wait_ms: float = opt(2.0, "how long a batched step waits for the other live generations", lo=0.0,
                               hi=1000.0)
    max_queue: int = opt(64, "requests waiting beyond this are refused (overloaded)", lo=1, hi=100_000)
    batch_step_tokens: int = opt(32, "verify tokens a batched step aims at: each live generation's draft is "
                                 "capped to its share under load (0 = no cap)", lo=0, hi=4096)
    decode_threads: int = opt(1, "CPU threads for a decode step or verify of the target: 1 keeps each step steady "
                              "while other processes hold a core; more is faster on an otherwise idle machine "
                              "(bench/peers.py measures both)", lo=1, hi=256, reload=True)
    warmup_chunk: int = opt(32, "warmup prefill chunk: the most an interactive request waits on it", lo=1,
                            hi=4096)
    type_through: bool = opt(True, "serve the rest of the last completion when the user types it")

    def validate(self) -> None:
        """Raise EngineError for a value outside the schema (code that builds a config by hand)."""
        from .client import EngineError

        problems = check_all(self)
        if problems:
            raise EngineError("; ".join(problems), "bad_request")


@dataclass(frozen=True)
class SyntaxOptions:
    """The syntax layer: gating, context selection, the in-loop stop and post-processing."""
    multiline: bool = opt(True, "false: never more than the rest of the line")
    complete_in_comments: bool = opt(False, "complete inside comments")
    complete_in_strings: bool = opt(False, "complete inside string literals")
    complete_in_docstrings: bool = opt(False, "complete inside docstrings")
    max_lines: int = opt(16, "a multi-line completion stops after this many lines", lo=1, hi=1000)
    prefix_lines: int = opt(120, "the prefix window reaches at most this far back", lo=1, hi=100_000)
    suffix_lines: int = opt(40, "the suffix window reaches at most this far ahead", lo=0, hi=100_000)
    suffix_share: float = opt(0.25, "share of the prompt budget for the suffix", lo=0.0, hi=0.9)
    header_share: float = opt(0.2, "share of the budget for imports and outline outside the window", lo=0.0,
                              hi=0.9)
    max_siblings: int = opt(8, "sibling definitions summarised in the header", lo=0, hi=1000)
    grid_lines: int = opt(16, "the prefix window starts on this line grid (stable KV-cache reuse)", lo=1,
                          hi=4096)
    parse_check: bool = opt(True, "trim what adds parse errors (re-parse with the candidate inserted)")
    stop_degenerate: bool = opt(True, "stop and drop degenerate output (a unit or line repeated in a row, "
                                "blank lines, the line above echoed)")


@dataclass(frozen=True)
class ClientConfig:
    """Which engine the language server talks to when it does not load models itself."""
    engine: str | None = opt(None, "an engine elsewhere instead of in-process models: ws://HOST:PORT "
                             "(completer serve), llamacpp:http://HOST:PORT (llama-server /infill), "
                             "openai:http(s)://HOST:PORT/v1 (any OpenAI-compatible /v1/completions)",
                             reload=True, check=(lambda v: v.startswith(ENGINE_URL_SCHEMES),
                                                 "a URL starting " + ", ".join(ENGINE_URL_SCHEMES)))
    engine_api_key: str | None = opt(None, "API key for a remote engine (else env COMPLETER_API_KEY)",
                                     reload=True, secret=True)
    engine_model: str | None = opt(None, "model name for an OpenAI-compatible engine (default: its first)",
                                   reload=True)
    engine_timeout_ms: int = opt(10_000, "a remote request that takes longer fails", lo=100, hi=600_000)
    engine_retries: int = opt(2, "connection retries (with back-off) before a remote request fails", lo=0,
                              hi=10)


@dataclass(frozen=True)
class LspConfig:
    """The language server's own behaviour."""
    enable: bool = opt(True, "completions on; false answers every request empty (no restart)")
    debounce_ms: int = opt(75, "per document; a newer request cancels the older", lo=0, hi=10_000)
    warmup: bool = opt(True, "prefill the KV cache on syntax triggers while typing")
    ready_wait_ms: int = opt(30_000, "a request that arrives while the models load waits this long", lo=0,
                             hi=600_000)


@dataclass(frozen=True)
class ServeConfig:
    """`completer serve`: the engine service's network side."""
    host: str = opt("127.0.0.1", "address to bind; a non-loopback host needs a token")
    port: int = opt(7421, "port (0 = any free port, printed on start)", lo=0, hi=65535)
    token: str | None = opt(None, "auth token (required for a non-loopback host; env COMPLETER_TOKEN)",
                            secret=True)
    allow_origins: tuple[str, ...] = opt((), "browser Origins allowed besides localhost pages ('*' = any)")
    max_frame_bytes: int = opt(4 * 2**20, "larger frames get a too_large error", lo=1024, hi=1 << 30)
    max_inflight: int = opt(64, "requests in flight per connection", lo=1, hi=10_000)


@dataclass(frozen=True)
class WorkspaceOptions:
    """The workspace index and cross-file context (completer/workspace)."""
    cross_file: bool = opt(True, "add definitions and snippets from other files of the workspace to the prompt")
    cross_file_share: float = opt(0.3, "share of the prompt budget for cross-file context", lo=0.0, hi=0.9)
    cross_file_max_files: int = opt(8, "other files cross-file context may draw from", lo=1, hi=100)
    index_memory_mb: float = opt(64.0, "the workspace index's memory bound (estimated; files beyond it are "
                                 "not indexed)", lo=1.0, hi=1 << 16)
    index_max_file_kb: int = opt(512, "larger files are not indexed", lo=1, hi=1 << 20)


SCOPES: dict[str, type] = {"engine": EngineConfig, "client": ClientConfig, "syntax": SyntaxOptions,
                           "lsp": LspConfig, "serve": ServeConfig, "workspace": WorkspaceOptions}


# -- the schema's machinery ------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    name: str
    scope: str
    type: type          # bool | int | float | str | tuple
    optional: bool      # None allowed
    default: Any
    meta: Mapping[str, Any]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _option(scope: str, cls: type, f: Field) -> Option:
    hint = typing.get_type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = typing.get_origin(hint) or hint
    optional = type(None) in typing.get_args(hint)
    if optional:
        base = args[0]
    default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
    return Option(f.name, scope, tuple if base is tuple else base, optional, default, f.metadata)


OPTIONS: dict[str, Option] = {f.name: _option(scope, cls, f) for scope, cls in SCOPES.items() for f in fields(cls)}


def _allowed(o: Option, values: Mapping[str, Any]) -> str:
    m = o.meta
    if m.get("choices"):
        return "one of " + ", ".join(m["choices"])
    if m.get("check"):
        return m["check"][1]
    if o.type in (int, float) and m.get("lo") is not None:
        hi = m["hi"] if not isinstance(m["hi"], str) else values.get(m["hi"], OPTIONS[m["hi"]].default)
        return f"{'an integer' if o.type is int else 'a number'} {'>' if m.get('lo_open') else '≥'} {m['lo']:g} and ≤ {hi:g}"
    return {bool: "true or false", str: "a string", tuple: "a list of strings"}.get(o.type, o.type.__name__)


def coerce(o: Option, value: Any, values: Mapping[str, Any] = {}) -> tuple[bool, Any]:
    """(ok, value in the option's type) for a raw value from any source."""
    if value is None:
        return o.optional, None
    if o.type is bool:
        return isinstance(value, bool), value
    if o.type in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, value
        if o.type is int and isinstance(value, float):
            if not value.is_integer():
                return False, value
            value = int(value)
        value = o.type(value)
        m = o.meta
        lo, hi = m.get("lo"), m.get("hi")
        hi = values.get(hi, OPTIONS[hi].default) if isinstance(hi, str) else hi
        ok = (lo is None or (value > lo if m.get("lo_open") else value >= lo)) and (hi is None or value <= hi)
        return ok, value
    if o.type is tuple:
        if isinstance(value, str):
            value = [value]
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return ok, tuple(value) if ok else value
    if not isinstance(value, str):
        return False, value
    m = o.meta
    if m.get("choices"):
        return value in m["choices"], value
    if m.get("check"):
        return m["check"][0](value), value
    return True, value


def show(o: Option, value: Any) -> str:
    """A value as it is safe to print (secrets masked)."""
    return "'***'" if o.meta.get("secret") and value else repr(value)


@dataclass
class Resolved:
    """Effective values, where each came from, and the warnings the sources produced."""
    values: dict[str, Any]
    sources: dict[str, str]
    warnings: list[str]

    def build(self, cls: type):
        return cls(**{f.name: self.values[f.name] for f in fields(cls)})


def resolve(layers: Iterable[tuple[str, Mapping[str, Any] | None]], scopes: Iterable[str] = SCOPES) -> Resolved:
    """Merge sources, lowest precedence first: [(source name, {option: raw value}), ...]."""
    known = {n: o for n, o in OPTIONS.items() if o.scope in set(scopes)}
    values = {n: o.default for n, o in known.items()}
    sources = dict.fromkeys(known, "default")
    warnings: list[str] = []
    for source, raw in layers:
        for key, value in (raw or {}).items():
            name = str(key).replace("-", "_")
            o = known.get(name)
            if o is None:
                warnings.append(f"{source}: unknown option {key!r} ignored")
                continue
            ok, v = coerce(o, value, values)
            if not ok:
                warnings.append(f"{source}: option {name!r} = {show(o, value)} is invalid (allowed: "
                                f"{_allowed(o, values)}); using {show(o, values[name])} ({sources[name]})")
                continue
            values[name], sources[name] = v, source
    for name, o in known.items():  # bounds that depend on another option (draft_len ≤ max_draft_len)
        if isinstance(o.meta.get("hi"), str) and not coerce(o, values[name], values)[0]:
            fallback = o.default if coerce(o, o.default, values)[0] else values[o.meta["hi"]]
            warnings.append(f"{sources[name]}: option {name!r} = {values[name]!r} is invalid (allowed: "
                            f"{_allowed(o, values)}); using {fallback!r}")
            values[name], sources[name] = fallback, "default"
    return Resolved(values, sources, warnings)


def check_all(obj) -> list[str]:
    """The schema's complaints about a dataclass instance built by hand."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return [f"{n}={show(OPTIONS[n], v)} is invalid (allowed: {_allowed(OPTIONS[n], values)})"
            for n, v in values.items() if n in OPTIONS and not coerce(OPTIONS[n], v, values)[0]]


def needs_reload(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Options whose change needs new models (or a new remote engine)."""
    return [n for n, o in OPTIONS.items() if o.meta.get("reload") and old.get(n, o.default) != new.get(n, o.default)]


# -- sources: CLI flags, files ------------------------------------------------------------------------
def add_arguments(ap: argparse.ArgumentParser, scopes: Iterable[str], title: str | None = None) -> None:
    """One flag per option of `scopes`; a flag not given leaves no attribute (so that lower
    sources show through in `resolve`)."""
    for scope in scopes:
        g = ap.add_argument_group(title or f"{scope} options ({SCOPES[scope].__doc__.strip().rstrip('.')})")
        for o in (o for o in OPTIONS.values() if o.scope == scope):
            kw: dict[str, Any] = {"dest": o.name, "default": argparse.SUPPRESS,
                                  "help": f"{o.meta['help']} [default: {show(o, o.default)}]"}
            if o.type is bool:
                kw["action"] = argparse.BooleanOptionalAction
            elif o.type is tuple:
                kw.update(action="append", metavar="VALUE")
            else:
                kw["type"] = _none_or(o.type) if o.optional else o.type
                if o.meta.get("choices"):
                    kw["metavar"] = "{" + ",".join(o.meta["choices"]) + "}"
            g.add_argument(o.flag, **kw)


def _none_or(t: Callable) -> Callable:
    return lambda s: None if s.lower() in ("", "none") else t(s)


def from_args(ns: argparse.Namespace) -> dict[str, Any]:
    return {n: getattr(ns, n) for n in OPTIONS if hasattr(ns, n)}


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "completer" / "config.toml"


def project_config_path(start: str | Path | None) -> Path | None:
    """The nearest `.completer.toml` in `start` (a file or directory) or a parent directory."""
    if start is None:
        return None
    p = Path(start).resolve()
    for d in ([p] if p.is_dir() else []) + list(p.parents):
        if (d / ".completer.toml").is_file():
            return d / ".completer.toml"
    return None


def read_toml(path: Path | None) -> tuple[dict[str, Any], list[str]]:
    """A config file's keys (a `[completer]` table or top-level keys); a broken file is a warning."""
    if path is None or not path.is_file():
        return {}, []
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return {}, [f"{path}: cannot read it ({e}); ignored"]
    return (data["completer"] if isinstance(data.get("completer"), dict) else data), []


def file_layers(project_start: str | Path | None) -> tuple[list[tuple[str, dict]], list[str]]:
    """[(user file), (project file)] layers, lowest first, and their read warnings."""
    layers, warnings = [], []
    for path in (user_config_path(), project_config_path(project_start)):
        values, w = read_toml(path)
        warnings += w
        if values:
            layers.append((str(path), values))
    return layers, warnings


def json_schema(scopes: Iterable[str] = SCOPES) -> dict:
    """The options as a JSON Schema (draft 2020-12); `x-scope` says which part reads each one."""
    props = {}
    names = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "array"}
    for o in (o for o in OPTIONS.values() if o.scope in set(scopes)):
        m = o.meta
        p: dict[str, Any] = {"type": [names[o.type], "null"] if o.optional else names[o.type],
                             "default": list(o.default) if o.type is tuple else o.default,
                             "description": m["help"], "x-scope": o.scope}
        if o.type is tuple:
            p["items"] = {"type": "string"}
        if m.get("choices"):
            p["enum"] = list(m["choices"])
        if o.type in (int, float):
            if m.get("lo") is not None:
                p["exclusiveMinimum" if m.get("lo_open") else "minimum"] = m["lo"]
            hi = m.get("hi")
            if isinstance(hi, str):
                p["maximum"], p["x-maximum-option"] = OPTIONS[hi].meta["hi"], hi
            elif hi is not None:
                p["maximum"] = hi
        if m.get("reload"):
            p["x-reload"] = True
        props[o.name] = p
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "completer options",
            "type": "object", "properties": props, "additionalProperties": False}
