-- :Completer, the plugin's one user command. Nothing starts until require('completer').setup{}
-- is called (or vim.lsp.enable('completer'), see lsp/completer.lua).
if vim.g.loaded_completer then
  return
end
vim.g.loaded_completer = true

local SCOPES = { buffer = true, filetype = true }

--- Subcommand → function(args after it). See :help :Completer.
local subcommands = {
  enable = function(scope) require('completer').enable(true, scope) end,
  disable = function(scope) require('completer').enable(false, scope) end,
  toggle = function(scope) require('completer').enable(nil, scope) end,
  snooze = function(minutes)
    local m = tonumber(minutes or '30')
    if not m or m < 0 then
      error(('completer: snooze takes minutes, not %q'):format(minutes))
    end
    require('completer').snooze(m)
  end,
  status = function()
    local c = require('completer')
    local on, why = c.allowed(0)
    local ne = require('completer.next_edit').counters
    vim.notify(('%s | %s here | offered %d, accepted %d, partial %d, rejected %d | next edits shown %d, accepted %d'):format(
      c.status_text(), on and 'on' or why, c.counters.offered, c.counters.accepted, c.counters.partial,
      c.counters.rejected, ne.shown, ne.accepted))
  end,
  restart = function() require('completer').restart() end,
  doctor = function()
    local c = require('completer')
    local report, err = c.doctor()
    if not report then
      error('completer: ' .. tostring(err) .. ' (run `completer doctor` in a shell)')
    end
    local level = not report.usable and vim.log.levels.ERROR
      or type(report.first_problem) == 'table' and vim.log.levels.WARN or vim.log.levels.INFO
    vim.notify(table.concat(c.doctor_lines(report), '\n'), level)
  end,
  stats = function()
    local stats, err = require('completer').server_stats()
    if not stats then
      error('completer: ' .. tostring(err))
    end
    vim.notify('completer-lsp: ' .. vim.inspect(stats))
  end,
}

vim.api.nvim_create_user_command('Completer', function(cmd)
  local name, arg = cmd.fargs[1] or 'status', cmd.fargs[2]
  local fn = subcommands[name]
  local ok, err = true, nil
  if not fn then
    err = ('completer: unknown subcommand %q (%s)'):format(name,
      table.concat(vim.tbl_keys(subcommands), ', '))
  elseif arg and name ~= 'snooze' and not SCOPES[arg] then
    err = ('completer: %s takes buffer or filetype, not %q'):format(name, arg)
  else
    ok, err = pcall(fn, arg)
  end
  if not ok or err then
    vim.notify(tostring(err), vim.log.levels.ERROR)
  end
end, {
  nargs = '*',
  desc = 'completer: enable|disable|toggle [buffer|filetype], snooze [min], status, restart, stats, doctor',
  complete = function(_, line)
    local words = vim.split(line, '%s+', { trimempty = false })
    if #words <= 2 then
      local names = vim.tbl_keys(subcommands)
      table.sort(names)
      return names
    end
    if #words == 3 and (words[2] == 'enable' or words[2] == 'disable' or words[2] == 'toggle') then
      return { 'buffer', 'filetype' }
    end
    return {}
  end,
})
