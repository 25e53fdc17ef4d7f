"""VS Code extension (editor-plugin/vscode): its TypeScript unit tests (settings mapping and
changes, switches and menu, feedback, status) under `node --test`; `vsce package` without a
warning, with the bundle, README, LICENSE and icon and nothing else; and the settings against the
option schema the CLI prints (`completer options --json-schema`), as is the Neovim plugin's option
table, so neither can drift from the server. VS Code itself cannot run here; see
editor-plugin/README.md for the manual check."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import missing

EXT = Path(__file__).resolve().parents[1] / "editor-plugin" / "vscode"
NVIM_INIT = EXT.parent / "nvim" / "lua" / "completer" / "init.lua"
COMPLETER = Path(sys.executable).parent / "completer"
LSP_SCOPES = {"engine", "client", "syntax", "lsp", "workspace"}  # what completer-lsp reads (lsp/options.py)
NPM = shutil.which("npm")


def needs_node_modules():
    """npm and the extension's node_modules: .ci/run installs both (a failure under CI=1)."""
    if NPM is None:
        missing("npm not installed")
    if not (EXT / "node_modules" / "vscode-languageclient").is_dir():
        missing("dependencies not installed: run `npm ci` in editor-plugin/vscode")


def manifest() -> dict:
    return json.loads((EXT / "package.json").read_text())


def lsp_schema() -> dict:
    """The options completer-lsp reads, from the CLI's JSON Schema."""
    r = subprocess.run([str(COMPLETER), "options", "--json-schema"], capture_output=True, text=True,
                       timeout=120, check=True)
    props = json.loads(r.stdout)["properties"]
    return {k: v for k, v in props.items() if v["x-scope"] in LSP_SCOPES}


def camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


@pytest.mark.slow
def test_extension_unit_tests_pass():
    needs_node_modules()
    r = subprocess.run([NPM, "test"], cwd=EXT, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "# fail 0" in out and "# pass 0" not in out, out[-2000:]


@pytest.mark.slow
def test_vsce_package_has_no_warnings_and_only_the_bundle(tmp_path):
    needs_node_modules()
    vsix = tmp_path / "completer.vsix"
    r = subprocess.run([shutil.which("npx"), "vsce", "package", "--out", str(vsix)], cwd=EXT,
                       capture_output=True, text=True, timeout=600, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "WARNING" not in out, out[-4000:]
    names = set(zipfile.ZipFile(vsix).namelist())
    assert names == {"[Content_Types].xml", "extension.vsixmanifest", "extension/package.json",
                     "extension/readme.md", "extension/LICENSE.txt", "extension/images/icon.png",
                     "extension/dist/extension.js"}, names
    bundle = (EXT / "dist" / "extension.js").read_text()
    # One file: the language client is inside; only the editor's module and Node's own stay outside.
    builtins = json.loads(subprocess.run(["node", "-p", "JSON.stringify(require('module').builtinModules)"],
                                         capture_output=True, text=True, check=True).stdout)
    required = set(re.findall(r'require\("([^"]+)"\)', bundle))
    assert required - set(builtins) == {"vscode"}, required
    pkg = manifest()
    assert pkg["main"] == "./dist/extension.js" and pkg["repository"] and pkg["icon"] == "images/icon.png"


def test_settings_match_the_option_schema():
    """One `completer.<camelCase>` setting per option completer-lsp reads, with its type, default
    (an unset optional string is ""), choices and bounds; `npm run gen:settings` writes them."""
    schema = lsp_schema()
    props = manifest()["contributes"]["configuration"]["properties"]
    settings = {k for k in props if not k.startswith("completer.server.")}
    assert settings == {f"completer.{camel(n)}" for n in schema}, settings ^ {f"completer.{camel(n)}" for n in schema}
    for name, s in schema.items():
        p = props[f"completer.{camel(name)}"]
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        assert p["type"] == next(t for t in types if t != "null"), name
        assert p["default"] == ("" if s["default"] is None else s["default"]), name
        for key in ("enum", "minimum", "maximum", "exclusiveMinimum"):
            want = s.get(key)
            if isinstance(want, int) and abs(want) > 2**53:  # past a JavaScript number's integers
                want = None
            assert p.get(key) == want, (name, key)


def test_untrusted_workspaces_restrict_what_the_schema_marks_trust():
    """In an untrusted workspace VS Code ignores the workspace's own value of these settings: the
    options a project's .completer.toml may not set either, and the server executable."""
    trust = manifest()["capabilities"]["untrustedWorkspaces"]
    assert trust["supported"] == "limited" and trust["description"]
    want = {f"completer.{camel(n)}" for n, s in lsp_schema().items() if s.get("x-trust")}
    assert {"completer.engine", "completer.engineApiKey", "completer.target"} <= want
    assert set(trust["restrictedConfigurations"]) == want | {"completer.server.path", "completer.server.args"}


@pytest.mark.slow
def test_generated_settings_are_up_to_date(tmp_path):
    """Running the generator on a copy changes nothing: the committed output is current."""
    if shutil.which("node") is None:
        missing("node not installed")
    copy = tmp_path / "vscode"
    for rel in ("package.json", "src/schema.json", "scripts/gen-settings.mjs"):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXT / rel, copy / rel)
    r = subprocess.run(["node", str(copy / "scripts" / "gen-settings.mjs")], capture_output=True, text=True,
                       timeout=120, check=False, env={"COMPLETER": str(COMPLETER), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    for rel in ("package.json", "src/schema.json"):
        assert (copy / rel).read_text() == (EXT / rel).read_text(), f"{rel} is stale: run npm run gen:settings"


def test_nvim_plugin_knows_every_option_with_its_type():
    schema = lsp_schema()
    table = re.search(r"M\.option_types = \{(.*?)\n\}", NVIM_INIT.read_text(), re.DOTALL).group(1)
    lua = dict(re.findall(r"(\w+) = '(\w+)'", table))
    lua_type = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}
    want = {}
    for name, s in schema.items():
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        want[name] = lua_type[next(t for t in types if t != "null")]
    assert lua == want, set(lua.items()) ^ set(want.items())
