"""The web editor (editor-plugin/web) driven from outside: headless Chromium over the DevTools
protocol, the page's folder over HTTP after `npm run build`, a real `completer serve` for it to
talk to, and the page's state as the tests read it. Used by the editor tests and docs/img/make.py."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from . import ROOT, free_port, http_ok, missing, wait_for

WEB = ROOT / "editor-plugin" / "web"
VENV_BIN = Path(sys.executable).parent
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
NODE = shutil.which("node")


def needs_node_modules():
    if NODE is None or shutil.which("npm") is None:
        missing("node/npm not installed")
    if not (WEB / "node_modules" / "@codemirror" / "view").is_dir():
        missing("dependencies not installed: run `npm ci` in editor-plugin/web")


class Cdp:
    """A minimal DevTools-protocol client over the `websockets` sync API."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect

        self._conn = connect(ws_url, max_size=None, open_timeout=30)
        self.ws = self._conn.__enter__()
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def key(self, key: str, code: str, vk: int, text: str = "", modifiers: int = 0):
        base = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
        self.call("Input.dispatchKeyEvent", type="keyDown", text=text, **base)
        self.call("Input.dispatchKeyEvent", type="keyUp", **base)

    def type(self, text: str, delay: float = 0.03):
        """Keystroke by keystroke, so the page sees typing continue while requests run."""
        for ch in text:
            if ch == "\n":
                self.key("Enter", "Enter", 13, text="\r")
            else:
                self.call("Input.insertText", text=ch)
            time.sleep(delay)

    def close(self):
        self._conn.__exit__(None, None, None)


@contextlib.contextmanager
def chromium_page(profile: Path):
    """Headless Chromium with a fresh profile → a DevTools client on its page."""
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
         "--disable-default-apps", "--mute-audio", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1100,760", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60, "chromium DevTools port",
                 proc=proc)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        cdp = Cdp(page["webSocketDebuggerUrl"])
        yield cdp
        cdp.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def page_site():
    """The page's folder over HTTP, after `npm run build` (esbuild: dist/editor.js) → its base URL."""
    r = subprocess.run(["npm", "run", "build"], cwd=WEB, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(WEB)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_ok(base + "/index.html"), 30, "the static server", proc=proc)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def serve_pair(tmp_path: Path, target: Path, draft: Path):
    """A real `completer serve` on the pair → its /ws URL."""
    port = free_port()
    exe = VENV_BIN / "completer"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "completer.cli"]
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        cmd + ["serve", "--host", "127.0.0.1", "--port", str(port), "--target", str(target),
               "--draft", str(draft), "--max-new-tokens", "16"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 120, "completer serve /health",
                 step=0.25, proc=proc)
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        print("--- completer serve log (tail) ---\n" + (tmp_path / "serve.log").read_text()[-3000:])


def page_state(cdp: Cdp) -> dict:
    return cdp.js("""(() => {
      const v = window.completerView, g = document.querySelector('.cm-ghost');
      if (!v) return { state: 'loading', ghost: '', value: '', latency: '', done: '', errors: [] };
      return { state: document.body.dataset.state, ghost: g ? g.textContent : '',
               value: v.state.doc.toString(), cursor: v.state.selection.main.head,
               latency: document.getElementById('latency').textContent,
               done: document.getElementById('latency').dataset.request || '',
               errors: [...document.querySelectorAll('#errors li')].map((li) => li.textContent),
               status: document.getElementById('status').textContent };
    })()""")


def wait_ghost(cdp: Cdp, done_before: str) -> dict:
    """A ghost text and the done frame of a newer request than `done_before`'s (by request id:
    two requests' timings can print the same latency line)."""
    def finished():
        s = page_state(cdp)
        return s if s["ghost"].strip() and "page:" in s["latency"] and s["done"] != done_before else None
    s = wait_for(finished, 60, "a streamed ghost text and its done frame", step=0.2, detail=lambda: page_state(cdp))
    assert s["errors"] == [], s["errors"]
    assert "TTFT" in s["latency"] and re.search(r"first text \d+ ms", s["latency"]), s["latency"]
    return s


def next_edit_state(cdp: Cdp) -> dict:
    """The page's next-edit suggestion: shown, the gutter marks' tops, the hint at the cursor's
    line, the struck-through text of the edits shown, the document and the cursor."""
    return cdp.js("""(() => ({ shown: document.body.dataset.nextEdit,
      mark: [...document.querySelectorAll('.cm-next-jump-gutter .cm-gutterElement')]
              .filter((e) => e.textContent === '⇥' && e.style.visibility !== 'hidden')
              .map((e) => e.getBoundingClientRect().top),
      hint: (document.querySelector('.cm-next-jump') || {}).textContent || '',
      struck: [...document.querySelectorAll('.cm-next-delete')].map((e) => e.textContent),
      value: window.completerView.state.doc.toString(), cursor: window.completerView.state.selection.main.head }))()""")
