"""The server's jumps in Neovim (issue 39): completer/nextEdit's `jump` — the next place past the
region, here in a file that is not loaded — drawn as a virtual-text hint at the cursor's line
with the key, where it goes and what it changes there; the key opens the file at the place and
asks there at once; the next key applies that answer. A jump whose loaded target changed since
the answer is refused. Headless Neovim against a scripted language server inside the editor (a
Lua `cmd`), as test_editor_next_edit.py does, then with the real completer-lsp on a workspace;
the web editor's gutter mark: tests in editor-plugin/web/test (node) and below in Chromium."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import missing
from helpers.nvim import NVIM, PLUGIN, WHY

pytestmark = pytest.mark.slow

SCRIPT = r"""
vim.cmd('filetype on')
vim.opt.runtimepath:prepend(%(plugin)s)
vim.o.swapfile = false
vim.o.hidden = true
local failures = {}
local function check(cond, what, detail)
  if not cond then table.insert(failures, what .. (detail and (': ' .. vim.inspect(detail)) or '')) end
end
local reply, asked, versions = nil, {}, {}
local function server()
  local closing, n = false, 0
  return {
    request = function(method, params, callback)
      n = n + 1
      local result = vim.NIL
      if method == 'initialize' then
        result = { capabilities = { textDocumentSync = { openClose = true, change = 2 } } }
      elseif method == 'completer/nextEdit' then
        table.insert(asked, params)
        result = reply and reply(params) or vim.NIL
      end
      vim.schedule(function() callback(nil, result) end)
      return true, n
    end,
    notify = function(method, params)
      if method == 'textDocument/didChange' or method == 'textDocument/didOpen' then
        versions[params.textDocument.uri] = params.textDocument.version
      end
      return true
    end,
    is_closing = function() return closing end,
    terminate = function() closing = true end,
  }
end
local function edit(l1, c1, l2, c2, text)
  return { range = { start = { line = l1, character = c1 }, ['end'] = { line = l2, character = c2 } }, newText = text }
end
local function hint()
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, require('completer.next_edit').namespace, 0, -1, { details = true })) do
    if m[4].virt_text_pos == 'eol' then return { row = m[2], text = m[4].virt_text[1][1] } end
  end
end

require('completer').setup({ cmd = server })
local ne = require('completer.next_edit')
vim.cmd.edit(%(core)s)
assert(vim.wait(5000, function() return #vim.lsp.get_clients({ name = 'completer', bufnr = 0 }) > 0 end), 'attach')
local core = vim.api.nvim_get_current_buf()
local other_uri = vim.uri_from_fname(%(other)s)
local target = { uri = other_uri, range = { start = { line = 2, character = 0 }, ['end'] = { line = 2, character = 5 } },
                 edits = { edit(2, 0, 2, 5, 'fetch_all') } }
reply = function(p)
  return { id = 'j1', version = versions[p.textDocument.uri], edits = {}, jump = target, left = 2 }
end
vim.api.nvim_win_set_cursor(0, { 1, 0 })
ne.request(0)
vim.wait(2000, function() return ne.shown(0) ~= nil end)
local h = hint()
check(h and h.row == 0 and h.text == '  ⇥ <Tab> jump to other.py:3 → fetch_all  (2 left)', 'the hint', h)
check(vim.fn.bufloaded(%(other)s) == 0, 'the target is not loaded yet')

-- the key: there (the file opened, the cursor at the place), asked there at once
reply = function(p)
  return { id = 'a1', version = versions[p.textDocument.uri], edits = { edit(2, 0, 2, 5, 'fetch_all') } }
end
check(ne.accept(0) == true, 'the key takes the jump')
check(vim.api.nvim_buf_get_name(0) == %(other)s, 'the target opened in the window', vim.api.nvim_buf_get_name(0))
check(vim.deep_equal(vim.api.nvim_win_get_cursor(0), { 3, 0 }), 'the cursor at the place', vim.api.nvim_win_get_cursor(0))
vim.wait(3000, function() return ne.shown(0) ~= nil end)
check(asked[#asked].textDocument.uri == other_uri and asked[#asked].position.line == 2, 'asked at the place', asked[#asked])
reply = nil
check(ne.accept(0) == true, 'the key applies')
check(vim.api.nvim_buf_get_lines(0, 2, 3, false)[1] == 'fetch_all(1)', 'applied there', vim.api.nvim_buf_get_lines(0, 0, -1, false))
check(ne.counters.jumps == 1, 'one jump', ne.counters)

-- a jump whose loaded target changed since the answer: refused, nothing moves
vim.api.nvim_set_current_buf(core)
local stale_target = vim.deepcopy(target)
stale_target.version = versions[other_uri] - 1
reply = function(p) return { id = 'j2', version = versions[p.textDocument.uri], edits = {}, jump = stale_target } end
ne.request(0)
vim.wait(2000, function() return ne.shown(0) ~= nil end)
local stale = ne.counters.stale
check(ne.accept(0) == true and vim.api.nvim_get_current_buf() == core and ne.counters.stale == stale + 1,
  'a stale jump is refused', ne.counters)

for _, f in ipairs(failures) do io.stdout:write('FAIL ' .. f .. '\n') end
io.stdout:write('done\n')
vim.cmd('qa!')
"""


def test_nvim_jump_hint_go_and_apply_and_a_stale_target(tmp_path):
    if NVIM is None:
        missing(WHY)
    core, other = tmp_path / "core.py", tmp_path / "other.py"
    core.write_text("def fetch_all(x):\n    return x\n")
    other.write_text("from core import fetch\n\nfetch(1)\n")
    script = tmp_path / "jump.lua"
    script.write_text(SCRIPT % {"plugin": json.dumps(str(PLUGIN)), "core": json.dumps(str(core)),
                                "other": json.dumps(str(other))})
    r = subprocess.run([NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-l", str(script)],
                       capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "done" in out and "FAIL" not in out, out


# -- the web editor ------------------------------------------------------------------------------
WEB_TEXT = "def fetch_all(url):\n    return url\n\n\n\n\nx = fetch(1)\n"
JUMP = {"start_line": 6, "start_col": 4, "end_line": 6, "end_col": 9,
        "edits": [{"start_line": 6, "start_col": 4, "end_line": 6, "end_col": 9, "text": "fetch_all"}]}


@pytest.fixture
def jump_server():
    """A /ws server answering each next_edit with no edits in the region and a jump (beside
    `edits`, as `completer serve`'s frame has it), then nothing."""
    import threading

    import msgpack
    from websockets.sync.server import serve

    replies = [{"edits": [], "jump": JUMP, "stats": {"source": "rename"}}]

    def handler(ws):
        for message in ws:
            f = msgpack.unpackb(message)
            if f["type"] == "hello":
                ws.send(msgpack.packb({"type": "hello", "server": "scripted", "version": "0", "ready": True,
                                       "model": {"target": "script"}}))
            elif f["type"] == "complete":
                ws.send(msgpack.packb({"type": "done", "id": f["id"], "text": "", "cancelled": False, "stats": {}}))
            elif f["type"] == "next_edit":
                r = replies.pop(0) if replies else {"edits": [], "stats": {}}
                ws.send(msgpack.packb({"type": "next_edit", "id": f["id"], **r}))

    with serve(handler, "127.0.0.1", 0) as server:
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/ws"
        server.shutdown()
        t.join(timeout=10)


def test_web_jump_gutter_mark_tab_to_go_and_tab_to_apply(chromium, static_site, jump_server):
    from urllib.parse import quote

    from helpers import wait_for
    from helpers.web import page_state

    cdp = chromium
    cdp.call("Page.enable")
    cdp.call("Page.navigate", url=f"{static_site}/index.html?ws={quote(jump_server, safe='')}")
    wait_for(lambda: page_state(cdp)["state"] == "ready", 60, "the page to connect", detail=lambda: page_state(cdp))
    cdp.js(f"""(() => {{ const v = window.completerView; v.focus();
      v.dispatch({{ changes: {{ from: 0, to: v.state.doc.length, insert: {json.dumps(WEB_TEXT)} }}, userEvent: 'set' }});
      v.dispatch({{ selection: {{ anchor: 4 }} }}); }})()""")
    cdp.type("x", delay=0)  # an edit: the page asks (the scripted answer is the jump)
    probe = """(() => ({ shown: document.body.dataset.nextEdit,
      mark: [...document.querySelectorAll('.cm-next-jump-gutter .cm-gutterElement')].filter((e) => e.textContent === '⇥' && e.style.visibility !== 'hidden')
              .map((e) => e.getBoundingClientRect().top),
      line7: [...document.querySelectorAll('.cm-line')][6].getBoundingClientRect().top,
      hint: (document.querySelector('.cm-next-jump') || {}).textContent || '',
      struck: [...document.querySelectorAll('.cm-next-delete')].map((e) => e.textContent),
      value: window.completerView.state.doc.toString(), cursor: window.completerView.state.selection.main.head }))()"""
    s = wait_for(lambda: (p := cdp.js(probe))["shown"] == "shown" and p, 30, "the jump shown", detail=lambda: cdp.js(probe))
    assert len(s["mark"]) == 1 and abs(s["mark"][0] - s["line7"]) < 3, s  # the gutter mark on the jump's line
    assert s["hint"] == "⇥ Tab to jump: line 7 → fetch_all" and s["struck"] == [], s
    value = s["value"]
    cdp.key("Tab", "Tab", 9)
    s = wait_for(lambda: (p := cdp.js(probe))["struck"] and p, 10, "Tab: there, its edit shown", detail=lambda: cdp.js(probe))
    assert s["cursor"] == value.index("fetch(1)") and s["value"] == value and s["struck"] == ["fetch"], s
    cdp.key("Tab", "Tab", 9)
    s = wait_for(lambda: (p := cdp.js(probe))["value"] != value and p, 10, "Tab again: applied")
    assert s["value"] == value.replace("fetch(1)", "fetch_all(1)"), s


# -- Neovim and the real completer-lsp ------------------------------------------------------------
def test_nvim_a_rename_followed_into_a_closed_file_with_the_real_server(tmp_path):
    """Neovim on a workspace (pyproject.toml) with the real completer-lsp: `fetch` renamed at its
    def; a jump down the file, then into app.py, which is not loaded; Tab there, Tab to apply,
    each time; app.py ends up renamed in its buffer (unsaved), the file on disk untouched."""
    from helpers.nvim import Nvim, lsp_cmd, next_edit_state, wait_ready

    if NVIM is None:
        missing(WHY)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    core = tmp_path / "core.py"
    core.write_text("def fetch(url):\n    return url\n" + "# pad\n" * 40 + "fetch('a')\n")
    app = "from core import fetch\n\nfetch('b')\n"
    (tmp_path / "app.py").write_text(app)
    nv = Nvim(tmp_path, lsp_cmd(), {"device": "cpu"}, core)
    try:
        wait_ready(nv)
        nv.wait(lambda: (nv.lua("T.server_stats()").get("stats") or {}).get("workspace", {}).get("complete"), 60,
                "the workspace indexed")
        nv.send("1G^wciwfetch_all<Esc>")
        st = nv.wait(lambda: (s := next_edit_state(nv))["hints"] and s, 30, "the jump's hint")
        assert st["hints"] == ["  ⇥ <Tab> jump to 43 → fetch_all  (3 left)"], st
        nv.send("<Tab>")  # there
        st = nv.wait(lambda: (s := next_edit_state(nv))["row"] == 43 and s["shown"] and s, 30, "at line 43, its edit shown")
        nv.send("<Tab>")  # applied; the next answer: a jump into app.py
        st = nv.wait(lambda: (s := next_edit_state(nv))["hints"] and "app.py" in s["hints"][0] and s, 30, "the jump to app.py")
        assert st["hints"] == ["  ⇥ <Tab> jump to app.py:1 → fetch_all  (2 left)"], st
        assert nv.buffer().endswith("fetch_all('a')")
        nv.send("<Tab>")  # app.py opened at its import
        st = nv.wait(lambda: (s := next_edit_state(nv))["name"] == "app.py" and s["shown"] and s, 30, "app.py, its edits shown")
        nv.send("<Tab>")
        nv.wait(lambda: nv.buffer() == app.replace("fetch", "fetch_all").rstrip("\n"), 30, "app.py renamed")
        assert (tmp_path / "app.py").read_text() == app, "the buffer, not the file on disk"
    finally:
        nv.close()
        log = (tmp_path / "nvim.log").read_text(errors="replace")
        if log.strip():
            print("--- nvim output ---\n" + log[-4000:])
