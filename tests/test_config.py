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


def run_config(tmp_path: Path, *args: str, user_toml: str = "", json_out: bool = True):
    """The real `completer config ARGS [--json]` with a user file of its own under tmp_path →
    (effective values, or the text; stderr lines)."""
    user = tmp_path / "xdg" / "completer"
    user.mkdir(parents=True, exist_ok=True)
    (user / "config.toml").write_text(user_toml)
    r = subprocess.run([sys.executable, "-m", "completer.cli", "config", *args, *(["--json"] if json_out else [])],
                       capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
                       env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout) if json_out else r.stdout, r.stderr.strip().splitlines()


def completer_config(tmp_path: Path, project_toml: bytes | str, user_toml: str = "", *args: str):
    """`completer config PROJECT --json` for a workspace root PROJECT holding `project_toml` →
    (effective, stderr lines)."""
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / ".completer.toml").write_bytes(project_toml if isinstance(project_toml, bytes) else project_toml.encode())
    return run_config(tmp_path, str(proj), *args, user_toml=user_toml)


def test_a_utf8_bom_is_read(tmp_path):
    eff, warnings = completer_config(tmp_path, b"\xef\xbb\xbfmax_new_tokens = 12\n")
    assert eff["max_new_tokens"]["value"] == 12 and warnings == []


def test_a_completer_table_and_top_level_keys_are_both_read(tmp_path):
    eff, warnings = completer_config(tmp_path, "max_lines = 3\ngrid_lines = 9\n[completer]\nmax_new_tokens = 12\n"
                                               "grid_lines = 11\n")
    assert (eff["max_lines"]["value"], eff["max_new_tokens"]["value"], eff["grid_lines"]["value"]) == (3, 12, 11)
    assert len(warnings) == 1 and "grid_lines set both" in warnings[0] and "[completer] value is used" in warnings[0]


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


# Issue 35, item 10: bounds a cloned repository's .completer.toml set, each with its measured cost
# (261 threads and 3-5x slower completions; RSS 359 -> 1 291 MB; completions off on a CPU machine;
# 10 s a completion). They are the user's: a project file sets them only in a trusted workspace.
BOUNDS = {"decode_threads": 256, "index_memory_mb": 65536, "index_max_file_kb": 1 << 20, "device": "cuda",
          "debounce_ms": 10_000, "kv_budget_mb": 1 << 20, "max_frame_bytes": 1 << 30, "max_inflight": 10_000}


@pytest.fixture(scope="module")
def bounds_set_by_a_project(tmp_path_factory):
    """`completer config` on a project file setting BOUNDS (and a size above the default), as
    JSON and as text, then with the workspace trusted."""
    tmp = tmp_path_factory.mktemp("bounds")
    toml = "".join(f"{k} = {json.dumps(v)}\n" for k, v in BOUNDS.items())
    untrusted = completer_config(tmp, toml + "max_new_tokens = 4096\nmax_lines = 3\n")
    text, _ = run_config(tmp, str(tmp / "proj"), json_out=False)
    trusted = completer_config(tmp, toml, f"trusted_workspaces = [{json.dumps(str(tmp))}]\n")
    return untrusted, text, trusted


@pytest.mark.parametrize("name", BOUNDS)
def test_a_project_file_may_not_set_a_bound(bounds_set_by_a_project, name):
    (eff, warnings), text, (trusted, trusted_warnings) = bounds_set_by_a_project
    assert config.OPTIONS[name].meta["project"] == "no"
    assert eff[name]["value"] == config.OPTIONS[name].default and eff[name]["source"] == "default"
    refused = eff[name]["refused"]
    assert refused["value"] == BOUNDS[name] and refused["rule"] == "bound" and refused["source"].endswith(".completer.toml")
    assert len(warnings) == 1, warnings  # one line for the file, naming each option
    named = warnings[0].split(".completer.toml: ", 1)[1].split(" not used: a project's file may not set the bounds")[0]
    assert name in named.split(", "), warnings[0]
    row = text.splitlines().index(next(ln for ln in text.splitlines() if ln.startswith(name + " ")))
    assert text.splitlines()[row + 1].split()[:2] == ["refused:", repr(BOUNDS[name])]  # under its option
    assert "memory, threads, sizes and time" in text.splitlines()[row + 1]
    assert trusted[name]["value"] == BOUNDS[name] and "refused" not in trusted[name], trusted[name]
    assert trusted_warnings == []


def test_a_project_file_sets_a_size_up_to_the_users_own(bounds_set_by_a_project, tmp_path):
    """An "at_most" option: a project sets it no higher than the user's value (or the default);
    a higher one is refused and said, the user's stays."""
    (eff, warnings), _, _ = bounds_set_by_a_project
    assert eff["max_new_tokens"]["value"] == 64 and eff["max_new_tokens"]["source"] == "default"
    assert eff["max_new_tokens"]["refused"]["rule"] == "at_most" and "your 64" in eff["max_new_tokens"]["refused"]["why"]
    assert "max_new_tokens = 4096 is above your 64 (default), which is used" in warnings[0]
    assert eff["max_lines"]["value"] == 3 and eff["max_lines"]["source"].endswith(".completer.toml")
    user = tmp_path / "xdg" / "completer" / "config.toml"
    eff, warnings = completer_config(tmp_path, "max_new_tokens = 200\nmax_lines = 16\n", "max_new_tokens = 256\n")
    assert eff["max_new_tokens"]["value"] == 200 and eff["max_lines"]["value"] == 16 and warnings == []
    eff, warnings = completer_config(tmp_path, "max_new_tokens = 300\n", "max_new_tokens = 256\n")
    assert eff["max_new_tokens"] == {"value": 256, "source": str(user), "refused": {
        "value": 300, "source": str(tmp_path / "proj" / ".completer.toml"), "rule": "at_most",
        "why": f"300 is above your 256 ({user}), which is used"}}


def test_what_a_project_file_may_set_is_declared_in_the_schema():
    """One flag per option (opt(project=...), `x-project` in the JSON Schema): a unit of time,
    memory or size, a thread count, the device, a queue or a trust option is the user's; "at_most"
    only on numbers; an unknown rule is an error where the option is declared."""
    schema = config.json_schema()["properties"]
    for name, o in config.OPTIONS.items():
        rule = o.meta["project"]
        assert schema[name]["x-project"] == rule and rule in config.PROJECT_RULES, name
        if (name.endswith(("_ms", "_mb", "_kb", "_bytes", "_threads", "_retries")) or o.meta["trust"]
                or name in ("device", "max_inflight", "max_queue", "max_batch")):
            assert rule == "no", name
        if rule == "at_most":
            assert o.type in (int, float) and not o.optional, name
    with pytest.raises(ValueError):
        config.opt(1, "x", project="maybe")


def project_tree(tmp_path: Path) -> Path:
    """holder/.completer.toml above a repository; repo/.completer.toml at its root (.git);
    repo/pkg/.completer.toml nearest pkg's files; repo/other has none → repo."""
    files = {"holder/.completer.toml": "max_lines = 2\ncomplete_in_comments = true\n",
             "holder/repo/.completer.toml": "max_lines = 5\n", "holder/repo/.git/HEAD": "",
             "holder/repo/pkg/.completer.toml": "max_siblings = 3\n", "holder/repo/pkg/m.py": "",
             "holder/repo/other/x.py": ""}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path / "holder" / "repo"


@pytest.mark.parametrize("target,args,want", [
    ("", (), {"max_lines": 5}),                                    # the root itself, as an editor opens it
    ("other/x.py", (), {"max_lines": 5}),                          # a file: its root found by .git
    ("pkg/m.py", (), {"max_siblings": 3}),                         # the nearest file below the root
    ("pkg", (), {"max_siblings": 3}),                              # pkg opened as the workspace
    ("other/x.py", ("--workspace", "{repo}/other"), {}),           # a root with none: repo's is above it
    ("..", (), {"max_lines": 2, "complete_in_comments": True}),    # the holder opened as the workspace
])
def test_only_a_project_file_at_or_below_the_workspace_root_applies(tmp_path, target, args, want):
    repo = project_tree(tmp_path)
    eff, warnings = run_config(tmp_path, str(repo / target), *(a.format(repo=repo) for a in args))
    got = {n: e["value"] for n, e in eff.items() if e["source"] != "default"}
    assert got == want and warnings == []


def test_a_project_file_that_is_no_file_or_leads_out_is_not_read(tmp_path):
    """A link out of the root (a repository can carry one), a FIFO (reading it would block), a file
    over 1 MiB: each is one warning and nothing of it is used."""
    (tmp_path / "outside.toml").write_text("max_lines = 2\n")
    cases = {"link": "leads outside the workspace", "fifo": "not a regular file", "huge": "larger than 1 MiB"}
    for name in cases:
        (tmp_path / name).mkdir()
    (tmp_path / "link" / ".completer.toml").symlink_to(tmp_path / "outside.toml")
    os.mkfifo(tmp_path / "fifo" / ".completer.toml")
    (tmp_path / "huge" / ".completer.toml").write_text("max_lines = 2\n" + "#" * (1 << 20))
    for name, said in cases.items():
        eff, warnings = run_config(tmp_path, str(tmp_path / name))
        assert eff["max_lines"]["source"] == "default", name
        assert len(warnings) == 1 and said in warnings[0] and ".completer.toml" in warnings[0], (name, warnings)
    (tmp_path / "link" / "inside.toml").write_text("max_lines = 4\n")  # a link within the root is fine
    (tmp_path / "link" / ".completer.toml").unlink()
    (tmp_path / "link" / ".completer.toml").symlink_to("inside.toml")
    eff, warnings = run_config(tmp_path, str(tmp_path / "link"))
    assert eff["max_lines"]["value"] == 4 and warnings == []


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
    reads, below = [], []
    for f in [*(root / "completer").rglob("*.py"), *(root / "lsp").rglob("*.py")]:
        if f == root / "completer" / "config.py":
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        sets = {id(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "setdefault"}
        reads += [f"{f.relative_to(root)}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv") and id(n) not in sets]
    assert not reads, reads
    # kernels/ and draft_models/ sit below config: they read variables themselves, only listed ones
    for f in [*(root / "kernels").rglob("*.py"), *(root / "draft_models").rglob("*.py")]:
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "getenv")
                    and "environ" in ast.unparse(n.func.value) + n.func.attr):
                name = n.args[0].value if n.args and isinstance(n.args[0], ast.Constant) else None
                below.append((f"{f.relative_to(root)}:{n.lineno}", name))
    assert below and all(name in config.ENVIRONMENT for _, name in below), below
    with pytest.raises(KeyError):
        config.env("SOME_UNLISTED")
    assert config.env("COMPLETER_TOKEN", {"COMPLETER_TOKEN": ""}) is None
    out = subprocess.run([sys.executable, "-m", "completer.cli", "options"], capture_output=True, text=True,
                         cwd=root, timeout=120, check=True).stdout
    listed = out.split("environment variables:")[1]
    assert all(name in listed for name in config.ENVIRONMENT)


def test_the_schema_names_the_next_edit_formats_without_importing_them():
    """config lists edits/formats' table by name (its choices), and importing config loads neither
    that table nor what it stands on (the embedded pair's recipe, tree-sitter): only the light
    modules beside it (the FIM table, the prompt builder)."""
    from completer.edits.formats import EDIT_FORMATS

    assert config.EDIT_FORMAT_NAMES == tuple(EDIT_FORMATS)
    code = ("import json, sys, completer.config; print(json.dumps(sorted(m for m in sys.modules "
            "if m.startswith(('completer', 'draft_models', 'tree_sitter', 'torch')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == ["completer", "completer.client", "completer.config", "completer.fim",
                                      "completer.prompt"]
