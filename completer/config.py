"""One option schema. Every option is a field of a frozen dataclass whose metadata carries its
help, choices and bounds; the CLI flags, the language server's `initializationOptions`, the TOML
config files and the JSON Schema that the editors' settings are checked against are generated
from these fields, so an option is added in exactly one place.

Precedence: CLI flag > initialization option > project `.completer.toml` > user
`$XDG_CONFIG_HOME/completer/config.toml` (else `~/.config/completer/config.toml`) > default. The
project file is the nearest one from the file's directory up to the workspace root, never above
the root (a file there came with whatever holds the workspace, not with it; `project_config_path`).
An unknown key or an invalid value from any source produces one warning naming the option, the
value and what is allowed, and the value from the next source down is used; an option of another
command (a shared user file holds `host` for `completer serve`) is skipped without a word. No torch
here.

The trust boundary (this module is its one owner): a project file comes with the code the user
cloned, so outside one of the user's `trusted_workspaces` (set in the user file, the editor or
the command line, never in a project file) it may set only what shapes completions. Each option
says what a project file may do with it (`opt(project=...)`, the schema's `x-project`): "yes" set
it; "at_most" set it no higher than the user's own value (a size of one completion's work); "no"
nothing: the options marked `trust` (they decide where code and keys go or what runs: engine URLs
and keys, models, hosts, tokens, origins) and the bounds on memory, threads, sizes and time and
the device, which are the user's. What a project file may not set is refused, in one warning per
file, and `Resolved.refused` says why (`completer config` shows it). A key goes only to the engine
it was set beside (`Resolved.engine_key`).
"""
from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from .fim import FIM_FORMATS  # torch-free: the table of model families' FIM spellings
from .prompt import GRID_LINES, SUFFIX_SHARE  # torch-free: the prompt builder's defaults

# The names of edits/formats.EDIT_FORMATS (tests/test_config.py holds them equal): the schema
# names them without importing the formats, which import the embedded pair's recipe
# (draft_models/edit_format.py) and the edits package (tree-sitter): config stays light.
EDIT_FORMAT_NAMES = ("completer", "zeta", "sweep")


def opt(default: Any, help: str, *, choices: tuple[str, ...] | None = None, lo: float | None = None,
        hi: float | str | None = None, lo_open: bool = False, check: tuple[Callable[[str], bool], str] | None = None,
        reload: bool = False, secret: bool = False, trust: bool = False, project: str = "yes") -> Any:
    """A schema field: `hi` may name another option (draft_len ≤ max_draft_len); `check` is
    (predicate, what is allowed) for strings; `reload`: changing it needs new models; `secret`:
    never printed; `trust`: decides where code and keys go or what runs; `project`: what a project
    file outside a trusted workspace may do with it, one of PROJECT_RULES ("no" for a `trust`
    option)."""
    if project not in PROJECT_RULES or (trust and project != "yes"):
        raise ValueError(f"project={project!r}: one of {', '.join(PROJECT_RULES)}; a trust option is 'no' already")
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "check": check,
            "reload": reload, "secret": secret, "trust": trust, "project": "no" if trust else project}
    return field(default=default, metadata=meta)


# What a project's `.completer.toml` outside a trusted workspace may do with an option: "yes" set it
# (completion behaviour); "at_most" set it no higher than the user's own value (a size of one
# completion's work); "no" nothing (where code and keys go; a bound on memory, threads, sizes or
# time; the device: the user's config, the editor or the command line set them).
PROJECT_RULES = ("yes", "at_most", "no")


ENGINE_URL_SCHEMES = ("ws://", "wss://", "llamacpp:http://", "llamacpp:https://", "openai:http://",
                      "openai:https://")


@dataclass(frozen=True)
class EngineConfig:
    """The in-process engine: models, quantization, decoding, cache, scheduler."""
    target: str | None = opt(None, "target model: HF model directory or hub id (default: the embedded pair)",
                             reload=True, trust=True)
    draft: str | None = opt(None, "draft model sharing the target's tokenizer (default: the embedded pair)",
                            reload=True, trust=True)
    next_edit_model: str | None = opt(None, "a model of its own for next edits (an HF model directory, e.g. "
                                      "draft_models/next_edit/target): it writes the rewrites, the target keeps "
                                      "the completions; unset: the target writes both", reload=True, trust=True)
    device: str = opt("auto", "auto (CUDA when present) | cpu | cuda[:N]", reload=True,
                      check=(lambda v: v in ("auto", "cpu", "cuda") or v.startswith("cuda:"), "auto, cpu or cuda[:N]"),
                      project="no")
    dtype: str = opt("auto", "compute dtype; auto = fp32 on CPU, bf16 on CUDA", reload=True,
                     choices=("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"), project="no")
    quant: str = opt("auto", "target weights: auto (fp16 storage for a 16-bit checkpoint on CPU, else none) | "
                     "none | fp16 | fast-int8 | int4 | mixed (ours) | int8 | nf4 (bitsandbytes)", reload=True,
                     choices=("auto", "none", "fp16", "int8", "nf4", "fast-int8", "int4", "mixed"), project="no")
    draft_quant: str = opt("auto", "draft weights: auto (int8 where the native CPU step runs, else fp16 "
                           "where the target's auto would) | none | fp16 | int8 | int4; moves acceptance, "
                           "never the output", reload=True, choices=("auto", "none", "fp16", "int8", "int4"),
                           project="no")
    quant_groups: str = opt("embed=fp16,attn=int8,mlp=int4,head=int8",
                            "per-module-group precision for quant=mixed (embed, attn, mlp, head)", reload=True,
                            project="no")
    drafter: str = opt("combined", "combined (n-gram, fast path, then the draft model) | model | ngram | "
                       "fastpath | none (plain decoding)", reload=True,
                       choices=("combined", "model", "ngram", "fastpath", "none"), project="no")
    draft_len: int = opt(4, "initial draft length k, then adapted per document and syntax node", lo=1,
                         hi="max_draft_len")
    max_draft_len: int = opt(8, "the longest draft adaptive k may choose", lo=1, hi=16, project="at_most")
    draft_vocab: int = opt(2048, "the draft scores only the N most frequent tokens (embedded pair; 0 = all)",
                           lo=0, hi=1 << 20, reload=True, project="no")
    max_new_tokens: int = opt(64, "most tokens one completion generates", lo=1, hi=4096, project="at_most")
    alternatives: int = opt(1, "completions per request: the main one and up to N-1 alternatives to cycle, "
                            "branching from it at its least sure tokens over the same KV cache (each costs a "
                            "plain decode of its rest)", lo=1, hi=5, project="at_most")
    temperature: float = opt(0.0, "0 = greedy; sampling keeps the target's distribution exactly", lo=0.0, hi=10.0)
    top_p: float = opt(1.0, "nucleus sampling mass", lo=0.0, hi=1.0, lo_open=True)
    kv_budget_mb: float = opt(256.0, "all per-document KV caches together (LRU, never exceeded)", lo=0.0,
                              hi=1 << 20, lo_open=True, project="no")
    lean: bool = opt(True, "the lean runner where the architecture allows (else HF's forward)", reload=True,
                     project="no")
    seed: int = opt(0, "sampling seed", lo=0, hi=2**63 - 1)
    fim_format: str = opt("auto", "FIM prompt format: auto (from the tokenizer and model type) or a family's "
                          "format; 'suffix' lets an OpenAI-compatible server build it", reload=True,
                          choices=("auto", *FIM_FORMATS, "suffix"))
    max_batch: int = opt(8, "live generations whose forwards step together; 1 = serial", lo=1, hi=256,
                         project="no")
    batch_wait_ms: float = opt(2.0, "how long a batched step waits for the other live generations", lo=0.0,
                               hi=1000.0, project="no")
    max_queue: int = opt(64, "requests waiting beyond this are refused (overloaded)", lo=1, hi=100_000,
                         project="no")
    batch_step_tokens: int = opt(32, "verify tokens a batched step aims at: each live generation's draft is "
                                 "capped to its share under load (0 = no cap)", lo=0, hi=4096, project="no")
    decode_threads: int = opt(1, "CPU threads for a decode step or verify of the target: 1 keeps each step steady "
                              "while other processes hold a core; more is faster on an otherwise idle machine "
                              "(bench/peers.py measures both)", lo=1, hi=256, reload=True, project="no")
    kv_cache: str = opt("f16", "the native CPU decode step's K/V cache: f16 (half the bytes a step reads at depth, as "
                        "llama.cpp's default; logits within ~1e-3 of f32) | f32 (the checkpoint's arithmetic)",
                        choices=("f16", "f32"), reload=True, project="no")
    warmup_chunk: int = opt(32, "warmup prefill chunk: the most an interactive request waits on it", lo=1,
                            hi=4096, project="no")
    type_through: bool = opt(True, "serve the rest of the last completion when the user types it")
    prefetch: bool = opt(True, "while idle, complete after the shown completion as if accepted, so that "
                               "accepting it and asking again answers at once")
    min_confidence: float | None = opt(None, "show a completion only up to the first token the model gives a "
                                       "lower probability (nothing when no word is left); unset: the model's "
                                       "calibrated value (completer_min_confidence in its config.json), else off; "
                                       "0 = off", lo=0.0, hi=1.0)
    next_edit_min_confidence: float | None = opt(None, "a next edit the model writes is dropped (reason: unsure) "
                                                 "when any token of its answer has a lower probability; a rename "
                                                 "in the last edit is then carried from the syntax tree instead; "
                                                 "unset: the model's calibrated value "
                                                 "(completer_next_edit_min_confidence in its config.json), else "
                                                 "off; 0 = off", lo=0.0, hi=1.0)

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
    max_lines: int = opt(16, "a multi-line completion stops after this many lines", lo=1, hi=1000,
                         project="at_most")
    prefix_lines: int = opt(120, "the prefix window reaches at most this far back", lo=1, hi=100_000,
                            project="at_most")
    suffix_lines: int = opt(40, "the suffix window reaches at most this far ahead", lo=0, hi=100_000,
                            project="at_most")
    suffix_share: float = opt(SUFFIX_SHARE, "share of the prompt budget for the suffix", lo=0.0, hi=0.9)
    header_share: float = opt(0.2, "share of the budget for imports and outline outside the window", lo=0.0,
                              hi=0.9)
    max_siblings: int = opt(8, "sibling definitions summarised in the header", lo=0, hi=1000, project="at_most")
    grid_lines: int = opt(GRID_LINES, "the prefix window starts on this line grid (stable KV-cache reuse)", lo=1,
                          hi=4096)
    parse_check: bool = opt(True, "trim what adds parse errors (re-parse with the candidate inserted)")
    stop_degenerate: bool = opt(True, "stop and drop degenerate output (a unit or line repeated in a row, "
                                "blank lines, the line above echoed)")
    syntax_budget_ms: float = opt(250.0, "a request's time for the syntax layer's optional checks (the header "
                                  "outside the window, the parse check); once spent they are skipped and "
                                  "--json names them in syntax_skipped; 0 skips them", lo=0.0, hi=60_000.0,
                                  project="no")


@dataclass(frozen=True)
class ClientConfig:
    """Which engine the language server talks to when it does not load models itself."""
    engine: str | None = opt(None, "an engine elsewhere instead of in-process models: ws://HOST:PORT "
                             "(completer serve), llamacpp:http://HOST:PORT (llama-server /infill), "
                             "openai:http(s)://HOST:PORT/v1 (any OpenAI-compatible /v1/completions)",
                             reload=True, trust=True, check=(lambda v: v.startswith(ENGINE_URL_SCHEMES),
                                                             "a URL starting " + ", ".join(ENGINE_URL_SCHEMES)))
    engine_api_key: str | None = opt(None, "API key for a remote engine (else env COMPLETER_API_KEY); sent only to "
                                     "the engine set in the same place", reload=True, secret=True, trust=True)
    engine_model: str | None = opt(None, "model name for an OpenAI-compatible engine (default: its first)",
                                   reload=True, trust=True)
    engine_timeout_ms: int = opt(10_000, "a remote request that takes longer fails", lo=100, hi=600_000,
                                 project="no")
    engine_retries: int = opt(2, "connection retries (with back-off) before a remote request fails", lo=0,
                              hi=10, project="no")


@dataclass(frozen=True)
class LspConfig:
    """The language server's own behaviour."""
    enable: bool = opt(True, "completions on; false answers every request empty (no restart)")
    debounce_ms: int = opt(75, "per document; a newer request cancels the older", lo=0, hi=10_000, project="no")
    warmup: bool = opt(True, "prefill the KV cache on syntax triggers while typing")
    ready_wait_ms: int = opt(30_000, "a request that arrives while the models load waits this long", lo=0,
                             hi=600_000, project="no")
    next_edit: bool = opt(True, "next-edit suggestions: the editor asks completer/nextEdit for the next change "
                          "near the cursor after an edit")
    next_edit_debounce_ms: int = opt(300, "the editor's wait after the last edit before it asks for a next edit",
                                     lo=0, hi=10_000, project="no")
    next_edit_format: str = opt("auto", "next-edit prompt format: auto (the embedded pair's own; else from the "
                                "model's name or tokenizer) or a family's", choices=("auto", *EDIT_FORMAT_NAMES))
    next_edit_rename: bool = opt(True, "carry a rename in the last edit to the other places of that name in its "
                                 "scope, from the syntax tree (when: next_edit_rename_first)")
    next_edit_rename_first: bool = opt(True, "the rename is suggested before the model is asked (milliseconds, "
                                       "exact); false: the model first, the rename where it suggests nothing usable")
    next_edit_lines_above: int = opt(3, "lines above the cursor a next edit may rewrite", lo=0, hi=1000,
                                     project="at_most")
    next_edit_lines_below: int = opt(20, "lines below the cursor a next edit may rewrite", lo=0, hi=1000,
                                     project="at_most")
    next_edit_max_lines: int = opt(40, "the most lines a next edit rewrites (the region grows to a statement's end "
                                   "within it)", lo=1, hi=1000, project="at_most")


@dataclass(frozen=True)
class ServeConfig:
    """`completer serve`: the engine service's network side."""
    host: str = opt("127.0.0.1", "address to bind; a non-loopback host needs a token", trust=True)
    port: int = opt(7421, "port (0 = any free port, printed on start)", lo=0, hi=65535,
                    project="no")  # where the service is found: the user's, as the host is
    token: str | None = opt(None, "auth token (required for a non-loopback host; env COMPLETER_TOKEN)",
                            secret=True, trust=True)
    allow_origins: tuple[str, ...] = opt((), "browser Origins allowed besides localhost pages ('*' = any)",
                                         trust=True)
    allow_hosts: tuple[str, ...] = opt((), "Host header names accepted besides IP addresses, localhost and the "
                                       "bound host (DNS rebinding guard; '*' = any)", trust=True)
    max_frame_bytes: int = opt(4 * 2**20, "larger frames get a too_large error", lo=1024, hi=1 << 30,
                               project="no")
    max_inflight: int = opt(64, "requests in flight per connection", lo=1, hi=10_000, project="no")


@dataclass(frozen=True)
class TrustConfig:
    """Which workspaces' project files may set every option (but this one); read by every command."""
    trusted_workspaces: tuple[str, ...] = opt((), "directories (absolute, ~ expands) whose .completer.toml, and "
                                              "those below them, may set the options that decide where code and "
                                              "keys go (engine, keys, models, hosts) and the bounds on memory, "
                                              "threads, sizes, time and the device", trust=True)


@dataclass(frozen=True)
class WorkspaceOptions:
    """The workspace index and cross-file context (completer/workspace)."""
    cross_file: bool = opt(True, "add definitions and snippets from other files of the workspace to the prompt")
    cross_file_share: float = opt(0.3, "share of the prompt budget for cross-file context", lo=0.0, hi=0.9)
    cross_file_max_files: int = opt(8, "other files cross-file context may draw from", lo=1, hi=100,
                                    project="at_most")
    index_memory_mb: float = opt(64.0, "the workspace index's memory bound (estimated; files beyond it are "
                                 "not indexed)", lo=1.0, hi=1 << 16, project="no")
    index_max_file_kb: int = opt(512, "larger files are not indexed", lo=1, hi=1 << 20, project="no")


SCOPES: dict[str, type] = {"engine": EngineConfig, "client": ClientConfig, "syntax": SyntaxOptions,
                           "lsp": LspConfig, "serve": ServeConfig, "trust": TrustConfig,
                           "workspace": WorkspaceOptions}


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
    if f.metadata["project"] == "at_most" and base not in (int, float):
        raise TypeError(f"{f.name}: project='at_most' needs a number")
    return Option(f.name, scope, tuple if base is tuple else base, optional, default, f.metadata)


OPTIONS: dict[str, Option] = {f.name: _option(scope, cls, f) for scope, cls in SCOPES.items() for f in fields(cls)}
TRUST_OPTIONS = tuple(n for n, o in OPTIONS.items() if o.meta["trust"])


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


class Layer(NamedTuple):
    """One source of option values. `kind` says whose it is: "user" (the user's config file),
    "project" (a `.completer.toml` that came with the code), "editor" (initializationOptions and
    settings), "cli" (flags and the environment of the command)."""
    source: str                          # what warnings and `completer config` call it
    values: Mapping[str, Any] | None
    kind: str


class Refusal(NamedTuple):
    """A value a project file set and was not used."""
    source: str   # the project file
    value: Any    # as the file gives it
    rule: str     # a key of REFUSALS, or "at_most"
    why: str      # in words: REFUSALS[rule], or for "at_most" the user's value that stays


# Why a project file's value is not used, by the rule that refused it (the warning groups by these).
REFUSALS = {
    "trust": "a project's file may not decide where your code and keys go or what runs",
    "bound": "a project's file may not set the bounds on your machine's memory, threads, sizes and time, or the "
             "device",
    "widen": "a project's file never widens trust, even a trusted one's",
}


@dataclass
class Resolved:
    """Effective values, where each came from, and the warnings the sources produced."""
    values: dict[str, Any]
    sources: dict[str, str]
    warnings: list[str]
    kinds: dict[str, str] = field(default_factory=dict)        # option → its source's Layer.kind
    refused: dict[str, Refusal] = field(default_factory=dict)  # option → what a project file set, not used
    layers: tuple[Layer, ...] = ()

    def build(self, cls: type):
        return cls(**{f.name: self.values[f.name] for f in fields(cls)})

    def engine_key(self, environ: Mapping[str, str] = os.environ) -> tuple[str | None, str | None]:
        """(the key to send to `engine`, a warning when a configured key is withheld).

        A key is sent only to the engine URL it was configured with: `engine_api_key` when it
        was set in the same place as `engine` (both on the command line, both in the editor's
        settings, both in the user file, or both in the one trusted project file); else env
        COMPLETER_API_KEY (then COMPLETER_TOKEN for a ws:// engine) when `engine` comes from the
        user's own places (command line, editor, user file), never from a project file."""
        engine = self.values.get("engine")
        if not engine:
            return None, None
        where = self.kinds.get("engine")
        if self.values.get("engine_api_key") is not None:
            if self.kinds.get("engine_api_key") == where:
                return self.values["engine_api_key"], None
            return None, (f"engine_api_key ({self.sources['engine_api_key']}) is not sent to the engine {engine} "
                          f"({self.sources['engine']}): a key goes only to the engine set beside it")
        names = ("COMPLETER_API_KEY", "COMPLETER_TOKEN") if engine.startswith(("ws://", "wss://")) else \
            ("COMPLETER_API_KEY",)
        name = next((n for n in names if env(n, environ)), None)
        if name is None:
            return None, None
        if where == "project":
            return None, (f"{name} is not sent to the engine {engine} set in {self.sources['engine']}: put "
                          "engine_api_key beside it, or set engine in your own config")
        return env(name, environ), None


def resolve(layers: Iterable[Layer], scopes: Iterable[str] = SCOPES) -> Resolved:
    """Merge sources, lowest precedence first. The `trust` scope is always read. A project layer
    outside a workspace the other layers trust sets only what its options' `project` rule allows:
    an "at_most" value above the one set so far (the user's, or the default) is refused, so the
    user's stays."""
    layers = tuple(layers)
    wanted = {*scopes, "trust"}
    known = {n: o for n, o in OPTIONS.items() if o.scope in wanted}
    values = {n: o.default for n, o in known.items()}
    sources = dict.fromkeys(known, "default")
    kinds = dict.fromkeys(known, "default")
    warnings: list[str] = []
    refused: dict[str, Refusal] = {}
    trusted = _trusted_dirs(layers)
    for layer in layers:
        source, raw = layer.source, layer.values
        untrusted = layer.kind == "project" and not _inside(Path(source).parent, trusted)
        for key, value in (raw or {}).items():
            name = str(key).replace("-", "_")
            o = known.get(name)
            if o is None:
                if name not in OPTIONS:
                    warnings.append(f"{source}: unknown option {key!r} ignored")
                elif layer.kind not in ("user", "project"):  # a shared file holds every command's options
                    warnings.append(f"{source}: option {name!r} is for {OPTIONS[name].scope} and not read here; "
                                    "ignored")
                continue
            if layer.kind == "project" and (name == "trusted_workspaces" or untrusted and o.meta["project"] == "no"):
                rule = "widen" if name == "trusted_workspaces" else "trust" if o.meta["trust"] else "bound"
                refused[name] = Refusal(source, value, rule, REFUSALS[rule])
                continue
            ok, v = coerce(o, value, values)
            if not ok:
                warnings.append(f"{source}: option {name!r} = {show(o, value)} is invalid (allowed: "
                                f"{_allowed(o, values)}); using {show(o, values[name])} ({sources[name]})")
                continue
            if untrusted and o.meta["project"] == "at_most" and v > values[name]:
                refused[name] = Refusal(source, value, "at_most", f"{v!r} is above your {values[name]!r} "
                                        f"({sources[name]}), which is used")
                continue
            values[name], sources[name], kinds[name] = v, source, layer.kind
        said = _refusal_warning(source, {n: r for n, r in refused.items() if r.source == source})
        if said:
            warnings.append(said)
    for name, o in known.items():  # bounds that depend on another option (draft_len ≤ max_draft_len)
        if isinstance(o.meta.get("hi"), str) and not coerce(o, values[name], values)[0]:
            fallback = o.default if coerce(o, o.default, values)[0] else values[o.meta["hi"]]
            warnings.append(f"{sources[name]}: option {name!r} = {values[name]!r} is invalid (allowed: "
                            f"{_allowed(o, values)}); using {fallback!r}")
            values[name], sources[name], kinds[name] = fallback, "default", "default"
    return Resolved(values, sources, warnings, kinds, refused, layers)


def _refusal_warning(source: str, refused: Mapping[str, Refusal]) -> str | None:
    """One line for what a project file set and was not used, grouped by why."""
    parts = [f"{', '.join(n for n, r in refused.items() if r.rule == rule)} not used: {why}"
             for rule, why in REFUSALS.items() if any(r.rule == rule for r in refused.values())]
    parts += [f"{n} = {r.why}" for n, r in refused.items() if r.rule == "at_most"]
    if not parts:
        return None
    hint = "" if all(r.rule == "widen" for r in refused.values()) else \
        f"; to allow them, add its directory to trusted_workspaces in {user_config_path()}"
    return f"{source}: " + "; ".join(parts) + hint


def _trusted_dirs(layers: tuple[Layer, ...]) -> list[Path]:
    """trusted_workspaces from the layers that are the user's own (a project cannot trust itself);
    the highest valid one wins, as for any option; a relative entry matches nothing (relative to
    what?) and `completer config` shows it as given."""
    o, found = OPTIONS["trusted_workspaces"], ()
    for layer in layers:
        if layer.kind != "project" and layer.values and "trusted_workspaces" in layer.values:
            ok, v = coerce(o, layer.values["trusted_workspaces"])
            found = v if ok else found
    return [_real(p) for p in (Path(d).expanduser() for d in found) if p.is_absolute()]


def _real(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, ValueError):  # a path the OS refuses matches nothing
        return p


def _inside(d: Path, trusted: list[Path]) -> bool:
    d = _real(d)
    return any(d == t or t in d.parents for t in trusted)


def check_all(obj) -> list[str]:
    """The schema's complaints about a dataclass instance built by hand."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return [f"{n}={show(OPTIONS[n], v)} is invalid (allowed: {_allowed(OPTIONS[n], values)})"
            for n, v in values.items() if n in OPTIONS and not coerce(OPTIONS[n], v, values)[0]]


def needs_reload(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Options whose change needs new models (or a new remote engine)."""
    return [n for n, o in OPTIONS.items() if o.meta.get("reload") and old.get(n, o.default) != new.get(n, o.default)]


# -- sources: CLI flags, files ------------------------------------------------------------------------
def add_arguments(ap: argparse.ArgumentParser, scopes: Iterable[str], title: str | None = None,
                  only: Iterable[str] | None = None) -> None:
    """One flag per option of `scopes` (or only of the options named); a flag not given leaves
    no attribute (so that lower sources show through in `resolve`)."""
    names = set(only) if only is not None else set(OPTIONS)
    for scope in scopes:
        g = ap.add_argument_group(title or f"{scope} options ({SCOPES[scope].__doc__.strip().rstrip('.')})")
        for o in (o for o in OPTIONS.values() if o.scope == scope and o.name in names):
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


# The environment variables completer reads: all read here (`env`), listed by `completer options`.
# (Variables we set for libraries, TOKENIZERS_PARALLELISM and the like, are not read.)
ENVIRONMENT = {
    "COMPLETER_TOKEN": "auth token of `completer serve` and the language server's TCP/WebSocket transports when "
                       "--token is not given; sent to a ws:// engine when no key is configured",
    "COMPLETER_API_KEY": "API key for a remote engine when engine_api_key is not set beside the engine",
    "XDG_CONFIG_HOME": "the user config file is $XDG_CONFIG_HOME/completer/config.toml (default ~/.config)",
    "XDG_CACHE_HOME": "the native decode step is compiled into $XDG_CACHE_HOME/completer/native (default ~/.cache)",
    "COMPLETER_NATIVE": "0 turns the native CPU decode step off (the NumPy step serves)",
    "COMPLETER_NATIVE_AMX": "0 keeps the native step's int8 products off AMX tiles (AVX-512 VNNI serves)",
    # read by kernels/ (below config in the import order, so it reads them itself; tests/test_config.py
    # checks that what it reads is listed here)
    "CXX": "the C++ compiler that builds the native decode step (default: g++, then c++ on the PATH)",
    "TRITON_INTERPRET": "1 runs the Triton kernels in Triton's interpreter (tests on machines without a GPU)",
}


def env(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The value of ENVIRONMENT's variable `name`, None when unset or empty."""
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not in config.ENVIRONMENT")
    return environ.get(name) or None


def from_args(ns: argparse.Namespace, scopes: Iterable[str] = SCOPES) -> dict[str, Any]:
    return {n: getattr(ns, n) for n, o in OPTIONS.items() if o.scope in set(scopes) and hasattr(ns, n)}


def user_config_path() -> Path:
    base = env("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "completer" / "config.toml"


PROJECT_FILE = ".completer.toml"
MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes; a larger one is not read, whatever it holds


def workspace_root(start: str | Path) -> Path:
    """The workspace root of `start`: a directory is its own (the language server's workspace
    folder, `completer serve`'s working directory); a file's is the root `completer complete`
    finds for it (completer.workspace.find_root: the nearest parent with a project marker)."""
    p = Path(start).resolve()
    if p.is_dir():
        return p
    from .workspace.files import find_root  # the one owner of the root markers

    return find_root(p)


def project_config_path(start: str | Path | None, root: str | Path | None = None) -> Path | None:
    """The `.completer.toml` that applies to `start` (a file, or a workspace root directory): the
    nearest in its directory or a parent up to the workspace root (`root`, else
    workspace_root(start)), never one above the root: that came with whatever holds the
    workspace, not with it. None when `start` is outside the root."""
    if start is None:
        return None
    p = Path(start).resolve()
    top = Path(root).resolve() if root is not None else workspace_root(p)
    d = p if p.is_dir() else p.parent
    if d != top and top not in d.parents:
        return None
    while True:
        if os.path.lexists(d / PROJECT_FILE):
            return d / PROJECT_FILE
        if d == top:
            return None
        d = d.parent


def read_toml(path: Path | None) -> tuple[dict[str, Any], list[str]]:
    """A config file's keys: top-level keys and those of a `[completer]` table (the table's win,
    with a warning, where both set one); a UTF-8 BOM is allowed; a broken file is a warning, and
    so are a file that is not a regular one (a FIFO, a device) and one over MAX_CONFIG_BYTES."""
    if path is None or not os.path.lexists(path):
        return {}, []
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        if not path.is_file():
            return {}, [f"{path}: not a regular file; ignored"]
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            return {}, [f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; ignored"]
        data = tomllib.loads(data.decode("utf-8-sig"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return {}, [f"{path}: cannot read it ({e}); ignored"]
    table = data.pop("completer", None)
    if not isinstance(table, dict):
        return data if table is None else {**data, "completer": table}, []
    both = sorted(set(data) & set(table))
    warnings = [f"{path}: {', '.join(both)} set both at the top and in [completer]; the [completer] value is used"] \
        if both else []
    return {**data, **table}, warnings


def file_layers(project_start: str | Path | None, root: str | Path | None = None) -> tuple[list[Layer], list[str]]:
    """[user file, project file] layers, lowest first, and their read warnings. The project file
    is project_config_path(project_start, root); one that resolves outside the root (a link out
    of it) is not read."""
    top = None if project_start is None else Path(root).resolve() if root is not None else workspace_root(project_start)
    project = project_config_path(project_start, top)
    layers, warnings = [], []
    if project is not None and top not in _real(project).parents:
        warnings.append(f"{project}: leads outside the workspace {top}; not read")
        project = None
    for path, kind in ((user_config_path(), "user"), (project, "project")):
        values, w = read_toml(path)
        warnings += w
        if values:
            layers.append(Layer(str(path), values, kind))
    return layers, warnings


def json_schema(scopes: Iterable[str] = SCOPES) -> dict:
    """The options as a JSON Schema (draft 2020-12); `x-scope` says which part reads each one,
    `x-trust` marks the options that decide where code and keys go (editors restrict them in an
    untrusted workspace), `x-project` what a project file may do with each (PROJECT_RULES)."""
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
        if m.get("trust"):
            p["x-trust"] = True
        p["x-project"] = m["project"]
        props[o.name] = p
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "completer options",
            "type": "object", "properties": props, "additionalProperties": False}
