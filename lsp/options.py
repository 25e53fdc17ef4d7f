"""The language server's options: every option of the schema (completer.config) in one frozen
dataclass, read from the config files, `initializationOptions` and the `completer-lsp` flags with
the schema's precedence. An invalid or unknown option keeps the lower source's value and
produces one warning for window/showMessage."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from completer import config
from completer.config import ClientConfig, EngineConfig, LspConfig, SyntaxOptions
from completer.pipeline import CompletionOptions

SCOPES = ("engine", "client", "syntax", "lsp")


@dataclass(frozen=True)
class ServerOptions(LspConfig, SyntaxOptions, ClientConfig, EngineConfig):
    def engine_config(self) -> dict:
        """Keyword arguments for completer.pipeline.make_engine."""
        return {f.name: getattr(self, f.name) for cls in (EngineConfig, ClientConfig) for f in fields(cls)}

    def completion(self) -> CompletionOptions:
        syn = SyntaxOptions(**{f.name: getattr(self, f.name) for f in fields(SyntaxOptions)})
        return CompletionOptions(max_new_tokens=self.max_new_tokens, syntax=syn)

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_options(raw: Any, *, cli: Mapping[str, Any] | None = None,
                  root: str | Path | None = None) -> tuple[ServerOptions, list[str]]:
    """ServerOptions from initializationOptions (any JSON value) over the config files (the user
    file and the project's `.completer.toml` found from `root`), under the CLI flags; with one
    warning per option that was ignored."""
    layers, warnings = config.file_layers(root)
    if raw is not None and not isinstance(raw, dict):
        warnings.append(f"initializationOptions must be an object, not {type(raw).__name__}: ignored")
        raw = None
    r = config.resolve([*layers, ("initializationOptions", raw), ("command line", cli)], SCOPES)
    return r.build(ServerOptions), warnings + r.warnings


def update_options(current: ServerOptions, changes: Any) -> tuple[ServerOptions, list[str]]:
    """`current` with the settings of a workspace/didChangeConfiguration applied (a `completer`
    object or the flat options); invalid values keep the current ones."""
    if isinstance(changes, dict) and isinstance(changes.get("completer"), dict):
        changes = changes["completer"]
    if not isinstance(changes, dict):
        return current, [f"settings must be an object, not {type(changes).__name__}: ignored"]
    r = config.resolve([("current", current.values()), ("settings", changes)], SCOPES)
    return r.build(ServerOptions), r.warnings
