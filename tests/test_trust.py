"""The trust boundary end to end: a cloned repository whose `.completer.toml` points the engine at
an attacker (a fake HTTP server on 127.0.0.1 that records every request) must not receive the
user's code or keys from the real `completer-lsp` (stdio) or `completer complete`; the refusal is
one warning. Trusting the workspace in the user's own config lets the same file choose the
engine, and then only the key set beside that engine travels, never the user's env key. Nor does
the repository set the user's bounds (threads, memory, time, the device) in the language server,
nor does a `.completer.toml` above its root apply; and `completer serve` never names an Origin it
refused in Access-Control-Allow-Origin."""
from __future__ import annotations

import http.client
import json
import os
import queue
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from completer import config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
USER_KEY = "user-secret-key-123"  # the user's env key: must never reach the attacker
SOURCE = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = add(1, 2)\n"


class Attacker:
    """An HTTP server that records (method, path, headers, body) of every request it gets."""

    def __init__(self) -> None:
        got = self.got = []

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                got.append((self.command, self.path, dict(self.headers), self.rfile.read(n).decode(errors="replace")))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker():
    a = Attacker()
    yield a
    a.close()


def hostile_workspace(tmp_path: Path, attacker: Attacker, *, key: str = "project-key") -> Path:
    ws = tmp_path / "cloned"
    ws.mkdir()
    (ws / ".git").mkdir()
    (ws / "main.py").write_text(SOURCE)
    (ws / ".completer.toml").write_text(
        f'engine = "openai:{attacker.url}/v1"\nengine_api_key = "{key}"\nmax_new_tokens = 8\n')
    return ws


def env_for(tmp_path: Path, user_config: str = "") -> dict:
    xdg = tmp_path / "xdg"
    (xdg / "completer").mkdir(parents=True, exist_ok=True)
    (xdg / "completer" / "config.toml").write_text(user_config)
    return {**os.environ, "XDG_CONFIG_HOME": str(xdg), "COMPLETER_API_KEY": USER_KEY, "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


class Lsp:
    """The real `completer-lsp` over stdio; collects window/showMessage texts."""

    def __init__(self, env: dict) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "lsp.server"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        self.inbox: queue.Queue = queue.Queue()
        self.shown: list[str] = []
        self.ids = iter(range(1, 10**6))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.p.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line or length is None:
                self.inbox.put(None)
                return
            self.inbox.put(json.loads(out.read(length)))

    def send(self, msg: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **msg}).encode()
        self.p.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.p.stdin.flush()

    def request(self, method: str, params) -> dict:
        i = next(self.ids)
        self.send({"id": i, "method": method, "params": params})
        while True:
            m = self.inbox.get(timeout=300)
            assert m is not None, "the language server exited"
            if m.get("method") == "window/showMessage":
                self.shown.append(m["params"]["message"])
            elif "method" in m and "id" in m:  # a request of the server's: accept it
                self.send({"id": m["id"], "result": None})
            elif m.get("id") == i:
                assert "error" not in m, m
                return m["result"]

    def engine_settled(self) -> dict:
        while (stats := self.request("completer/stats", {}))["engine"] in ("loading", "not loaded"):
            pass
        return stats

    def close(self) -> None:
        self.request("shutdown", None)
        self.send({"method": "exit"})
        self.p.wait(timeout=60)


def start_lsp(env: dict, ws: Path, options: dict) -> Lsp:
    lsp = Lsp(env)
    lsp.request("initialize", {"processId": None, "rootUri": ws.as_uri(), "capabilities": {},
                               "initializationOptions": options})
    lsp.send({"method": "initialized", "params": {}})
    return lsp


def complete_in(lsp: Lsp, ws: Path) -> dict:
    uri = (ws / "main.py").as_uri()
    lsp.send({"method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": uri, "languageId": "python", "version": 1, "text": SOURCE}}})
    return lsp.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 8, "character": 4}, "context": {"triggerKind": 1}})


def test_language_server_refuses_the_projects_engine(tmp_path, attacker, tiny_pair):
    target, draft = tiny_pair
    ws = hostile_workspace(tmp_path, attacker)
    lsp = start_lsp(env_for(tmp_path), ws, {"target": str(target), "draft": str(draft), "debounce_ms": 0,
                                            "device": "cpu"})
    try:
        assert lsp.engine_settled()["engine"] == "ready"  # the editor's models, in-process
        assert "items" in complete_in(lsp, ws)
        refusals = [m for m in lsp.shown if ".completer.toml" in m and "not used" in m]
        assert len(refusals) == 1 and "engine, engine_api_key" in refusals[0] and "trusted_workspaces" in refusals[0]
        assert "max_new_tokens" not in refusals[0]  # what the project may set, it still sets
    finally:
        lsp.close()
    assert attacker.got == []


def test_completer_complete_refuses_the_projects_engine(tmp_path, attacker, tiny_pair):
    target, draft = tiny_pair
    ws = hostile_workspace(tmp_path, attacker)
    r = subprocess.run([sys.executable, "-m", "completer.cli", "complete", str(ws / "main.py"), "--line", "8",
                        "--col", "4", "--json", "--target", str(target), "--draft", str(draft)],
                       capture_output=True, text=True, env=env_for(tmp_path), cwd=ROOT, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "text" in json.loads(r.stdout)
    warnings = r.stderr.strip().splitlines()
    assert len(warnings) == 1 and "engine, engine_api_key not used" in warnings[0], r.stderr
    assert attacker.got == []


def test_a_trusted_workspace_chooses_the_engine_but_gets_only_its_own_key(tmp_path, attacker):
    ws = hostile_workspace(tmp_path, attacker, key="project-key")
    lsp = start_lsp(env_for(tmp_path, f"trusted_workspaces = [{json.dumps(str(ws))}]\n"), ws,
                    {"debounce_ms": 0, "engine_retries": 0})
    try:
        lsp.engine_settled()  # fails: the fake answers 404, but it was asked
        assert not [m for m in lsp.shown if "not used" in m]
    finally:
        lsp.close()
    assert attacker.got, "a trusted workspace's engine was not used"
    auth = {h.get("Authorization") for _, _, h, _ in attacker.got}
    assert auth == {"Bearer project-key"}
    assert all(USER_KEY not in json.dumps(g) for g in attacker.got)


def test_the_env_key_goes_only_to_an_engine_the_user_set(tmp_path, attacker):
    """A trusted project's engine without a key of its own: COMPLETER_API_KEY is withheld, with a
    warning; the same engine set by the editor gets it."""
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / ".completer.toml").write_text(f'engine = "openai:{attacker.url}/v1"\n')
    env = env_for(tmp_path, f"trusted_workspaces = [{json.dumps(str(ws))}]\n")
    lsp = start_lsp(env, ws, {"debounce_ms": 0, "engine_retries": 0})
    try:
        lsp.engine_settled()
        assert any("COMPLETER_API_KEY is not sent" in m for m in lsp.shown)
    finally:
        lsp.close()
    assert attacker.got and all("Authorization" not in h for _, _, h, _ in attacker.got)

    attacker.got.clear()
    lsp = start_lsp(env, ws, {"engine": f"openai:{attacker.url}/v1", "debounce_ms": 0, "engine_retries": 0})
    try:
        lsp.engine_settled()
    finally:
        lsp.close()
    assert attacker.got and {h.get("Authorization") for _, _, h, _ in attacker.got} == {f"Bearer {USER_KEY}"}


def test_a_settings_change_of_engine_does_not_carry_the_user_files_key(tmp_path, attacker):
    """The user file pairs engine A with its key; the editor then points the engine at B: B gets
    no key (one warning), A got it."""
    other = Attacker()
    try:
        env = env_for(tmp_path, f'engine = "openai:{attacker.url}/v1"\nengine_api_key = "key-for-a"\n')
        lsp = start_lsp(env, tmp_path, {"debounce_ms": 0, "engine_retries": 0})
        try:
            lsp.engine_settled()
            lsp.send({"method": "workspace/didChangeConfiguration",
                      "params": {"settings": {"completer": {"engine": f"openai:{other.url}/v1"}}}})
            warned = lambda: any("engine_api_key" in m and "is not sent" in m for m in lsp.shown)
            for _ in range(2000):  # the reload connects, and says why the key stays, in the background
                if other.got and warned():
                    break
                lsp.engine_settled()
            assert other.got, "the editor's new engine was never asked"
            assert warned()
        finally:
            lsp.close()
        assert {h.get("Authorization") for _, _, h, _ in attacker.got} == {"Bearer key-for-a"}
        assert all("Authorization" not in h for _, _, h, _ in other.got)
    finally:
        other.close()


def test_the_language_server_takes_no_bound_from_the_project_nor_a_file_above_its_root(tmp_path):
    """Issue 35, item 10, through the real server: the options it runs with (completer/stats) keep
    the user's bounds, a size above the user's is refused, what shapes completions applies, and
    the directory holding the workspace says nothing; one message names what was refused."""
    holder = tmp_path / "holder"
    ws = holder / "ws"
    ws.mkdir(parents=True)
    (holder / ".completer.toml").write_text("complete_in_comments = true\nmax_siblings = 1\n")
    (ws / ".completer.toml").write_text('decode_threads = 256\ndevice = "cuda"\ndebounce_ms = 10000\n'
                                        "index_memory_mb = 65536\nkv_budget_mb = 65536\nmax_new_tokens = 4096\n"
                                        "max_lines = 3\n")
    lsp = start_lsp(env_for(tmp_path), ws, {"engine": "openai:http://127.0.0.1:9/v1", "engine_retries": 0})
    try:
        options = lsp.request("completer/stats", {})["options"]
    finally:
        lsp.close()
    defaults = {n: config.OPTIONS[n].default for n in ("decode_threads", "device", "debounce_ms", "index_memory_mb",
                                                       "kv_budget_mb", "max_new_tokens", "complete_in_comments",
                                                       "max_siblings")}
    assert {n: options[n] for n in defaults} == defaults
    assert options["max_lines"] == 3  # completion behaviour within the user's bounds
    said = [m for m in lsp.shown if ".completer.toml" in m]
    assert len(said) == 1 and str(ws / ".completer.toml") in said[0], lsp.shown
    assert "decode_threads, device, debounce_ms, index_memory_mb, kv_budget_mb not used" in said[0]
    assert "max_new_tokens = 4096 is above your 64 (default)" in said[0] and "trusted_workspaces" in said[0]


def test_serve_never_names_a_refused_origin_in_its_answer(tmp_path):
    """Issue 35, item 11: a 403 (a refused Origin, or a refused Host with an allowed Origin) has
    no Access-Control-Allow-Origin; an allowed page still gets its own origin back. The guard
    answers while the models load, so the test does not wait for them."""
    p = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--port", "0", "--allow-origins",
                          "https://ok.example"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env_for(tmp_path), cwd=tmp_path)
    try:
        port = None
        for line in p.stderr:
            if m := re.search(r"listening on ws://[^:]+:(\d+)/ws", line):
                port = int(m.group(1))
                break
        assert port is not None, "completer serve did not start"

        def ask(method: str, path: str, headers: dict) -> tuple[int, dict]:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                c.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
                r = c.getresponse()
                r.read()
                return r.status, {k.lower(): v for k, v in r.getheaders()}
            finally:
                c.close()

        evil = "https://evil.example"
        for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("OPTIONS", "/v1/completions"), ("GET", "/metrics")):
            status, headers = ask(method, path, {"Origin": evil, "Access-Control-Request-Method": "POST"})
            assert status == 403 and "access-control-allow-origin" not in headers, (method, path, headers)
            assert evil not in json.dumps(headers), (method, path, headers)
        status, headers = ask("GET", "/v1/models", {"Origin": "https://ok.example", "Host": "attacker.example"})
        assert status == 403 and "access-control-allow-origin" not in headers, headers
        for origin in ("https://ok.example", "http://localhost:5173"):  # allowed pages read their answers
            status, headers = ask("OPTIONS", "/v1/completions", {"Origin": origin,
                                                                 "Access-Control-Request-Method": "POST"})
            assert status == 204 and headers["access-control-allow-origin"] == origin, headers
    finally:
        p.terminate()
        p.wait(timeout=60)
