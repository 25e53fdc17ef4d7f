--- completer.nvim: inline (ghost text) completions from `completer-lsp` in Neovim >= 0.12.
---
--- Owns: the LSP client config for `completer-lsp` (also what `lsp/completer.lua` returns for
--- `vim.lsp.config` users), the accept keymaps (falling through to the key's previous mapping
--- when no ghost text is shown), the on/off switches (global, snooze, per filetype, per buffer),
--- `completer/feedback` notifications and the load-progress status. Ghost text itself is
--- Neovim's own `vim.lsp.inline_completion`; this module only wires the server to it.
---
--- Switches: a buffer asks for completions only while completions are on globally, not
--- snoozed, and not off for its filetype or for the buffer itself. Off in a buffer disables
--- `vim.lsp.inline_completion` there (no requests at all); the global state is also sent to the
--- server (`workspace/didChangeConfiguration` `{completer = {enable = ...}}`), which then
--- answers any request empty, without a restart or a model reload.
---
--- Ghost text is drawn with the plugin's own `CompleterGhost` highlight (grey and italic, with
--- a cterm colour for 256-colour terminals such as tmux's default, where `ComplHint` → `NonText`
--- has only a GUI colour): it stands in for `ComplHint` in windows showing an attached buffer
--- ('winhighlight'). A `CompleterGhost` the user or a colour scheme defines wins, as does
--- `highlight` in `setup()`.
---
--- A ghost the user saw that a reply takes back (replaced by nothing, or by text that does not
--- extend it) makes the accept keys do nothing for `accept_guard_ms`: the press was meant for it.
---
--- Next-edit suggestions (`completer/nextEdit`, shown with extmarks, applied by the accept key)
--- are `completer.next_edit`'s; this module maps their keys and chains them after an accept.
---
--- Feedback: every item the server returns gets a client-side command (`completer.accepted`)
--- that Neovim runs after inserting it, so a plain `vim.lsp.inline_completion.get()` reports the
--- accept too. An item that came back and was replaced by the next request (or dropped on
--- InsertLeave) without being accepted is reported as rejected.
local M = {}

local api = vim.api
local next_edit = require('completer.next_edit')
local NAME = 'completer'
local ACCEPT_CMD = 'completer.accepted'

--- initializationOptions the server knows (the option schema's scopes engine, client, syntax
--- and lsp: `completer options --json-schema`; tests/test_editor_vscode.py keeps them equal)
--- and the Lua type each must have.
M.option_types = {
  -- engine
  target = 'string', draft = 'string', next_edit_model = 'string', device = 'string', dtype = 'string', quant = 'string',
  quant_groups = 'string', draft_quant = 'string', drafter = 'string', draft_len = 'number', max_draft_len = 'number',
  draft_vocab = 'number', max_new_tokens = 'number', temperature = 'number', top_p = 'number',
  kv_budget_mb = 'number', lean = 'boolean', seed = 'number', fim_format = 'string',
  max_batch = 'number', batch_wait_ms = 'number', max_queue = 'number',
  batch_step_tokens = 'number', decode_threads = 'number', kv_cache = 'string', warmup_chunk = 'number',
  type_through = 'boolean', prefetch = 'boolean', alternatives = 'number', min_confidence = 'number',
  next_edit_min_confidence = 'number',
  -- client
  engine = 'string', engine_api_key = 'string', engine_model = 'string',
  engine_timeout_ms = 'number', engine_retries = 'number',
  -- syntax
  multiline = 'boolean', complete_in_comments = 'boolean', complete_in_strings = 'boolean',
  complete_in_docstrings = 'boolean', max_lines = 'number', prefix_lines = 'number',
  suffix_lines = 'number', suffix_share = 'number', header_share = 'number',
  max_siblings = 'number', grid_lines = 'number', parse_check = 'boolean',
  stop_degenerate = 'boolean', syntax_budget_ms = 'number',
  -- lsp
  enable = 'boolean', debounce_ms = 'number', warmup = 'boolean', ready_wait_ms = 'number',
  next_edit = 'boolean', next_edit_debounce_ms = 'number', next_edit_format = 'string', next_edit_rename = 'boolean',
  next_edit_rename_first = 'boolean', next_edit_lines_above = 'number', next_edit_lines_below = 'number', next_edit_max_lines = 'number',
  -- workspace
  cross_file = 'boolean', cross_file_share = 'number', cross_file_max_files = 'number',
  index_memory_mb = 'number', index_max_file_kb = 'number',
}

M.defaults = {
  cmd = { 'completer-lsp' },
  init_options = {},
  filetypes = { 'python', 'javascript', 'typescript', 'go', 'rust' },
  root_markers = { '.git', 'pyproject.toml', 'package.json', 'go.mod', 'Cargo.toml' },
  -- Insert-mode keys; false leaves a key unmapped. Accept falls back to the key itself when
  -- no ghost text is shown.
  keymaps = {
    accept = '<Tab>',
    accept_word = '<C-Right>',
    accept_line = '<C-Down>',
    next = '<M-]>',
    prev = '<M-[>',
    -- Normal mode: apply (or jump to) / dismiss a next-edit suggestion; in insert mode `accept`
    -- applies one when no ghost text is shown, and `next_edit_dismiss` dismisses one, then does
    -- what the key does (<Esc> leaves insert mode).
    next_edit_accept = '<Tab>',
    next_edit_dismiss = '<Esc>',
  },
  progress = true, -- echo model-loading progress ($/progress) in the message area
  -- CompleterGhost's attributes (nvim_set_hl); a definition of the group elsewhere wins.
  highlight = { fg = '#808080', ctermfg = 244, italic = true, cterm = { italic = true } },
  -- CompleterEditInsert / CompleterEditDelete: a next edit's new and removed text.
  next_edit_highlight = {
    insert = { fg = '#87d787', ctermfg = 114, italic = true, cterm = { italic = true } },
    delete = { fg = '#d78787', ctermfg = 174, strikethrough = true, cterm = { strikethrough = true } },
  },
  accept_guard_ms = 300, -- accept keys do nothing this long after a shown ghost is taken back
  disabled_filetypes = {}, -- filetypes attached but with completions off (`:Completer enable filetype`)
}

M.config = vim.deepcopy(M.defaults)

--- Load state shown by `status()`: starting → loading → ready (or failed), or stopped.
local state = { phase = 'stopped', title = nil, message = nil, percentage = nil }
local tokens_in_flight = {} ---@type table<string|integer, true>

--- Per-buffer-URI completion offered and not yet resolved: { text = string }.
local offered = {} ---@type table<string, {text: string}>

--- Counters of what this client reported, for `:CompleterStatus` and tests.
M.counters = { offered = 0, accepted = 0, partial = 0, rejected = 0 }
M.last_feedback = nil ---@type table?

local function get_client(bufnr)
  return vim.lsp.get_clients({ name = NAME, bufnr = bufnr })[1]
end

--- `notify` is a client's or an RPC's notify function.
local function feedback(notify, params)
  M.last_feedback = params
  notify('completer/feedback', params)
end

--- Resolve the pending offer for `uri` as rejected (it was shown and not taken).
local function reject_pending(notify, uri)
  local pending = offered[uri]
  offered[uri] = nil
  if pending then
    M.counters.rejected = M.counters.rejected + 1
    feedback(notify, { uri = uri, text = pending.text, accepted = false })
  end
end

--- The ghost text shown in `bufnr` (lines joined by newlines), or nil.
local function ghost_shown(bufnr)
  local ns = api.nvim_get_namespaces()['nvim.lsp.inline_completion']
  if not ns or not api.nvim_buf_is_valid(bufnr) then
    return nil
  end
  for _, m in ipairs(api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    local lines = {}
    for _, vl in ipairs({ m[4].virt_text or {}, unpack(m[4].virt_lines or {}) }) do
      local l = {}
      for _, chunk in ipairs(vl) do
        table.insert(l, chunk[1])
      end
      table.insert(lines, table.concat(l))
    end
    local text = table.concat(lines, '\n')
    if text ~= '' then
      return text
    end
  end
  return nil
end

--- When a shown ghost was last taken back, per buffer (vim.uv.now() ms).
local withdrawn = {} ---@type table<integer, integer>

local function guarded(bufnr)
  return withdrawn[bufnr] ~= nil and vim.uv.now() - withdrawn[bufnr] < M.config.accept_guard_ms
end

local function client_notify(client)
  return function(method, params)
    return client:notify(method, params)
  end
end

local function item_text(item)
  local t = item.insertText
  if type(t) == 'table' then
    return t.value or ''
  end
  return t or ''
end

--- Wraps the RPC client so inline-completion replies pass through here: each item gets the
--- `completer.accepted` command (the server's own command, if any, runs after it) and the
--- first item is remembered as offered.
local function wrap_rpc(rpc)
  local request = rpc.request
  rpc.request = function(method, params, callback, notify_reply_callback)
    if method ~= 'textDocument/inlineCompletion' then
      return request(method, params, callback, notify_reply_callback)
    end
    local uri = params.textDocument.uri
    reject_pending(rpc.notify, uri)
    return request(method, params, function(err, result)
      local bufnr = vim.uri_to_bufnr(uri)
      local before = ghost_shown(bufnr)
      if not err and result then
        local items = result.items or result
        for _, item in ipairs(items) do
          local text = item_text(item)
          item.command = {
            title = 'completer: accepted',
            command = ACCEPT_CMD,
            arguments = { { uri = uri, text = text, inner = item.command } },
          }
        end
        if items[1] and item_text(items[1]) ~= '' then
          offered[uri] = { text = item_text(items[1]) }
          M.counters.offered = M.counters.offered + 1
        end
      end
      callback(err, result) -- Neovim's handler shows the reply's ghost (or none) right away
      local after = ghost_shown(bufnr)
      if before and (not after or after:sub(1, #before) ~= before) then
        withdrawn[bufnr] = vim.uv.now()
      end
    end, notify_reply_callback)
  end
  return rpc
end

local function on_accepted(command, ctx)
  local arg = command.arguments[1]
  local client = vim.lsp.get_client_by_id(ctx.client_id)
  offered[arg.uri] = nil
  M.counters.accepted = M.counters.accepted + 1
  next_edit.chained(ctx.bufnr)
  if client then
    feedback(client_notify(client), {
      uri = arg.uri, text = arg.text, accepted = true, acceptedChars = vim.fn.strchars(arg.text),
    })
    if arg.inner then
      client:exec_cmd(arg.inner, { bufnr = ctx.bufnr })
    end
  end
end

--- The part of `text` to take on a partial accept: the next word (with the whitespace before
--- it) or the rest of the current line (with its newline when the line is already done).
function M.partial(text, unit)
  if unit == 'word' then
    return text:match('^%s*[%w_]+') or text:match('^%s*[^%w_%s]+') or text:match('^%s+') or text
  end
  local line = text:match('^[^\n]*')
  if line == '' and text:sub(1, 1) == '\n' then
    return '\n' .. (text:match('^\n[^\n]*') or ''):sub(2)
  end
  return line
end

--- The item's text minus what is already typed between its range start and the cursor.
local function remaining_text(item, bufnr)
  local text = type(item.insert_text) == 'string' and item.insert_text or item.insert_text.value
  local range = item.range
  if not range then
    return text
  end
  local row, col = unpack(api.nvim_win_get_cursor(vim.fn.bufwinid(bufnr)))
  if range.start.row ~= row - 1 then
    return text
  end
  local typed = api.nvim_buf_get_text(bufnr, range.start.row, range.start.col, row - 1, col, {})[1]
  if typed and text:sub(1, #typed) == typed then
    return text:sub(#typed + 1)
  end
  return text
end

--- Accept the next word or line of the ghost text; returns false when none is shown.
function M.accept_partial(unit)
  local bufnr = api.nvim_get_current_buf()
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function(item)
      local rest = remaining_text(item, bufnr)
      local part = M.partial(rest, unit)
      if part == '' then
        return
      end
      api.nvim_paste(part, false, -1)
      local client = vim.lsp.get_client_by_id(item.client_id)
      local uri = vim.uri_from_bufnr(bufnr)
      offered[uri] = nil
      if client then
        local full = part == rest
        M.counters[full and 'accepted' or 'partial'] = M.counters[full and 'accepted' or 'partial'] + 1
        feedback(client_notify(client), { uri = uri, text = rest, accepted = true, acceptedChars = vim.fn.strchars(part) })
      end
    end,
  })
end

function M.accept()
  return vim.lsp.inline_completion.get()
end

local function echo_status()
  if M.config.progress then
    api.nvim_echo({ { M.status_text() } }, false, {})
  end
end

--- Current load state: { phase = 'stopped'|'starting'|'loading'|'ready'|'failed', title, message, percentage }.
function M.status()
  return vim.deepcopy(state)
end

function M.status_text()
  if state.phase == 'loading' then
    local parts = { 'completer: ' .. (state.title or 'loading') }
    if state.message and state.message ~= '' then
      table.insert(parts, state.message)
    end
    if state.percentage then
      table.insert(parts, ('%d%%'):format(state.percentage))
    end
    return table.concat(parts, ' ')
  end
  if state.phase == 'failed' then
    return 'completer: ' .. (state.message or 'failed')
  end
  return 'completer: ' .. state.phase
end

local function on_progress(ev)
  local client = vim.lsp.get_client_by_id(ev.data.client_id)
  if not client or client.name ~= NAME then
    return
  end
  local params = ev.data.params
  local value = params.value
  if type(value) ~= 'table' then
    return
  end
  if type(params.token) ~= 'string' or not params.token:match('^completer/load%-models/') then
    -- other work (the workspace index walk): shown as it goes, never the load state, so that an
    -- index still walking a big folder does not hold the status at 'loading'
    if M.config.progress and type(value.message) == 'string' then
      api.nvim_echo({ { 'completer: ' .. value.message } }, false, {})
    end
    return
  end
  if value.kind == 'end' then
    tokens_in_flight[params.token] = nil
    if next(tokens_in_flight) == nil then
      -- The server ends the load with its engine state: "ready" or "failed: <why>".
      local failed = type(value.message) == 'string' and value.message:match('^failed')
      state = { phase = failed and 'failed' or 'ready', message = value.message }
    end
  else
    tokens_in_flight[params.token] = true
    state = {
      phase = 'loading',
      title = value.title or state.title,
      message = value.message,
      percentage = value.percentage,
    }
  end
  echo_status()
end

-- -- on/off ----------------------------------------------------------------------------------

--- Global switch, snooze deadline (vim.uv.now() ms) and the filetypes switched off at runtime;
--- a buffer's own switch is `vim.b.completer_enabled` (false: off in that buffer).
local switch = { enabled = true, snooze_until = nil, filetypes = {} } ---@type {enabled: boolean, snooze_until: integer?, filetypes: table<string, boolean>}
local snooze_timer = nil ---@type uv.uv_timer_t?
local sent_enable = {} ---@type table<integer, boolean> what each client's server was last told

--- false and why when completions are off for `bufnr`, else true.
function M.allowed(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  if not switch.enabled then
    return false, 'disabled'
  end
  if switch.snooze_until then
    return false, ('snoozed for %d min'):format(math.ceil((switch.snooze_until - vim.uv.now()) / 60000))
  end
  if switch.filetypes[vim.bo[bufnr].filetype] then
    return false, 'disabled for filetype ' .. vim.bo[bufnr].filetype
  end
  if vim.b[bufnr].completer_enabled == false then
    return false, 'disabled in this buffer'
  end
  return true
end

--- Applies the switches: inline completion on/off in every attached buffer, and the global
--- state to each server that has not been told yet.
local function refresh()
  local on = switch.enabled and not switch.snooze_until
  for _, client in ipairs(vim.lsp.get_clients({ name = NAME })) do
    if sent_enable[client.id] ~= on and (sent_enable[client.id] ~= nil or not on) then
      client.settings = vim.tbl_deep_extend('force', client.settings or {}, { completer = { enable = on } })
      client:notify('workspace/didChangeConfiguration', { settings = { completer = { enable = on } } })
    end
    sent_enable[client.id] = on
    for bufnr in pairs(client.attached_buffers) do
      local ok = M.allowed(bufnr)
      vim.lsp.inline_completion.enable(ok, { bufnr = bufnr })
      if not ok then
        reject_pending(client_notify(client), vim.uri_from_bufnr(bufnr))
        next_edit.dismiss(bufnr)
      end
    end
  end
end

--- Switch completions on or off. `scope`: nil (everywhere), 'buffer' (the current buffer) or
--- 'filetype' (the current buffer's filetype). `on` = nil toggles.
function M.enable(on, scope)
  local bufnr = api.nvim_get_current_buf()
  if scope == 'buffer' then
    if on == nil then
      on = vim.b[bufnr].completer_enabled == false
    end
    vim.b[bufnr].completer_enabled = on
  elseif scope == 'filetype' then
    local ft = vim.bo[bufnr].filetype
    if on == nil then
      on = switch.filetypes[ft] == true
    end
    switch.filetypes[ft] = not on or nil
  elseif scope == nil then
    if on == nil then
      on = not switch.enabled
    end
    switch.enabled = on
    if on then
      M.snooze(0)
    end
  else
    error(('completer: unknown scope %q (buffer or filetype)'):format(scope))
  end
  refresh()
end

--- No completions for `minutes` (0 ends a snooze).
function M.snooze(minutes)
  if snooze_timer then
    snooze_timer:stop()
    snooze_timer:close()
    snooze_timer = nil
  end
  switch.snooze_until = nil
  if minutes > 0 then
    switch.snooze_until = vim.uv.now() + minutes * 60000
    snooze_timer = vim.defer_fn(function()
      snooze_timer = nil
      switch.snooze_until = nil
      refresh()
    end, minutes * 60000)
  end
  refresh()
end

--- Stops the server and starts it again for the buffers it served.
function M.restart()
  vim.lsp.enable(NAME, false)
  local function again(tries)
    if #vim.lsp.get_clients({ name = NAME }) > 0 and tries > 0 then
      return vim.defer_fn(function() again(tries - 1) end, 50)
    end
    vim.lsp.enable(NAME)
  end
  again(200)
end

-- -- keys ------------------------------------------------------------------------------------

--- The mapping each key had before this plugin mapped it, per buffer, by mode .. lhs.
local previous = {} ---@type table<integer, table<string, table>>

--- Does what `lhs` did in `mode` before it was mapped here: its previous mapping (a Lua
--- callback, an expression or keys, remapped if it was) or else the key itself.
local function fall_through(bufnr, mode, lhs)
  local prev = (previous[bufnr] or {})[mode .. lhs]
  if not prev then
    return api.nvim_feedkeys(vim.keycode(lhs), 'ni', false)
  end
  local keys
  if prev.callback then
    keys = prev.callback()
    if prev.expr ~= 1 then
      return
    end
  else
    keys = prev.expr == 1 and vim.fn.eval(prev.rhs) or prev.rhs
  end
  if type(keys) ~= 'string' or keys == '' then
    return
  end
  if prev.expr ~= 1 or prev.replace_keycodes == 1 then
    keys = vim.keycode(keys)
  end
  api.nvim_feedkeys(keys, prev.noremap == 1 and 'ni' or 'mi', false)
end

local function map_keys(bufnr)
  local km = M.config.keymaps
  previous[bufnr] = previous[bufnr] or {}
  -- `passes`: the key always goes on to do what it did (after `fn`), guard or not.
  local function map(mode, lhs, fn, desc, passes)
    if not lhs then
      return
    end
    local prev = vim.fn.maparg(lhs, mode, false, true)
    if next(prev) and not (prev.desc or ''):match('^completer:') then
      previous[bufnr][mode .. lhs] = prev
    end
    vim.keymap.set(mode, lhs, function()
      if not passes and guarded(bufnr) then
        return -- a ghost was just taken back: this press was meant for it
      end
      if not fn() or passes then
        fall_through(bufnr, mode, lhs)
      end
    end, { buffer = bufnr, desc = desc })
  end
  local function imap(lhs, fn, desc)
    map('i', lhs, fn, desc)
  end
  imap(km.accept, function() return M.accept() or next_edit.accept(bufnr) end,
    'completer: accept ghost text or next edit')
  map('n', km.next_edit_accept, function() return next_edit.accept(bufnr) end, 'completer: apply next edit')
  map('n', km.next_edit_dismiss, function() return next_edit.dismiss(bufnr) end, 'completer: dismiss next edit')
  map('i', km.next_edit_dismiss, function() return next_edit.dismiss(bufnr) end,
    'completer: dismiss next edit, then the key as usual', true)
  imap(km.accept_word, function() return M.accept_partial('word') end, 'completer: accept next word')
  imap(km.accept_line, function() return M.accept_partial('line') end, 'completer: accept next line')
  if km.next then
    vim.keymap.set('i', km.next, function() vim.lsp.inline_completion.select({ count = 1 }) end,
      { buffer = bufnr, desc = 'completer: next candidate' })
  end
  if km.prev then
    vim.keymap.set('i', km.prev, function() vim.lsp.inline_completion.select({ count = -1 }) end,
      { buffer = bufnr, desc = 'completer: previous candidate' })
  end
end

--- The previous mapping `lhs` falls through to in `bufnr` and `mode` (default insert; maparg's
--- dict), or nil.
function M.previous_mapping(bufnr, lhs, mode)
  return (previous[vim._resolve_bufnr(bufnr)] or {})[(mode or 'i') .. lhs]
end

--- Unknown keys and values of the wrong type are dropped (the server then uses its default)
--- with one warning, so a typo does not stop the server from starting.
function M.check_init_options(opts)
  local ok, bad = {}, {}
  for k, v in pairs(opts or {}) do
    local want = M.option_types[k]
    if want == nil then
      table.insert(bad, ('%s (unknown option)'):format(k))
    elseif type(v) ~= want then
      table.insert(bad, ('%s (expected %s, got %s)'):format(k, want, type(v)))
    else
      ok[k] = v
    end
  end
  table.sort(bad)
  return ok, bad
end

-- -- the LSP client ----------------------------------------------------------------------------

local function define_highlight()
  api.nvim_set_hl(0, 'CompleterGhost', vim.tbl_extend('force', M.config.highlight, { default = true }))
end

--- `win` draws ComplHint (Neovim's ghost text) as CompleterGhost, unless its 'winhighlight'
--- already maps ComplHint.
local function ghost_window(win)
  local wh = vim.wo[win].winhighlight
  if not wh:find('ComplHint:', 1, true) then
    wh = (wh == '' and '' or wh .. ',') .. 'ComplHint:CompleterGhost'
    api.nvim_set_option_value('winhighlight', wh, { scope = 'local', win = win })
  end
end

local function create_autocmds()
  local group = api.nvim_create_augroup('completer', { clear = true })
  define_highlight()
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = define_highlight })
  api.nvim_create_autocmd('BufWinEnter', {
    group = group,
    callback = function(ev)
      if get_client(ev.buf) then
        ghost_window(api.nvim_get_current_win())
      end
    end,
  })
  api.nvim_create_autocmd('LspProgress', { group = group, callback = on_progress })
  api.nvim_create_autocmd('InsertLeave', {
    group = group,
    callback = function(ev)
      local client = get_client(ev.buf)
      if client then
        reject_pending(client_notify(client), vim.uri_from_bufnr(ev.buf))
      end
    end,
  })
end

local function on_attach(client, bufnr)
  if not client.rpc.completer_wrapped then
    wrap_rpc(client.rpc)
    client.rpc.completer_wrapped = true
  end
  if state.phase == 'starting' then
    -- The load may have begun before this client saw its progress token: ask where it is.
    client:request('completer/stats', vim.empty_dict(), function(_, stats)
      if state.phase ~= 'starting' or next(tokens_in_flight) ~= nil or type(stats) ~= 'table' then
        return
      end
      local engine = tostring(stats.engine)
      state = engine == 'loading' and { phase = 'loading', title = 'loading models' }
        or engine:match('^failed') and { phase = 'failed', message = engine }
        or { phase = 'ready' }
    end)
  end
  map_keys(bufnr)
  next_edit.attach(bufnr)
  for _, win in ipairs(vim.fn.win_findbuf(bufnr)) do
    ghost_window(win)
  end
  refresh()
end

--- The `vim.lsp.config` table for completer-lsp from `M.config` (the defaults until `setup()`).
--- `lsp/completer.lua` returns it, so `vim.lsp.enable('completer')` works without `setup()`.
function M.lsp_config()
  local init_options, bad = M.check_init_options(M.config.init_options)
  if #bad > 0 then
    vim.notify('completer: ignoring init_options ' .. table.concat(bad, ', '), vim.log.levels.WARN)
  end
  return {
    cmd = M.config.cmd,
    filetypes = M.config.filetypes,
    root_markers = M.config.root_markers,
    init_options = init_options,
    commands = { [ACCEPT_CMD] = on_accepted },
    before_init = function()
      state = { phase = 'starting' }
      create_autocmds()
    end,
    on_attach = on_attach,
    on_exit = function(_, _, client_id)
      state = { phase = 'stopped' }
      tokens_in_flight = {}
      sent_enable[client_id] = nil
    end,
  }
end

--- Configure and enable the server. Options (all optional): cmd, init_options, filetypes,
--- root_markers, keymaps, progress, disabled_filetypes; see `M.defaults`.
function M.setup(opts)
  if vim.fn.has('nvim-0.12') == 0 then
    vim.notify('completer: needs Neovim >= 0.12 (vim.lsp.inline_completion)', vim.log.levels.ERROR)
    return
  end
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  for _, ft in ipairs(M.config.disabled_filetypes) do
    switch.filetypes[ft] = true
  end
  switch.enabled = M.config.init_options.enable ~= false
  vim.lsp.config(NAME, M.lsp_config())
  vim.lsp.enable(NAME)
end

--- A request to the server without parameters, answered synchronously: its result, or nil and why.
local function server_request(method, bufnr, timeout_ms)
  local client = get_client(bufnr or 0) or vim.lsp.get_clients({ name = NAME })[1]
  if not client then
    return nil, 'completer-lsp is not running'
  end
  local reply, err = client:request_sync(method, vim.empty_dict(), timeout_ms, bufnr or 0)
  if not reply then
    return nil, err
  end
  if reply.err then
    return nil, reply.err.message
  end
  return reply.result
end

--- Counters the server keeps (`completer/stats`), fetched synchronously.
function M.server_stats(bufnr, timeout_ms)
  return server_request('completer/stats', bufnr, timeout_ms or 2000)
end

--- The server's checks of this session's setup (`completer/doctor`, the JSON of `completer doctor
--- --json`: usable, checks, first_problem), fetched synchronously (its trial completion takes a
--- moment; a model load under way is waited for).
function M.doctor(bufnr, timeout_ms)
  return server_request('completer/doctor', bufnr, timeout_ms or 60000)
end

local MARKS = { ok = '[ok]  ', warn = '[warn]', fail = '[FAIL]', skip = '[skip]' }

--- A doctor report as lines: one per check with its mark, then the verdict and the first problem's fix.
function M.doctor_lines(report)
  if type(report) ~= 'table' or type(report.checks) ~= 'table' then  -- null: a server without it
    return { 'the server does not answer completer/doctor: run `completer doctor` in a shell' }
  end
  local width = 0
  for _, c in ipairs(report.checks) do
    width = math.max(width, #c.name)
  end
  local lines = {}
  for _, c in ipairs(report.checks) do
    table.insert(lines, ('%s %s  %s'):format(MARKS[c.status] or ('[' .. c.status .. ']'),
      c.name .. (' '):rep(width - #c.name), c.message))
  end
  local p = report.first_problem
  local verdict = report.usable and 'usable' or 'not usable'
  if type(p) == 'table' then
    verdict = ('%s; %s: %s: %s'):format(verdict, p.status == 'fail' and 'first problem' or 'to look at', p.name,
      p.message)
  end
  table.insert(lines, verdict)
  if type(p) == 'table' and p.fix ~= '' then
    table.insert(lines, '  fix: ' .. p.fix)
  end
  return lines
end

return M
