"""Next-edit suggestions in the editors (issue 24 item 5): Neovim and the web editor.

Neovim, first against a scripted language server inside the editor (a Lua `cmd` function: no
model, exact replies): the extmarks drawn for removed, inserted and multi-line text (UTF-16
columns past multi-byte characters), Tab applying with the cursor after the edit, a jump to an
edit outside the window, Esc, stale replies and stale suggestions, the feedback sent. Then end to end with the real `completer-lsp` and the edit
parrot (test_editor_parrot.py): rename a variable, the suggestion to carry it to the next line
appears, Tab applies it; a suggestion whose buffer changed before Tab is not applied.

The web editor in headless Chromium (test_editor_web.py's helpers) against a real `completer
serve` on the edit parrot: the same rename, the suggestion drawn (struck-through and inserted
text), Tab applies it; Esc dismisses one and typing drops one; and against a scripted /ws
server, a reply that arrives after the text changed is never shown."""
from __future__ import annotations

import json
import subprocess
import threading
from urllib.parse import quote

import msgpack
import pytest
from helpers import missing, wait_for
from helpers.nvim import NVIM, PLUGIN, WHY, Nvim, lsp_cmd, wait_ready
from helpers.parrot import EDIT_AFTER, EDIT_BEFORE, EDIT_EXPECTED
from helpers.web import page_state, serve_pair

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _nvim_installed():
    if NVIM is None:
        missing(WHY)


SCRIPTED = r"""
vim.cmd('filetype on')
vim.opt.runtimepath:prepend(%(plugin)s)
vim.o.swapfile = false
local failures = {}
local function check(cond, what, detail)
  if not cond then table.insert(failures, what .. (detail and (': ' .. vim.inspect(detail)) or '')) end
end
-- A language server inside the editor: answers completer/nextEdit with whatever `reply` says,
-- on the document version it last saw (or the version `reply` names), records notifications.
local notes, reply, seen_version = {}, nil, 0
local function server()
  local closing, n = false, 0
  return {
    request = function(method, params, callback)
      n = n + 1
      local result = vim.NIL
      if method == 'initialize' then
        result = { capabilities = { textDocumentSync = { openClose = true, change = 2 } } }
      elseif method == 'completer/nextEdit' then
        result = reply and reply(params) or vim.NIL
      elseif method == 'completer/stats' then
        result = { engine = 'ready' }
      end
      vim.schedule(function() callback(nil, result) end)
      return true, n
    end,
    notify = function(method, params)
      if method == 'textDocument/didChange' or method == 'textDocument/didOpen' then
        seen_version = params.textDocument.version
      end
      table.insert(notes, { method = method, params = params })
      return true
    end,
    is_closing = function() return closing end,
    terminate = function() closing = true end,
  }
end
local function edit(l1, c1, l2, c2, text)
  return { range = { start = { line = l1, character = c1 }, ['end'] = { line = l2, character = c2 } }, newText = text }
end
local function answer(id, edits, version)
  reply = function() return { id = id, version = version or seen_version, edits = edits } end
end
local function feedback()
  for i = #notes, 1, -1 do
    if notes[i].method == 'completer/feedback' then return notes[i].params end
  end
end
local function marks()
  local out = {}
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, require('completer.next_edit').namespace, 0, -1, { details = true })) do
    local d = m[4]
    local lines = {}
    for _, vl in ipairs(d.virt_lines or {}) do table.insert(lines, vl[1][1]) end
    table.insert(out, { row = m[2], col = m[3], end_row = d.end_row, end_col = d.end_col, hl = d.hl_group,
                        text = d.virt_text and d.virt_text[1][1], pos = d.virt_text_pos, lines = lines,
                        above = d.virt_lines_above })
  end
  return out
end
local function lines() return vim.api.nvim_buf_get_lines(0, 0, -1, false) end

require('completer').setup({ cmd = server })
local ne = require('completer.next_edit')
vim.cmd.edit(%(file)s)
assert(vim.wait(5000, function() return #vim.lsp.get_clients({ name = 'completer', bufnr = 0 }) > 0 end), 'attach')
local DOC = { 'def area(width, height):', '    total = width * height', '    return size', '' }
local function ask()
  local before = ne.counters.requests
  ne.request(0)
  check(ne.counters.requests == before + 1, 'a request was sent')
  vim.wait(2000, function() return ne.shown(0) ~= nil end)
  vim.wait(50) -- a late second reply would land here
end

-- 1. a replacement: old text struck through, the new text inline after it; Tab applies it.
vim.api.nvim_buf_set_lines(0, 0, -1, false, DOC)
answer('e1', { edit(2, 11, 2, 15, 'total') })
ask()
local m = marks()
check(#m == 2, 'two extmarks', m)
check(m[1] and m[1].hl == 'CompleterEditDelete' and m[1].row == 2 and m[1].col == 11 and m[1].end_col == 15,
  'size struck through', m[1])
check(m[2] and m[2].text == 'total' and m[2].pos == 'inline' and m[2].col == 15, 'total drawn after it', m[2])
local hl = vim.api.nvim_get_hl(0, { name = 'CompleterEditDelete' })
check(hl.strikethrough == true, 'CompleterEditDelete strikes through', hl)
answer('e2', {}) -- the chained request after the apply: nothing more
check(ne.accept(0) == true, 'accept applies')
check(vim.deep_equal(lines(), { 'def area(width, height):', '    total = width * height', '    return total', '' }),
  'the buffer after Tab', lines())
check(vim.api.nvim_win_get_cursor(0)[1] == 3, 'the cursor on the edited line')
check(vim.deep_equal(feedback(), { id = 'e1', kind = 'nextEdit', accepted = true }), 'accepted feedback', feedback())
check(#marks() == 0, 'nothing drawn after the apply')
vim.wait(1000, function() return ne.counters.requests == 2 end)
check(ne.counters.requests == 2, 'the apply asked for the next edit at once', ne.counters)

-- 1b. columns are the client's offset encoding (UTF-16 here): past multi-byte characters the
--     extmarks and the apply land on the same text.
vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'x = "é😀" + size', '' })
answer('u1', { edit(0, 12, 0, 16, 'total') })
ask()
m = marks()
check(m[1] and m[1].col == 15 and m[1].end_col == 19 and m[2] and m[2].col == 19, 'byte columns of UTF-16 positions', m)
answer('u2', {})
ne.accept(0)
check(lines()[1] == 'x = "é😀" + total', 'applied in UTF-16 columns', lines())
vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'def area(width, height):', '    total = width * height',
  '    return total', '' })

-- 2. whole lines inserted: virt_lines above the line they go before; Esc (dismiss) drops them.
answer('e3', { edit(2, 0, 2, 0, '    print(total)\n    print(width)\n') })
ask()
m = marks()
check(#m == 1 and vim.deep_equal(m[1].lines, { '    print(total)', '    print(width)' }) and m[1].above and m[1].row == 2,
  'inserted lines as virt_lines', m)
check(ne.dismiss(0) == true and #marks() == 0, 'dismissed')
check(vim.deep_equal(feedback(), { id = 'e3', kind = 'nextEdit', accepted = false }), 'rejected feedback')
check(ne.dismiss(0) == false and ne.accept(0) == false, 'nothing left: the keys fall through')

-- 3. a reply computed on an older version is not shown.
local stale = ne.counters.stale
answer('e4', { edit(0, 0, 0, 3, 'async def') }, seen_version - 1)
ne.request(0)
vim.wait(300, function() return ne.shown(0) ~= nil end)
check(ne.shown(0) == nil and ne.counters.stale == stale + 1, 'a stale reply is dropped', ne.counters)

-- 4. a suggestion whose buffer changed before Tab is not applied (the change event has not
--    reached the plugin yet: only the version says so).
answer('e5', { edit(2, 11, 2, 16, 'area_') })
ask()
check(ne.shown(0) ~= nil, 'shown before the change')
vim.api.nvim_buf_set_lines(0, 0, 1, false, { 'def area(w, h):' })
local before_tab = lines()
check(ne.accept(0) == true, 'Tab takes the stale suggestion (and drops it)')
check(vim.deep_equal(lines(), before_tab), 'the stale suggestion did not change the buffer', lines())
check(vim.deep_equal(feedback(), { id = 'e5', kind = 'nextEdit', accepted = false }), 'a stale one is rejected')

-- 5. an edit outside the window: announced at the cursor; the first Tab jumps, the second applies.
local long = {}
for i = 1, 200 do long[i] = ('x%%d = %%d'):format(i, i) end
vim.api.nvim_buf_set_lines(0, 0, -1, false, long)
vim.api.nvim_win_set_cursor(0, { 1, 0 })
answer('e6', { edit(149, 0, 149, 4, 'y150') })
ask()
m = marks()
local hint = vim.tbl_filter(function(x) return x.pos == 'eol' end, m)[1]
check(hint and hint.row == 0 and hint.text:match('line 150'), 'the far edit announced on the cursor line', m)
check(ne.accept(0) == true and vim.api.nvim_win_get_cursor(0)[1] == 150 and lines()[150] == 'x150 = 150',
  'the first Tab jumps there', vim.api.nvim_win_get_cursor(0))
answer('e7', {})
check(ne.accept(0) == true and lines()[150] == 'y150 = 150', 'the second Tab applies', lines()[150])

-- 6. a malformed reply is refused with a warning, not drawn.
answer('e8', { { range = { start = { line = 3 } }, newText = 'x' } })
ne.request(0)
vim.wait(300)
check(ne.shown(0) == nil and #marks() == 0, 'a malformed reply is not shown')

-- 6b. <Esc> in insert mode (next_edit_dismiss) dismisses a suggestion shown while typing, and
--     ends insert mode as the key does: with a count the insert is repeated.
vim.api.nvim_buf_set_lines(0, 0, -1, false, DOC)
answer('e9', { edit(2, 11, 2, 15, 'total') })
_G.ask_typing = function()
  ask()
  check(vim.api.nvim_get_mode().mode == 'i' and ne.shown(0) ~= nil, 'shown in insert mode', vim.api.nvim_get_mode())
end
vim.api.nvim_feedkeys(vim.keycode('A<Cmd>lua ask_typing()<CR><Esc>'), 'xt', false)
check(vim.api.nvim_get_mode().mode == 'n' and ne.shown(0) == nil and #marks() == 0, '<Esc> dismissed and left insert mode',
  { mode = vim.api.nvim_get_mode(), marks = marks() })
check(vim.deep_equal(feedback(), { id = 'e9', kind = 'nextEdit', accepted = false }), '<Esc> rejects', feedback())
reply = nil
local rejected = ne.counters.rejected
vim.api.nvim_buf_set_lines(0, 0, -1, false, { '' })
vim.api.nvim_feedkeys(vim.keycode('3ia<Esc>'), 'xt', false)
check(lines()[1] == 'aaa' and vim.api.nvim_get_mode().mode == 'n', '3ia<Esc> repeats the insert', lines())
check(ne.counters.rejected == rejected, 'nothing shown: nothing rejected', ne.counters)

-- 7. :checkhealth completer reports next edits with this session's counts and the next-edit keys.
vim.cmd('checkhealth completer')
local report = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\n')
check(report:find('OK on: asked 300 ms after the last change; %%d+ asked, %%d+ shown, 3 accepted') ~= nil
  and report:find('OK <Tab> (next_edit_accept, normal mode)', 1, true) ~= nil
  and report:find('OK <Esc> (next_edit_dismiss, insert mode): then it does what it did: the key itself', 1, true) ~= nil,
  'checkhealth', report)

for _, f in ipairs(failures) do io.stdout:write('FAIL ' .. f .. '\n') end
io.stdout:write('done\n')
vim.cmd('qa!')
"""


def test_nvim_next_edit_with_a_scripted_server(tmp_path):
    src = tmp_path / "demo.py"
    src.write_text("x = 1\n")
    script = tmp_path / "next_edit.lua"
    script.write_text(SCRIPTED % {"plugin": json.dumps(str(PLUGIN)), "file": json.dumps(str(src))})
    r = subprocess.run([NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-l", str(script)],
                       capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "done" in out and "FAIL" not in out, out


# Probes read with --remote-expr (JSON strings): the next-edit extmarks and the plugin's counters.
MARKS = ("(function() local ne = require('completer.next_edit'); local out = {}; "
         "for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ne.namespace, 0, -1, { details = true })) do "
         "local d = m[4]; table.insert(out, { row = m[2], col = m[3], end_col = d.end_col, hl = d.hl_group, "
         "text = d.virt_text and d.virt_text[1][1] }) end; return vim.json.encode(out) end)()")
COUNTERS = "vim.json.encode(require('completer.next_edit').counters)"


@pytest.fixture
def rename_session(tmp_path, edit_parrot_pair):
    """Neovim on EDIT_BEFORE with the real completer-lsp on the edit parrot; the user renames
    `size` on line 2 to `total` (in insert mode, where the next edit then shows)."""
    target, draft = edit_parrot_pair
    src = tmp_path / "demo.py"
    src.write_text(EDIT_BEFORE)
    # the parrot's answer, not the rename rule's (the same text): the model's path end to end
    nv = Nvim(tmp_path, lsp_cmd(), {"target": str(target), "draft": str(draft), "next_edit_rename_first": False}, src)
    try:
        wait_ready(nv)
        nv.send("2G^ciwtotal")
        yield nv
    finally:
        nv.close()
        log = (tmp_path / "nvim.log").read_text(errors="replace")
        if log.strip():
            print("--- nvim output ---\n" + log[-4000:])


def shown_marks(nv: Nvim) -> list[dict]:
    return nv.wait(lambda: nv.lua(MARKS), 60, "the next-edit suggestion's extmarks", step=0.2)


def test_nvim_rename_is_carried_to_the_next_line_and_tab_applies_it(rename_session):
    nv = rename_session
    assert nv.buffer() == EDIT_AFTER.rstrip("\n")
    marks = shown_marks(nv)
    # `size` on line 3 struck through, `total` drawn after it
    assert [(m["row"], m["col"], m["end_col"], m["hl"]) for m in marks if "hl" in m] == \
        [(2, 11, 15, "CompleterEditDelete")], marks
    assert [(m["row"], m["col"], m["text"]) for m in marks if "text" in m] == [(2, 15, "total")], marks
    assert nv.buffer() == EDIT_AFTER.rstrip("\n"), "shown, not applied"
    requests = nv.lua(COUNTERS)["requests"]
    nv.send("<Tab>")
    nv.wait(lambda: nv.buffer() == EDIT_EXPECTED.rstrip("\n"), 10, "Tab to apply the next edit")
    st = nv.lua("T.state()")
    assert st["mode"] == "i" and st["cursor"] == [3, len("    return total")], st
    assert nv.lua("T.prev_tab()") == 0, "the Tab went to the suggestion, not the previous mapping"
    counters = nv.wait(lambda: (c := nv.lua(COUNTERS))["requests"] > requests and c, 10, "the chained request")
    assert counters["accepted"] == 1 and counters["shown"] >= 1, counters
    stats = nv.lua("T.server_stats()")["stats"]
    assert stats["next_edit_accepted"] == 1, stats


def test_nvim_stale_suggestion_is_not_applied(rename_session):
    """The buffer changes (a comment added at the top) and Tab comes before the plugin hears of
    the change: the suggestion, computed on the earlier version, is dropped, not applied."""
    nv = rename_session
    shown_marks(nv)
    nv.send("<Cmd>lua vim.api.nvim_buf_set_lines(0, 0, 0, false, { '# area' })<CR><Tab>")
    want = "# area\n" + EDIT_AFTER.rstrip("\n")
    nv.wait(lambda: nv.lua(MARKS) == [], 10, "the stale suggestion to go")
    buf = nv.buffer()
    assert buf in (want, want.replace("    total", "    totalT", 1)), buf  # T: the Tab fell through
    assert "return size" in buf and "return total" not in buf
    counters = nv.lua(COUNTERS)
    assert counters["accepted"] == 0 and counters["rejected"] >= 1, counters


def test_nvim_esc_in_insert_mode_dismisses_and_leaves_insert_mode(rename_session):
    """The suggestion shows while typing; <Esc> dismisses it (rejected, to the server too) and
    leaves insert mode as usual."""
    nv = rename_session
    shown_marks(nv)
    assert nv.lua("T.state()")["mode"] == "i"
    nv.send("<Esc>")
    nv.wait(lambda: nv.lua("T.state()")["mode"] == "n", 10, "<Esc> to leave insert mode")
    assert nv.lua(MARKS) == [], "dismissed"
    assert nv.buffer() == EDIT_AFTER.rstrip("\n"), "not applied"
    counters = nv.lua(COUNTERS)
    assert counters["rejected"] == 1 and counters["accepted"] == 0, counters
    stats = nv.wait(lambda: (s := nv.lua("T.server_stats()")["stats"])["next_edit_rejected"] == 1 and s, 10,
                    "the rejection at the server")
    assert stats["next_edit_accepted"] == 0, stats
    nv.send("<Tab>")  # normal mode: nothing left to apply
    assert nv.buffer() == EDIT_AFTER.rstrip("\n") and nv.lua(COUNTERS)["accepted"] == 0


# -- the web editor ------------------------------------------------------------------------------
def edit_state(cdp) -> dict:
    """The page plus the next edit drawn: struck-through and inserted texts, in document order."""
    s = page_state(cdp)
    s.update(cdp.js("""(() => ({
      deleted: [...document.querySelectorAll('.cm-next-delete')].map((e) => e.textContent),
      inserted: [...document.querySelectorAll('.cm-next-insert')].map((e) => e.textContent),
      shown: document.body.dataset.nextEdit }))()"""))
    return s


def open_page(cdp, site: str, ws_url: str, text: str = EDIT_BEFORE, select: tuple[int, int] | None = None) -> None:
    """The page on `ws_url`, `text` loaded as a new document, `select` (default: `size` on line 2
    of EDIT_BEFORE) selected."""
    cdp.call("Page.enable")
    cdp.call("Page.navigate", url=f"{site}/index.html?ws={quote(ws_url, safe='')}")
    wait_for(lambda: page_state(cdp)["state"] == "ready", 60, "the page to connect", detail=lambda: page_state(cdp))
    anchor, head = select or (EDIT_BEFORE.index("size"), EDIT_BEFORE.index("size") + 4)
    cdp.js(f"""(() => {{ const v = window.completerView; v.focus();
      v.dispatch({{ changes: {{ from: 0, to: v.state.doc.length, insert: {json.dumps(text)} }},
                   userEvent: 'set' }});
      v.dispatch({{ selection: {{ anchor: {anchor}, head: {head} }} }}); }})()""")


def wait_suggestion(cdp) -> dict:
    return wait_for(lambda: (s := edit_state(cdp))["shown"] == "shown" and s, 60, "the next edit drawn",
                    step=0.2, detail=lambda: edit_state(cdp))


@pytest.fixture
def edit_serve(tmp_path, edit_parrot_pair):
    with serve_pair(tmp_path, *edit_parrot_pair) as url:
        yield url


def test_web_rename_is_carried_and_tab_applies_it(chromium, static_site, edit_serve, tmp_path):
    import base64
    import os
    from pathlib import Path

    cdp = chromium
    open_page(cdp, static_site, edit_serve)
    cdp.type("total")
    s = wait_suggestion(cdp)
    assert s["value"] == EDIT_AFTER and (s["deleted"], s["inserted"]) == (["size"], ["total"]), s
    assert s["errors"] == [] and s["ghost"] == "", s
    assert cdp.js("document.getElementById('next-latency').textContent").startswith("next edit: 1 edit · total ")
    shot = Path(os.environ.get("EDITOR_SCREENSHOT_DIR", tmp_path)) / "web-next-edit.png"
    shot.write_bytes(base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"]))
    cdp.key("Tab", "Tab", 9)
    s = wait_for(lambda: (p := edit_state(cdp))["value"] != EDIT_AFTER and p, 10, "Tab to apply the edit")
    assert s["value"] == EDIT_EXPECTED, s
    assert s["cursor"] == EDIT_EXPECTED.index("return total") + len("return total"), s


def test_web_esc_dismisses_and_typing_drops_a_suggestion(chromium, static_site, edit_serve):
    cdp = chromium
    open_page(cdp, static_site, edit_serve)
    cdp.type("total")
    wait_suggestion(cdp)
    cdp.key("Escape", "Escape", 27)
    s = edit_state(cdp)
    assert s["shown"] == "none" and s["deleted"] == [] and s["value"] == EDIT_AFTER, s
    cdp.key("Tab", "Tab", 9)  # nothing shown: Tab does its usual (indents the line)
    value = edit_state(cdp)["value"]
    assert value != EDIT_AFTER and "return size" in value, value
    open_page(cdp, static_site, edit_serve)
    cdp.type("total")
    wait_suggestion(cdp)
    cdp.type("s", delay=0)
    s = edit_state(cdp)
    assert s["shown"] == "none" and s["inserted"] == [], "the text changed: the suggestion is gone at once"
    cdp.key("Tab", "Tab", 9)
    assert "return size" in edit_state(cdp)["value"], "and Tab never applies it"


@pytest.fixture
def scripted_edits():
    """A /ws server that holds each next_edit request until the test releases it, then answers
    with `edits` (columns in code points, as `completer serve` does; first the rename, a test may
    replace them)."""
    from websockets.sync.server import serve

    asked, release = [], threading.Semaphore(0)
    edits = [{"start_line": 2, "start_col": 11, "end_line": 2, "end_col": 15, "text": "total"}]

    def handler(ws):
        for message in ws:
            f = msgpack.unpackb(message)
            if f["type"] == "hello":
                ws.send(msgpack.packb({"type": "hello", "server": "scripted", "version": "0", "ready": True,
                                       "model": {"target": "script"}}))
            elif f["type"] == "complete":
                ws.send(msgpack.packb({"type": "done", "id": f["id"], "text": "", "cancelled": False, "stats": {}}))
            elif f["type"] == "next_edit":
                asked.append(f)
                release.acquire(timeout=60)
                ws.send(msgpack.packb({"type": "next_edit", "id": f["id"], "edits": list(edits), "stats": {}}))

    with serve(handler, "127.0.0.1", 0) as server:
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/ws", asked, release, edits
        release.release(8)
        server.shutdown()
        t.join(timeout=10)


def test_web_a_reply_for_an_older_text_is_not_shown(chromium, static_site, scripted_edits):
    url, asked, release, _ = scripted_edits
    cdp = chromium
    open_page(cdp, static_site, url)
    cdp.type("total")
    wait_for(lambda: asked, 30, "the next_edit request")
    first = asked[0]
    assert first["text"] == EDIT_AFTER and first["before"] == EDIT_BEFORE, first
    assert (first["line"], first["col"], first["path"]) == (1, len("    total"), "demo.py"), first
    cdp.type("_", delay=0)  # the text changes while the request runs
    release.release()  # its reply, for the older text
    wait_for(lambda: len(asked) == 2, 30, "the request for the new text")
    s = edit_state(cdp)
    assert s["shown"] == "none" and s["inserted"] == [], s
    release.release()  # the reply for the text on screen is shown
    s = wait_suggestion(cdp)
    assert s["inserted"] == ["total"] and s["value"] == EDIT_AFTER.replace("total", "total_", 1), s


def test_web_an_edit_outside_the_view_is_announced_and_tab_jumps_then_applies(chromium, static_site,
                                                                             scripted_edits, tmp_path):
    import base64
    import os
    from pathlib import Path

    url, _, release, edits = scripted_edits
    edits[:] = [{"start_line": 149, "start_col": 0, "end_line": 149, "end_col": 4, "text": "y150"}]
    text = "".join(f"x{i} = {i}\n" for i in range(1, 201))
    cdp = chromium
    open_page(cdp, static_site, url, text, (0, 0))
    release.release()
    cdp.type("#", delay=0)
    s = wait_suggestion(cdp)
    hint = cdp.js("""(() => { const h = document.querySelector('.cm-next-jump');
      return h && { text: h.textContent, line: h.closest('.cm-line').textContent }; })()""")
    assert hint and "next edit at line 150" in hint["text"] and hint["line"].startswith("#x1 = 1"), (hint, s)
    assert s["deleted"] == [], "line 150 is not drawn: it is outside the view"
    shot = Path(os.environ.get("EDITOR_SCREENSHOT_DIR", tmp_path)) / "web-next-edit-far.png"
    shot.write_bytes(base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"]))
    cdp.key("Tab", "Tab", 9)
    s = wait_for(lambda: (p := edit_state(cdp))["deleted"] and p, 10, "the jump to line 150", detail=lambda: edit_state(cdp))
    at = ("#" + text).index("x150 ")
    assert s["cursor"] == at and s["value"] == "#" + text and s["deleted"] == ["x150"], s
    assert cdp.js("document.querySelector('.cm-next-jump') === null"), "in view: no longer announced"
    edits[:] = []  # the chained request after the apply: nothing more
    release.release()
    cdp.key("Tab", "Tab", 9)
    s = wait_for(lambda: (p := edit_state(cdp))["value"] != "#" + text and p, 10, "the second Tab to apply it")
    assert s["value"] == "#" + text.replace("x150 ", "y150 ") and s["shown"] == "none", s
