"""The language server: LSP over stdio/TCP/WebSocket on top of `completer.pipeline` (no torch,
no engine internals here)."""
