"""The workspace index and cross-file retrieval (issue 22): per file, the definitions and imports
read by tree-sitter queries (`queries/<language>/symbols.scm`, `bindings.scm`); at the cursor,
the definitions the code there uses, resolved through the file's imports, and snippets of recent
files like it, under one token budget. No torch: it runs in the language server's process."""
from ..config import WorkspaceOptions
from .files import find_root
from .index import WorkspaceIndex, estimate_tokens
from .retrieve import Snippet

__all__ = ["Snippet", "WorkspaceIndex", "WorkspaceOptions", "estimate_tokens", "find_root"]
