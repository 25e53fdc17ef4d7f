-- User commands for completer.nvim. Nothing starts until require('completer').setup{} is called.
if vim.g.loaded_completer then
  return
end
vim.g.loaded_completer = true

vim.api.nvim_create_user_command('CompleterStatus', function()
  local c = require('completer')
  print(('%s | offered %d, accepted %d, partial %d, rejected %d'):format(
    c.status_text(), c.counters.offered, c.counters.accepted, c.counters.partial, c.counters.rejected))
end, { desc = 'completer: load state and feedback counters of this session' })

vim.api.nvim_create_user_command('CompleterStats', function()
  local stats, err = require('completer').server_stats()
  if not stats then
    vim.notify('completer: ' .. tostring(err), vim.log.levels.ERROR)
    return
  end
  print(vim.inspect(stats))
end, { desc = 'completer: server counters (completer/stats)' })
