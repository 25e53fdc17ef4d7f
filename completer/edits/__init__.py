"""Next-edit suggestions (issue 24): the user's recent edits (`EditHistory`), the editable
region around the cursor (region.py), the prompt formats (formats.py), the model's rewrite diffed
into edits (diff.py) and the prediction that ties them together (predict.py)."""
from .history import Change, EditHistory, Event, change_from_lsp

__all__ = ["Change", "EditHistory", "Event", "change_from_lsp"]
