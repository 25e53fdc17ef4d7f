"""completer/syntax/lang.py: query captures come back in document order, whatever order
tree-sitter returns them in after a re-parse (the prompt header packs imports in this order)."""
from __future__ import annotations

from completer.documents import Document
from completer.syntax.lang import captures

IMPORTS = "".join(f"import mod{i}\nfrom pkg{i}.sub import name{i} as alias{i}\n" for i in range(30))


def test_captures_are_in_document_order_after_every_reparse():
    doc = Document("file:///t.py", IMPORTS + "\n\ndef f():\n    return 1\n", "python")
    end = len(doc.text)
    for i in range(20):  # incremental re-parses: type at the end, then take it back
        doc.apply_change((doc.position_at(end), doc.position_at(end)), f"x{i}")
        doc.apply_change((doc.position_at(end), doc.position_at(end + 2 + len(str(i)) - 1)), "")
        snap = doc.snapshot()
        for name, nodes in captures(snap, "imports", 0, len(snap.text.encode())).items():
            starts = [(n.start_byte, n.end_byte) for n in nodes]
            assert starts == sorted(starts), f"{name} captures out of order after re-parse {i}"
