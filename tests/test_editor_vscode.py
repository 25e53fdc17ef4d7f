"""VS Code extension (editor-plugin/vscode): its TypeScript unit tests (settings mapping,
feedback, status) under `node --test`, and its settings manifest against the engine's own
defaults and choices and the language server's options (and the Neovim plugin's option table
likewise), so the settings cannot drift from the server. VS Code itself cannot run
here; see editor-plugin/README.md for the manual check."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).resolve().parents[1] / "editor-plugin" / "vscode"


def manifest_props() -> dict:
    return json.loads((EXT / "package.json").read_text())["contributes"]["configuration"]["properties"]


def test_extension_unit_tests_pass():
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm not installed")
    if not (EXT / "node_modules" / "vscode-languageclient").is_dir():
        pytest.skip("dependencies not installed: run `npm ci` in editor-plugin/vscode")
    r = subprocess.run([npm, "test"], cwd=EXT, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "# fail 0" in out and "# pass 0" not in out, out[-2000:]


def test_settings_defaults_and_choices_match_the_engine():
    from completer.config import OPTIONS, EngineConfig

    props = manifest_props()
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    camel = {"draft_len": "draftLen", "max_new_tokens": "maxNewTokens", "top_p": "topP",
             "kv_budget_mb": "kvBudgetMb"}
    for name in ("target", "draft", "device", "dtype", "quant", "drafter", "draft_len",
                 "max_new_tokens", "temperature", "top_p", "kv_budget_mb", "seed"):
        setting = props[f"completer.{camel.get(name, name)}"]
        want = "" if defaults[name] is None else defaults[name]
        assert setting["default"] == want, name
    assert tuple(props["completer.drafter"]["enum"]) == OPTIONS["drafter"].meta["choices"]
    assert props["completer.draftLen"]["maximum"] == defaults["max_draft_len"]


def test_settings_cover_every_language_server_option():
    """One setting per `initializationOptions` field of lsp/options.py, with the same default."""
    from lsp.options import ServerOptions

    props = manifest_props()
    by_option = {}
    for key, prop in props.items():
        if key.startswith("completer.server."):
            continue
        name = key.removeprefix("completer.")
        option = "".join("_" + c.lower() if c.isupper() else c for c in name)
        by_option[option] = prop
    fields = {f.name: f.default for f in dataclasses.fields(ServerOptions)}
    assert sorted(by_option) == sorted(fields)
    for name, default in fields.items():
        assert by_option[name]["default"] == ("" if default is None else default), name


def test_nvim_plugin_knows_every_language_server_option():
    import re

    from lsp.options import ServerOptions

    lua = (EXT.parent / "nvim" / "lua" / "completer" / "init.lua").read_text()
    table = re.search(r"M\.option_types = \{(.*?)\n\}", lua, re.DOTALL).group(1)
    names = set(re.findall(r"(\w+) = '", table))
    assert names == {f.name for f in dataclasses.fields(ServerOptions)}
