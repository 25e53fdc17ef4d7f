"""The syntax layer: gating, context selection, warmup triggers, the in-loop stop and
post-processing, from tree-sitter trees of `completer.documents`; queries are data in
`queries/<language>/*.scm`."""
from ..config import SyntaxOptions
from .context import Context, Span, select_context
from .gate import Decision, Mode, gate, node_kind
from .postprocess import Post, postprocess
from .stop import make_stop
from .triggers import detect as detect_triggers

__all__ = ["Context", "Decision", "Mode", "Post", "Span", "SyntaxOptions", "detect_triggers", "gate",
           "make_stop", "node_kind", "postprocess", "select_context"]
