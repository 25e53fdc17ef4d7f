-- completer-lsp for `vim.lsp.config` users: `vim.lsp.enable('completer')` starts it with the
-- plugin's defaults (accept keys, feedback, :Completer switches); override fields with
-- `vim.lsp.config('completer', { cmd = {...}, init_options = {...} })`.
-- `require('completer').setup(opts)` does both with the plugin's own options.
return require('completer').lsp_config()
