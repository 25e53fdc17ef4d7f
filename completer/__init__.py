"""completer: an IDE code-completion backend (see README.md)."""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)
