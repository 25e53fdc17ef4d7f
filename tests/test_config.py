"""completer/config.py: reading config files (a BOM, a `[completer]` table beside top-level keys,
options of another command in a shared user file), the trust rule for project files as
`completer config` shows it, and the rule that says where a key may go."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from completer import config
from completer.config import Layer

ROOT = Path(__file__).resolve().parents[1]


def completer_config(tmp_path: Path, project_toml: bytes | str, user_toml: str = "", *args: str):
    """`completer config PROJECT --json` with a user file of its own → (effective, stderr lines)."""
    proj, user = tmp_path / "proj", tmp_path / "xdg" / "completer"
    proj.mkdir(exist_ok=True)
    user.mkdir(parents=True, exist_ok=True)
    (proj / ".completer.toml").write_bytes(project_toml if isinstance(project_toml, bytes) else project_toml.encode())
    (user / "config.toml").write_text(user_toml)
    r = subprocess.run([sys.executable, "-m", "completer.cli", "config", str(proj), "--json", *args],
                       capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
                       env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr.strip().splitlines()


def test_a_utf8_bom_is_read(tmp_path):
    eff, warnings = completer_config(tmp_path, b"\xef\xbb\xbfmax_new_tokens = 12\n")
    assert eff["max_new_tokens"]["value"] == 12 and warnings == []


def test_a_completer_table_and_top_level_keys_are_both_read(tmp_path):
    eff, warnings = completer_config(tmp_path, "max_lines = 3\ndebounce_ms = 9\n[completer]\nmax_new_tokens = 12\n"
                                               "debounce_ms = 11\n")
    assert (eff["max_lines"]["value"], eff["max_new_tokens"]["value"], eff["debounce_ms"]["value"]) == (3, 12, 11)
    assert len(warnings) == 1 and "debounce_ms set both" in warnings[0] and "[completer] value is used" in warnings[0]


def test_another_commands_option_in_a_file_is_not_unknown():
    user = Layer("user.toml", {"host": "0.0.0.0", "port": 9000, "max_inflight": 3, "debounce_ms": 5}, "user")
    r = config.resolve([user], ("engine", "client", "syntax", "lsp"))
    assert r.warnings == [] and r.values["debounce_ms"] == 5 and "host" not in r.values
    editor = Layer("initializationOptions", {"port": 9000, "nonsense": 1}, "editor")
    w = config.resolve([editor], ("lsp",)).warnings
    assert w == ["initializationOptions: option 'port' is for serve and not read here; ignored",
                 "initializationOptions: unknown option 'nonsense' ignored"]


def test_completer_config_shows_what_an_untrusted_project_may_not_set(tmp_path):
    hostile = 'engine = "openai:http://203.0.113.9/v1"\nengine_api_key = "k"\ntarget = "/tmp/m"\nhost = "0.0.0.0"\n' \
              'allow_origins = ["*"]\ntrusted_workspaces = ["/"]\nmax_new_tokens = 12\n'
    eff, warnings = completer_config(tmp_path, hostile)
    for name in ("engine", "engine_api_key", "target", "host", "allow_origins", "trusted_workspaces"):
        assert eff[name]["source"] == "default" and eff[name]["refused"]["source"].endswith(".completer.toml"), name
    assert eff["engine"]["refused"]["value"] == "openai:http://203.0.113.9/v1"
    assert eff["engine_api_key"]["refused"]["value"] is None  # a secret is never printed
    assert eff["max_new_tokens"]["value"] == 12
    assert len(warnings) == 1 and "trusted_workspaces" in warnings[0]

    trusted = f"trusted_workspaces = [{json.dumps(str(tmp_path))}]\n"  # a parent directory trusts what is below
    eff, warnings = completer_config(tmp_path, hostile, trusted)
    assert eff["engine"]["value"] == "openai:http://203.0.113.9/v1" and "refused" not in eff["engine"]
    assert eff["host"]["value"] == "0.0.0.0" and eff["trusted_workspaces"]["value"] == [str(tmp_path)]
    assert "refused" in eff["trusted_workspaces"]  # a project never widens trust, even a trusted one
    assert len(warnings) == 1 and "trusted_workspaces not used" in warnings[0]

    eff, _ = completer_config(tmp_path, hostile, 'trusted_workspaces = ["proj"]\n')  # relative: matches nothing
    assert "refused" in eff["engine"]
    eff, _ = completer_config(tmp_path, hostile, "", "--trusted-workspaces", str(tmp_path / "proj"))
    assert "refused" not in eff["engine"]


ENGINE = "openai:http://127.0.0.1:1/v1"
USER, PROJECT = Layer("user.toml", None, "user"), Layer("/w/.completer.toml", None, "project")
EDITOR, CLI = Layer("initializationOptions", None, "editor"), Layer("command line", None, "cli")


@pytest.mark.parametrize("engine_at,key_at,env,sent", [
    (USER, USER, {}, "k"),                              # set together: sent
    (EDITOR, EDITOR, {"COMPLETER_API_KEY": "e"}, "k"),  # the option beats the environment
    (EDITOR, USER, {}, None),                           # the user file's key was set for another engine
    (USER, CLI, {}, None),                              # a key from a higher place does not follow a lower engine
    (EDITOR, None, {"COMPLETER_API_KEY": "e"}, "e"),    # the env key goes to an engine the user set
    (CLI, None, {"COMPLETER_API_KEY": "e"}, "e"),
    (PROJECT, None, {"COMPLETER_API_KEY": "e"}, None),  # ... never to a (trusted) project's engine
    (PROJECT, PROJECT, {"COMPLETER_API_KEY": "e"}, "k"),
    (PROJECT, USER, {}, None),
    (USER, None, {}, None),
])
def test_a_key_goes_only_to_the_engine_it_was_set_for(engine_at, key_at, env, sent):
    layers = {engine_at.source: {"engine": ENGINE}}
    if key_at is not None:
        layers.setdefault(key_at.source, {})["engine_api_key"] = "k"
    order = [la._replace(values=layers[la.source]) for la in (USER, PROJECT, EDITOR, CLI) if la.source in layers]
    trust = Layer("trust", {"trusted_workspaces": ["/w"]}, "cli")
    r = config.resolve([trust, *order], ("client",))
    key, warning = r.engine_key(env)
    assert key == sent
    assert (warning is not None) == (sent is None and (key_at is not None or bool(env)))
    assert "k" not in (warning or "").split() and "e" not in (warning or "").split()


def test_a_ws_engine_takes_the_env_token_too():
    r = config.resolve([Layer("command line", {"engine": "ws://127.0.0.1:7421"}, "cli")], ("client",))
    assert r.engine_key({"COMPLETER_TOKEN": "t"}) == ("t", None)
    assert r.engine_key({"COMPLETER_API_KEY": "a", "COMPLETER_TOKEN": "t"}) == ("a", None)
    assert config.resolve([], ("client",)).engine_key({"COMPLETER_API_KEY": "a"}) == (None, None)  # no engine


def test_the_environment_is_read_in_config_only_and_listed():
    """Every environment variable completer reads goes through config.env (ENVIRONMENT), and
    `completer options` lists them; setting one for a library (setdefault) is not a read."""
    import ast

    root = ROOT
    reads = []
    for f in [*(root / "completer").rglob("*.py"), *(root / "lsp").rglob("*.py")]:
        if f == root / "completer" / "config.py":
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        sets = {id(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "setdefault"}
        reads += [f"{f.relative_to(root)}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") and id(n) not in sets]
    assert not reads, reads
    with pytest.raises(KeyError):
        config.env("SOME_UNLISTED")
    assert config.env("COMPLETER_TOKEN", {"COMPLETER_TOKEN": ""}) is None
    out = subprocess.run([sys.executable, "-m", "completer.cli", "options"], capture_output=True, text=True,
                         cwd=root, timeout=120, check=True).stdout
    listed = out.split("environment variables:")[1]
    assert all(name in listed for name in config.ENVIRONMENT)
