"""The language server's options: every option of the schema (completer.config) in one frozen
dataclass, read from the config files, `initializationOptions`, later settings and the
`completer-lsp` flags with the schema's precedence and trust rule (a project file does not
choose the engine, models or keys). An invalid or unknown option keeps the lower source's value
and produces one warning for window/showMessage."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from completer import config
from completer.config import (
    ClientConfig,
    EngineConfig,
    Layer,
    LspConfig,
    Resolved,
    SyntaxOptions,
    WorkspaceOptions,
)
from completer.pipeline import CompletionOptions

SCOPES = ("engine", "client", "syntax", "lsp", "workspace")


@dataclass(frozen=True)
class ServerOptions(WorkspaceOptions, LspConfig, SyntaxOptions, ClientConfig, EngineConfig):
    # The sources these values came from: a settings change is resolved over them again (the
    # command line stays on top), and they say whether the key may go to the engine.
    resolved: Resolved | None = field(default=None, compare=False, repr=False)

    def engine_config(self) -> dict:
        """Keyword arguments for completer.pipeline.make_engine; `engine_api_key` is the key to
        send, decided by the trust rule (config.Resolved.engine_key), not the option as set."""
        kw = {f.name: getattr(self, f.name) for cls in (EngineConfig, ClientConfig) for f in fields(cls)}
        kw["engine_api_key"] = self.resolved.engine_key()[0] if self.resolved is not None else None
        return kw

    def completion(self) -> CompletionOptions:
        syn = SyntaxOptions(**{f.name: getattr(self, f.name) for f in fields(SyntaxOptions)})
        return CompletionOptions(max_new_tokens=self.max_new_tokens, syntax=syn)

    def workspace(self) -> WorkspaceOptions:
        return WorkspaceOptions(**{f.name: getattr(self, f.name) for f in fields(WorkspaceOptions)})

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in config.OPTIONS}


def _build(r: Resolved) -> tuple[ServerOptions, list[str]]:
    opts = ServerOptions(**{f.name: r.values[f.name] for f in fields(ServerOptions) if f.name in config.OPTIONS},
                         resolved=r)
    withheld = r.engine_key()[1]
    return opts, r.warnings + ([withheld] if withheld else [])


def parse_options(raw: Any, *, cli: Mapping[str, Any] | None = None,
                  root: str | Path | None = None) -> tuple[ServerOptions, list[str]]:
    """ServerOptions from initializationOptions (any JSON value) over the config files (the user
    file and the project's `.completer.toml` found from `root`), under the CLI flags; with one
    warning per option that was ignored (one per project file for the options it may not set)."""
    layers, warnings = config.file_layers(root)
    if raw is not None and not isinstance(raw, dict):
        warnings.append(f"initializationOptions must be an object, not {type(raw).__name__}: ignored")
        raw = None
    opts, more = _build(config.resolve([*layers, Layer("initializationOptions", raw, "editor"),
                                        Layer("command line", cli, "cli")], SCOPES))
    return opts, warnings + more


def update_options(current: ServerOptions, changes: Any) -> tuple[ServerOptions, list[str]]:
    """`current` with the settings of a workspace/didChangeConfiguration applied (a `completer`
    object or the flat options, only those that changed); invalid values keep the current ones.
    Settings rank with initializationOptions (both are the editor's), under the command line."""
    if isinstance(changes, dict) and isinstance(changes.get("completer"), dict):
        changes = changes["completer"]
    if not isinstance(changes, dict):
        return current, [f"settings must be an object, not {type(changes).__name__}: ignored"]
    before = current.resolved or config.resolve([Layer("current", current.values(), "editor")], SCOPES)
    below = [la for la in before.layers if la.kind != "cli" and la.source != "settings"]
    # the settings that won so far: valid values only, so an invalid change falls back to them
    settled = {n: v for n, v in before.values.items() if before.sources[n] == "settings"}
    top = [la for la in before.layers if la.kind == "cli"]
    r = config.resolve([*below, Layer("settings", settled, "editor"), Layer("settings", changes, "editor"), *top],
                       SCOPES)
    settings = {n: v for n, v in r.values.items() if r.sources[n] == "settings"}
    r.layers = (*below, Layer("settings", settings, "editor"), *top)
    opts, warnings = _build(r)
    said = {*before.warnings, before.engine_key()[1]}  # the files' warnings were shown at the start
    return opts, [w for w in warnings if w.startswith("settings:") or w not in said]
