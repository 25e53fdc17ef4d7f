"""The user's recent edits, as the next-edit prompt reads them (issue 24): `EditHistory`."""
from .history import Change, EditHistory, Event, change_from_lsp

__all__ = ["Change", "EditHistory", "Event", "change_from_lsp"]
