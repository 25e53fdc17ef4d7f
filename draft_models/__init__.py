"""Drafters and the recipe that trains the embedded default model pair (no LSP, no engine)."""
from pathlib import Path

DEFAULT_DIR = Path(__file__).parent / "default"
DEFAULT_TARGET = DEFAULT_DIR / "target"
DEFAULT_DRAFT = DEFAULT_DIR / "draft"
