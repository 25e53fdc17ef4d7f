"""Neovim plugin (editor-plugin/nvim) end to end: headless Neovim 0.12 with the plugin, the real
`completer-lsp` on the tiny model pair (its target taught to answer `1`, see
test_editor_parrot.py); type in a Python buffer, see ghost text, accept it.

Neovim cannot type while a Lua script runs, so the editor listens on a socket and the test types
with `nvim --server SOCK --remote-send` and reads state with `--remote-expr` (see NOTES.md;
the driver is tests/helpers/nvim.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import missing
from helpers.nvim import (
    NVIM,
    PLUGIN,
    WHY,
    Nvim,
    ansi_cells,
    ghost_after,
    lsp_cmd,
    save_png,
    screen_capture,
    wait_ready,
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _nvim_installed():
    """.ci/run installs Neovim (the dev extra): without it a failure under CI=1, else a skip,
    before any test's fixture starts a process."""
    if NVIM is None:
        missing(WHY)


@pytest.fixture(params=["setup"])
def nvim_session(request, tmp_path, parrot_pair):
    """A headless Neovim editing demo.py with the plugin; param: "setup" (require('completer').setup)
    or "lsp_config" (vim.lsp.config + vim.lsp.enable, through lsp/completer.lua)."""
    target, draft = parrot_pair
    src = tmp_path / "demo.py"
    src.write_text("import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = 1\n")
    # next edits off: these tests are about ghost text (a next edit would take a Tab that falls through)
    nv = Nvim(tmp_path, lsp_cmd(), {"target": str(target), "draft": str(draft), "max_new_tokens": 16,
                                    "next_edit": False},
              src, mode=request.param)
    try:
        yield nv
    finally:
        nv.close()
        log = (tmp_path / "nvim.log").read_text(errors="replace")
        if log.strip():
            print("--- nvim output ---\n" + log[-4000:])


def test_ghost_text_appears_and_get_accepts_it(nvim_session):
    nv = nvim_session
    wait_ready(nv)
    before = nv.buffer()
    # Start a statement on a new last line inside main().
    ghost = ghost_after(nv, "GA<CR>    y = x + ")
    assert nv.lua("T.state()")["mode"] == "i"
    shown = "\n".join(ghost[0]["lines"])
    typed = nv.buffer()
    assert typed == before + "\n    y = x + "
    if shutil.which("tmux"):
        # The screen as a user sees it: the ghost after the typed text, in its own colour.
        rows = ansi_cells(screen_capture(nv))
        line = next(r for r in rows if "".join(c[0] for c in r).rstrip().endswith("y = x + " + shown))
        text = "".join(c[0] for c in line).rstrip()
        ghost_cells, typed_cells = line[len(text) - len(shown):len(text)], line[len(text) - 3:len(text) - len(shown)]
        assert {c[1] for c in ghost_cells}.isdisjoint({c[1] for c in typed_cells}), line
        save_png(rows, Path(os.environ.get("EDITOR_SCREENSHOT_DIR", nv.sock.rsplit("/", 1)[0])) / "nvim-ghost.png")

    assert nv.lua("T.accept()") is True
    after = nv.wait(lambda: (b := nv.buffer()) != typed and b, 10, "the accepted text in the buffer")
    assert after == typed + shown, (after, typed, shown)

    st = nv.lua("T.state()")
    fb = st["last_feedback"]
    assert fb["accepted"] is True and fb["uri"].endswith("/demo.py")
    assert fb["text"].endswith(shown) and fb["acceptedChars"] == len(fb["text"])
    assert st["counters"]["accepted"] == 1
    stats = nv.lua("T.server_stats()")
    assert stats["err"] is None and isinstance(stats["stats"], dict), stats


def test_typing_on_rejects_and_tab_accepts(nvim_session):
    nv = nvim_session
    wait_ready(nv)
    first = ghost_after(nv, "GA<CR>    z = ")
    # Typing instead of accepting: the shown item is reported as rejected with the next request.
    ghost = ghost_after(nv, "(")
    st = nv.lua("T.state()")
    assert st["counters"]["rejected"] >= 1
    assert st["counters"]["accepted"] == 0
    assert first[0]["lines"] and ghost[0]["lines"]

    shown = "\n".join(ghost[0]["lines"])
    typed = nv.buffer()
    assert typed.endswith("    z = (")
    nv.send("<Tab>")
    after = nv.wait(lambda: (b := nv.buffer()) != typed and b, 10, "Tab to insert the ghost text")
    assert after == typed + shown
    st = nv.lua("T.state()")
    assert st["counters"]["accepted"] == 1 and st["last_feedback"]["accepted"] is True

    # <Esc> over ghost text (insert mode maps it to dismiss a next edit first): insert mode ends,
    # the ghost goes and is reported as rejected.
    ghost_after(nv, "<CR>    w = ")
    rejected = nv.lua("T.state()")["counters"]["rejected"]
    nv.send("<Esc>")
    st = nv.wait(lambda: (s := nv.lua("T.state()"))["mode"] == "n" and s, 10, "<Esc> to leave insert mode")
    assert st["counters"]["rejected"] == rejected + 1 and st["last_feedback"]["accepted"] is False, st
    assert nv.lua("T.ghost()") == []


def test_ghost_text_has_its_own_highlight_with_a_cterm_colour(nvim_session):
    """CompleterGhost: grey and italic with a cterm colour, standing in for ComplHint in the
    buffer's window; in a 256-colour terminal the ghost is drawn in it, apart from the code; a
    user's own definition survives a colour scheme change."""
    nv = nvim_session
    wait_ready(nv)
    hl = nv.lua("vim.json.encode(vim.api.nvim_get_hl(0, { name = 'CompleterGhost' }))")
    assert hl["ctermfg"] == 244 and hl["italic"] is True and hl["cterm"]["italic"] is True, hl
    assert "ComplHint:CompleterGhost" in nv.expr("&winhighlight")
    ghost = ghost_after(nv, "GA<CR>    y = x + ")
    shown = "\n".join(ghost[0]["lines"])
    if shutil.which("tmux"):
        rows = ansi_cells(screen_capture(nv, truecolor=False))
        line = next(r for r in rows if "".join(c[0] for c in r).rstrip().endswith("y = x + " + shown))
        text = "".join(c[0] for c in line).rstrip()
        ghost_cells, code_cells = line[len(text) - len(shown):len(text)], line[:len(text) - len(shown)]
        assert {(c[1], c[3]) for c in ghost_cells} == {("c244", True)}, ghost_cells
        assert not any(c[3] for c in code_cells) and "c244" not in {c[1] for c in code_cells}, code_cells
    nv.send("<Esc>:hi CompleterGhost ctermfg=1 guifg=Red<CR>:doautocmd ColorScheme<CR>")
    assert nv.lua("vim.json.encode(vim.api.nvim_get_hl(0, { name = 'CompleterGhost' }))")["ctermfg"] == 1


def test_tab_right_after_a_ghost_is_taken_back_does_nothing(nvim_session):
    """A reply that takes back the ghost shown (here the server was switched off behind the
    plugin's back, so it answers nothing, and a cursor move asks again while the ghost is still
    drawn at its range): a <Tab> within accept_guard_ms (60 s here, so the test does not race a clock) neither
    accepts nor falls through to the previous <Tab> mapping."""
    nv = nvim_session
    wait_ready(nv)
    assert nv.lua("vim.json.encode(require('completer').config.accept_guard_ms)") == 300
    nv.expr("execute(\"lua require('completer').config.accept_guard_ms = 60000\")")
    ghost_after(nv, "GA<CR>    y = x + ")
    off = "{ completer = { enable = false } }"
    nv.expr(f"execute(\"lua local c = vim.lsp.get_clients({{ name = 'completer' }})[1]; c.settings = {off};"
            f" c:notify('workspace/didChangeConfiguration', {{ settings = {off} }})\")")
    nv.send("<Left>")
    nv.wait(lambda: nv.lua("T.ghost()") == [], 30, "the reply to take the ghost back")
    typed = nv.buffer()
    nv.send("<Tab>Z")  # Z: input is processed in order, so once it is in, the Tab was handled
    after = nv.wait(lambda: (b := nv.buffer()) != typed and b, 10, "the Z after the Tab")
    assert after == typed[:-1] + "Z " and nv.lua("T.prev_tab()") == 0, after
    nv.expr("execute(\"lua require('completer').config.accept_guard_ms = 0\")")
    nv.send("<Tab>")  # no guard: no ghost, so the previous mapping runs
    nv.wait(lambda: nv.buffer().endswith("ZT "), 10, "<Tab> to fall through once the guard is off")


def test_partial_accept_takes_a_word_or_a_line(tmp_path):
    """`partial()` decides what Ctrl+Right / Ctrl+Down insert; no server needed."""
    script = tmp_path / "partial.lua"
    script.write_text(
        f"vim.opt.runtimepath:prepend({json.dumps(str(PLUGIN))})\n"
        "local p = require('completer').partial\n"
        "local cases = {\n"
        "  {'foo(bar)', 'word', 'foo'}, {'  return x', 'word', '  return'}, {'(a, b)', 'word', '('},\n"
        "  {'.append(x)', 'word', '.'}, {'   ', 'word', '   '}, {'a + b\\n    c', 'line', 'a + b'},\n"
        "  {'\\n    return y\\nz', 'line', '\\n    return y'}, {'x', 'line', 'x'},\n"
        "}\n"
        "for _, c in ipairs(cases) do\n"
        "  local got = p(c[1], c[2])\n"
        "  if got ~= c[3] then io.stdout:write(('FAIL %q %s -> %q, want %q\\n'):format(c[1], c[2], got, c[3])) end\n"
        "end\n"
        "io.stdout:write('done\\n')\n")
    r = subprocess.run([NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-l", str(script)],
                       capture_output=True, text=True, timeout=60, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "done" in out and "FAIL" not in out, out


def server_requests(nv: Nvim) -> int:
    stats = nv.lua("T.server_stats()")
    assert stats["err"] is None, stats
    return stats["stats"].get("requests", 0)


def messages(nv: Nvim) -> str:
    return nv.expr('execute("messages")')


def test_disable_stops_requests_and_tab_falls_through(nvim_session):
    nv = nvim_session
    wait_ready(nv)
    ghost_after(nv, "GA<CR>    w = ")
    assert nv.lua("T.ask()").get("items"), "the server answers here while on"
    # Off: the server is told (workspace/didChangeConfiguration) and answers the same request
    # empty; the client stops asking and drops the ghost.
    nv.send("<C-o>:Completer disable<CR>")
    nv.wait(lambda: nv.lua("require('completer').allowed(0)") is False, 10, ":Completer disable")
    assert nv.lua("T.ask()") == {"items": []}
    before, offered = server_requests(nv), nv.lua("T.state()")["counters"]["offered"]
    # No ghost text, so <Tab> runs the mapping it had before the plugin.
    nv.send("<Tab>")
    nv.wait(lambda: nv.buffer().endswith("\n    w = T"), 10, "<Tab> to fall through to the previous mapping")
    assert nv.lua("T.prev_tab()") == 1
    nv.send("<CR>    q = ")
    time.sleep(1.0)  # longer than the debounce: a request would have been sent by now
    assert server_requests(nv) == before
    assert nv.lua("T.state()")["counters"]["offered"] == offered
    nv.send("<Esc>:Completer status<CR>")
    assert "disabled" in messages(nv).splitlines()[-1]

    # Per buffer and per filetype, then on again: requests and ghost text come back.
    nv.send(":Completer enable<CR>:Completer disable buffer<CR>")
    assert nv.expr('luaeval("select(2, require(\'completer\').allowed(0))")').strip() == "disabled in this buffer"
    nv.send(":Completer toggle buffer<CR>:Completer disable filetype<CR>")
    assert nv.expr('luaeval("select(2, require(\'completer\').allowed(0))")').strip() == \
        "disabled for filetype python"
    nv.send(":Completer enable filetype<CR>:Completer snooze 5<CR>")
    assert nv.expr('luaeval("select(2, require(\'completer\').allowed(0))")').strip() == "snoozed for 5 min"
    nv.send(":Completer snooze 0<CR>")
    assert nv.lua("require('completer').allowed(0)") is True
    ghost = ghost_after(nv, "A + ")
    assert ghost and server_requests(nv) > before
    nv.send("<Esc>:Completer bogus<CR>")
    assert "unknown subcommand" in messages(nv)


@pytest.mark.parametrize("nvim_session", ["lsp_config"], indirect=True)
def test_lsp_config_users_and_checkhealth(nvim_session):
    """vim.lsp.config + vim.lsp.enable (lsp/completer.lua, no setup()): ghost text, <Tab> accepts;
    then :checkhealth completer reports every part OK."""
    nv = nvim_session
    wait_ready(nv)
    ghost = ghost_after(nv, "GA<CR>    v = ")
    typed = nv.buffer()
    nv.send("<Tab>")
    after = nv.wait(lambda: (b := nv.buffer()) != typed and b, 10, "Tab to insert the ghost text")
    assert after == typed + "\n".join(ghost[0]["lines"]) and nv.lua("T.prev_tab()") == 0
    nv.send("<Esc>")
    report = "\n".join(nv.lua("T.health()"))
    ok_lines = [line for line in report.splitlines() if "OK" in line]
    for want in ("with vim.lsp.inline_completion", "server executable: ", "running (client ",
                 "models loaded (in-process engine)", "engine reachable: in-process engine",
                 "completions on", "<Tab> (accept): no conflict; without ghost text it falls through to test",
                 "<C-Right> (accept_word): no conflict"):
        assert any(want in line for line in ok_lines), (want, report)
    assert "ERROR" not in report, report

    # :Completer restart: a new server attaches to the open buffer and completes again.
    def ids():
        return nv.lua("vim.json.encode(vim.tbl_map(function(c) return c.id end, "
                      "vim.lsp.get_clients({ name = 'completer', bufnr = 0 })))")
    first = ids()
    assert len(first) == 1
    nv.send(":Completer restart<CR>")
    nv.wait(lambda: (now := ids()) and now != first, 60, "a new server to attach")
    wait_ready(nv)
    assert ghost_after(nv, "o    u = ")


def test_vimdoc_tags(tmp_path):
    """doc/completer.txt is valid help: :helptags makes a tags file with its tags."""
    doc = tmp_path / "doc"
    shutil.copytree(PLUGIN / "doc", doc)
    r = subprocess.run([NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-n", "-c", f"helptags {doc}",
                        "-c", "qa!"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    tags = {line.split("\t")[0] for line in (doc / "tags").read_text().splitlines()}
    assert {"completer", ":Completer", "completer-commands", "completer-keys", "completer-health"} <= tags


def test_a_server_that_cannot_load_says_so(tmp_path):
    """A target that does not exist: the status says failed, :checkhealth reports an ERROR."""
    src = tmp_path / "demo.py"
    src.write_text("x = 1\n")
    nv = Nvim(tmp_path, lsp_cmd(), {"target": str(tmp_path / "missing"), "draft": str(tmp_path / "missing")}, src)
    try:
        st = nv.wait(lambda: (s := nv.lua("T.state()"))["status"]["phase"] == "failed" and s, 120,
                     "the load to fail", step=0.25)
        assert "failed" in st["status"]["message"]
        assert nv.expr('luaeval("require(\'completer\').status_text()")').startswith("completer: failed")
        report = "\n".join(nv.lua("T.health()"))
        assert any("ERROR" in line and "engine: failed" in line for line in report.splitlines()), report
    finally:
        nv.close()
