--- Next-edit suggestions from `completer-lsp` (`completer/nextEdit`): where the user's next
--- change probably goes (a rename carried to the next uses, an argument added at a call), shown
--- in place with extmarks and applied with the accept key.
---
--- Asking: `next_edit_debounce_ms` after the last change to the buffer (insert or normal mode),
--- and at once after the user accepts a completion or a next edit (chained suggestions). A new
--- change cancels the request in flight and dismisses what is shown (reported as rejected).
---
--- Drawing (namespace `completer.next_edit`): removed text struck through (`CompleterEditDelete`),
--- inserted text after it as inline `virt_text` (`CompleterEditInsert`), inserted lines as
--- `virt_lines`; an edit outside the window is announced at the end of the cursor's line.
---
--- Staleness: a reply computed on another document version than the buffer's is dropped; a
--- shown suggestion is applied only while the buffer is at the version it was computed on.
---
--- Jumps (the server's `jump`: the next place past the region, in this file or another, loaded
--- or not): a virtual-text hint at the cursor's line with the key, where it goes and what it
--- changes there; the key opens the target there and asks at once (one key to go, one to apply).
---
--- Keys: the accept key (insert mode) and `keymaps.next_edit_accept` (normal mode) jump to an
--- edit outside the window, or apply it; `keymaps.next_edit_dismiss` (<Esc>) dismisses, in normal
--- mode and in insert mode (where the key then leaves insert mode as usual). Without a
--- suggestion they fall through as the accept keys do.
local M = {}

local api = vim.api
local ns = api.nvim_create_namespace('completer.next_edit')

local DEFAULT_DEBOUNCE_MS = 300

--- Per buffer: the debounce timer, the request in flight, the suggestion shown
--- ({ id, version, edits, client_id }), the changedtick of our own apply.
local bufs = {} ---@type table<integer, table>

--- Clients whose server does not know completer/nextEdit (an older completer-lsp): not asked again.
local unsupported = {} ---@type table<integer, true>

--- What this client did, for `:Completer status` and the tests.
M.counters = { requests = 0, shown = 0, accepted = 0, rejected = 0, stale = 0, jumps = 0 }

local function buf_state(bufnr)
  bufs[bufnr] = bufs[bufnr] or {}
  return bufs[bufnr]
end

local function completer()
  return require('completer')
end

--- next_edit and next_edit_debounce_ms are server options: the client reads the same values.
local function enabled(bufnr)
  local opts = completer().config.init_options or {}
  return opts.next_edit ~= false and completer().allowed(bufnr)
end

local function debounce_ms()
  return (completer().config.init_options or {}).next_edit_debounce_ms or DEFAULT_DEBOUNCE_MS
end

local function version(bufnr)
  return vim.lsp.util.buf_versions[bufnr]
end

local function define_highlights()
  local hl = completer().config.next_edit_highlight
  api.nvim_set_hl(0, 'CompleterEditInsert', vim.tbl_extend('force', hl.insert, { default = true }))
  api.nvim_set_hl(0, 'CompleterEditDelete', vim.tbl_extend('force', hl.delete, { default = true }))
end

--- Byte column of an LSP position's character (in `encoding`) on row `row`, clamped to the line.
local function byte_col(bufnr, row, character, encoding)
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  return ok and math.min(col, #line) or #line
end

local function edit_rows(e)
  return e.range.start.line, e.range['end'].line
end

--- Edits sorted by position, or nil and why: a malformed edit, one past the buffer's end, overlaps.
local function check_edits(bufnr, result)
  if type(result) ~= 'table' or type(result.id) ~= 'string' or type(result.version) ~= 'number'
      or type(result.edits) ~= 'table' then
    return nil, 'expected {id, version, edits}'
  end
  local lines = api.nvim_buf_line_count(bufnr)
  local edits = {}
  for _, e in ipairs(result.edits) do
    local r = type(e) == 'table' and e.range
    if type(e.newText) ~= 'string' or type(r) ~= 'table' or type(r.start) ~= 'table' or type(r['end']) ~= 'table'
        or type(r.start.line) ~= 'number' or type(r['end'].line) ~= 'number' then
      return nil, 'bad edit ' .. vim.inspect(e):sub(1, 200)
    end
    local s, t = r.start, r['end']
    if s.line > t.line or (s.line == t.line and s.character > t.character) or t.line > lines
        or s.line < 0 or s.character < 0 then
      return nil, 'bad range ' .. vim.inspect(r)
    end
    table.insert(edits, e)
  end
  local j = result.jump
  if j ~= nil and j ~= vim.NIL then
    local r = type(j) == 'table' and j.range
    if type(j.uri) ~= 'string' or type(r) ~= 'table' or type(r.start) ~= 'table' or type(r.start.line) ~= 'number'
        or type(r.start.character) ~= 'number' or type(j.edits) ~= 'table'
        or (j.version ~= nil and j.version ~= vim.NIL and type(j.version) ~= 'number') then
      return nil, 'bad jump ' .. vim.inspect(j):sub(1, 200)
    end
  end
  table.sort(edits, function(a, b)
    local x, y = a.range.start, b.range.start
    return x.line < y.line or (x.line == y.line and x.character < y.character)
  end)
  for i = 2, #edits do
    local prev, cur = edits[i - 1].range['end'], edits[i].range.start
    if cur.line < prev.line or (cur.line == prev.line and cur.character < prev.character) then
      return nil, 'overlapping edits'
    end
  end
  return edits
end

local function in_window(win, row)
  return row + 1 >= vim.fn.line('w0', win) and row + 1 <= vim.fn.line('w$', win)
end

--- Draws suggestion `s` in `bufnr` with extmarks.
local function draw(bufnr, s)
  api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  local client = vim.lsp.get_client_by_id(s.client_id)
  local enc = client and client.offset_encoding or 'utf-16'
  local last = api.nvim_buf_line_count(bufnr)
  for _, e in ipairs(s.edits) do
    local srow, erow = edit_rows(e)
    local scol = srow < last and byte_col(bufnr, srow, e.range.start.character, enc) or 0
    local ecol = erow < last and byte_col(bufnr, erow, e.range['end'].character, enc) or 0
    if erow >= last then -- the end of the buffer: after its last line
      erow, ecol = last - 1, #(api.nvim_buf_get_lines(bufnr, -2, -1, false)[1] or '')
    end
    if srow ~= erow or scol ~= ecol then
      api.nvim_buf_set_extmark(bufnr, ns, srow, scol, { end_row = erow, end_col = ecol,
        hl_group = 'CompleterEditDelete', priority = 300 })
    end
    local new = vim.split(e.newText, '\n', { plain = true })
    if #new > 1 and ecol == 0 and new[#new] == '' then
      -- whole lines inserted before row erow: drawn as lines of their own
      local vl = {}
      for i = 1, #new - 1 do
        vl[i] = { { new[i], 'CompleterEditInsert' } }
      end
      api.nvim_buf_set_extmark(bufnr, ns, erow, 0, { virt_lines = vl, virt_lines_above = true })
    elseif e.newText ~= '' then
      api.nvim_buf_set_extmark(bufnr, ns, erow, ecol, { virt_text = { { new[1], 'CompleterEditInsert' } },
        virt_text_pos = 'inline' })
      if #new > 1 then
        local vl = {}
        for i = 2, #new do
          vl[i - 1] = { { new[i], 'CompleterEditInsert' } }
        end
        api.nvim_buf_set_extmark(bufnr, ns, erow, ecol, { virt_lines = vl })
      end
    end
  end
  local win = vim.fn.bufwinid(bufnr)
  if #s.edits == 0 then -- the server's jump: where it goes, what it changes there, and the key
    if win ~= -1 then
      api.nvim_buf_set_extmark(bufnr, ns, api.nvim_win_get_cursor(win)[1] - 1, 0, {
        virt_text = { { M.jump_hint(s), 'CompleterEditInsert' } }, virt_text_pos = 'eol' })
    end
    return
  end
  local first = s.edits[1].range.start.line
  if win ~= -1 and not in_window(win, first) then
    local row = api.nvim_win_get_cursor(win)[1] - 1
    api.nvim_buf_set_extmark(bufnr, ns, row, 0, {
      virt_text = { { ('  ⇥ next edit at line %d'):format(first + 1), 'CompleterEditInsert' } },
      virt_text_pos = 'eol' })
  end
end

local function feedback(s, accepted)
  local client = vim.lsp.get_client_by_id(s.client_id)
  M.counters[accepted and 'accepted' or 'rejected'] = M.counters[accepted and 'accepted' or 'rejected'] + 1
  if client then
    client:notify('completer/feedback', { id = s.id, kind = 'nextEdit', accepted = accepted })
  end
end

--- Clears the suggestion shown in `bufnr` and reports it; false when none was shown.
local function drop(bufnr, accepted)
  local st = bufs[bufnr]
  local s = st and st.shown
  if not s then
    return false
  end
  st.shown = nil
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
  feedback(s, accepted)
  return true
end

local function cancel(bufnr)
  local st = bufs[bufnr]
  if st and st.inflight then
    local client = vim.lsp.get_client_by_id(st.inflight.client_id)
    if client then
      client:cancel_request(st.inflight.id)
    end
    st.inflight = nil
  end
end

--- The hint drawn for a jump-only suggestion: `  ⇥ <Tab> b.py:3 → fetch_all` (the file when
--- it is another one, the line, the new text there or that it needs the user's edit, the key).
function M.jump_hint(s)
  local j = s.jump
  local key = (completer().config.keymaps or {}).next_edit_accept or '<Tab>'
  local where = (j.uri == s.uri and '' or (vim.fs.basename(vim.uri_to_fname(j.uri)) .. ':')) .. (j.range.start.line + 1)
  local texts = {}
  for _, e in ipairs(j.edits) do
    table.insert(texts, e.newText)
  end
  local what = #texts > 0 and (' → ' .. table.concat(texts, ' ')) or ' (needs your edit)'
  local left = (type(s.left) == 'number' and s.left > 1) and ('  (' .. s.left .. ' left)') or ''
  return ('  ⇥ %s jump to %s%s%s'):format(key, where, what, left)
end

--- The suggestion shown in `bufnr` ({ id, version, edits, jump? }), or nil.
function M.shown(bufnr)
  local st = bufs[vim._resolve_bufnr(bufnr)]
  return st and st.shown
end

--- A reply for `bufnr`: shown unless empty, malformed, or computed on another version.
local function offer(bufnr, client, result)
  if result == nil or result == vim.NIL or not api.nvim_buf_is_valid(bufnr) then
    return
  end
  local edits, why = check_edits(bufnr, result)
  if not edits then
    vim.notify_once('completer/nextEdit: ' .. why, vim.log.levels.WARN)
    return
  end
  local jump = result.jump ~= vim.NIL and result.jump or nil
  if #edits == 0 and not jump then
    return
  end
  if result.version ~= version(bufnr) then
    M.counters.stale = M.counters.stale + 1
    return
  end
  drop(bufnr, false)
  local s = { id = result.id, version = result.version, edits = edits, client_id = client.id, jump = jump,
              left = result.left, uri = vim.uri_from_bufnr(bufnr) }
  buf_state(bufnr).shown = s
  M.counters.shown = M.counters.shown + 1
  draw(bufnr, s)
end

--- Asks the server for the next edit at the cursor of `bufnr` now.
function M.request(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local client = vim.lsp.get_clients({ name = 'completer', bufnr = bufnr })[1]
  local win = vim.fn.bufwinid(bufnr)
  if not client or unsupported[client.id] or win == -1 or not enabled(bufnr) then
    return
  end
  cancel(bufnr)
  local st = buf_state(bufnr)
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  local token = {}
  st.token = token
  -- bufnr: the client sends the buffer's pending didChange first, so the version matches
  local ok, id = client:request('completer/nextEdit', params, function(err, result)
    if st.token ~= token then
      return -- a newer change or request took over
    end
    st.inflight = nil
    if err then
      if err.code == -32601 then -- MethodNotFound
        unsupported[client.id] = true
      elseif err.code ~= -32800 then -- RequestCancelled
        vim.notify_once('completer/nextEdit: ' .. tostring(err.message), vim.log.levels.WARN)
      end
      return
    end
    offer(bufnr, client, result)
  end, bufnr)
  if ok then
    st.inflight = { id = id, client_id = client.id }
    M.counters.requests = M.counters.requests + 1
  end
end

local function schedule(bufnr, ms)
  local st = buf_state(bufnr)
  if st.timer then
    st.timer:stop()
  else
    st.timer = vim.uv.new_timer()
  end
  st.timer:start(ms, 0, vim.schedule_wrap(function()
    if api.nvim_buf_is_valid(bufnr) then
      M.request(bufnr)
    end
  end))
end

--- The buffer changed: unless it was our own apply, what is shown goes and the wait restarts.
local function changed(bufnr)
  local st = buf_state(bufnr)
  if st.own_tick == api.nvim_buf_get_changedtick(bufnr) then
    return
  end
  st.token = nil
  cancel(bufnr)
  drop(bufnr, false)
  if enabled(bufnr) then
    schedule(bufnr, debounce_ms())
  elseif st.timer then
    st.timer:stop()
  end
end

--- The user accepted a completion or an edit in `bufnr`: ask at once (the change it made is
--- not the user's own typing, which would restart the wait).
function M.chained(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  buf_state(bufnr).own_tick = api.nvim_buf_get_changedtick(bufnr)
  schedule(bufnr, 0)
end

--- The accept key: jumps to a suggestion outside the window, or applies it. False when none is
--- shown (the key then falls through); true also when a stale one was dropped.
function M.accept(bufnr)
  bufnr = vim._resolve_bufnr(bufnr)
  local st = bufs[bufnr]
  local s = st and st.shown
  if not s then
    return false
  end
  if s.version ~= version(bufnr) then
    M.counters.stale = M.counters.stale + 1
    drop(bufnr, false)
    return true
  end
  local client = vim.lsp.get_client_by_id(s.client_id)
  local win = vim.fn.bufwinid(bufnr)
  if #s.edits == 0 then
    return M.go(bufnr, s)
  end
  local first = s.edits[1].range.start
  if win ~= -1 and not in_window(win, first.line) then
    api.nvim_win_set_cursor(win, { first.line + 1, byte_col(bufnr, first.line, first.character,
      client and client.offset_encoding or 'utf-16') })
    draw(bufnr, s)
    return true
  end
  drop(bufnr, true)
  -- The cursor goes after the last edit: a mark at its end moves with the text put there.
  local last = s.edits[#s.edits].range['end']
  local enc = client and client.offset_encoding or 'utf-16'
  local mark = last.line < api.nvim_buf_line_count(bufnr)
    and api.nvim_buf_set_extmark(bufnr, ns, last.line, byte_col(bufnr, last.line, last.character, enc), {})
  vim.lsp.util.apply_text_edits(vim.deepcopy(s.edits), bufnr, enc)
  if mark and win ~= -1 then
    local pos = api.nvim_buf_get_extmark_by_id(bufnr, ns, mark, {})
    api.nvim_buf_del_extmark(bufnr, ns, mark)
    if pos[1] then
      api.nvim_win_set_cursor(win, { pos[1] + 1, pos[2] })
    end
  end
  M.chained(bufnr)
  return true
end

--- Follows the server's jump of suggestion `s` shown in `bufnr`: refused when its target is
--- loaded at another version than the answer named; else the target is opened in the window
--- (a file not loaded is read from disk), the cursor put at the place, and the server asked
--- there at once — the next accept applies that answer, made for the text as it is then.
function M.go(bufnr, s)
  local j = s.jump
  local target = vim.uri_to_bufnr(j.uri)
  local loaded = api.nvim_buf_is_loaded(target)
  if loaded and type(j.version) == 'number' and version(target) ~= nil and version(target) ~= j.version then
    M.counters.stale = M.counters.stale + 1
    drop(bufnr, false)
    return true
  end
  drop(bufnr, true)
  M.counters.jumps = M.counters.jumps + 1
  if target ~= bufnr then
    api.nvim_win_set_buf(0, target) -- loads it (BufRead, FileType: the server attaches)
  end
  local client = vim.lsp.get_client_by_id(s.client_id)
  local row = math.min(j.range.start.line, api.nvim_buf_line_count(target) - 1)
  api.nvim_win_set_cursor(0, { row + 1, byte_col(target, row, j.range.start.character,
    client and client.offset_encoding or 'utf-16') })
  schedule(target, 0)
  return true
end

--- Dismisses the suggestion shown in `bufnr`; false when none was.
function M.dismiss(bufnr)
  return drop(vim._resolve_bufnr(bufnr), false)
end

--- Watches `bufnr` (attached to the server) for changes.
function M.attach(bufnr)
  define_highlights()
  local group = api.nvim_create_augroup('completer.next_edit.' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'TextChangedP' }, {
    group = group, buffer = bufnr, callback = function() changed(bufnr) end,
  })
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = define_highlights })
  api.nvim_create_autocmd({ 'BufUnload', 'LspDetach' }, {
    group = group, buffer = bufnr,
    callback = function(ev)
      if ev.event == 'LspDetach' and vim.lsp.get_client_by_id(ev.data.client_id).name ~= 'completer' then
        return
      end
      cancel(bufnr)
      drop(bufnr, false)
      local st = bufs[bufnr]
      if st and st.timer then
        st.timer:stop()
        st.timer:close()
      end
      bufs[bufnr] = nil
      api.nvim_del_augroup_by_id(group)
    end,
  })
end

M.namespace = ns

return M
