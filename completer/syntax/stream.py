"""What of a completion may be shown while it is still being generated.

An editor draws streamed text as ghost text at once; if the final (post-processed) text then
drops part of it, the ghost shrinks or vanishes under the user's Tab. So the stream carries only
text the end cannot take back, and the end keeps what was shown:

- Only complete lines are shown before the stop fires. The degenerate rule drops a whole line
  when a run starts anywhere in it, and the syntax stop cuts at line starts, so a line is at risk
  until its newline comes (a single-line completion therefore appears with its `done`).
- A complete line is held back while some continuation could still cut it: a line or block of
  up to 4 lines repeated (`degenerate._lines` keeps only the first copy). The stop is asked about
  the worst continuation of each period (the last p lines repeated), so the rule stays the stop's.
- What is shown is `postprocess` of those lines (reindented, suffix lines dropped, trimmed to
  parse), the same function as the end uses; a newer result that does not extend what was
  shown is not sent.
- At the end, `settle` keeps the final text when it extends what was shown, else what was shown
  (it passed the same post-processing on a prefix of the same completion; the reason says so).
"""
from __future__ import annotations

from collections.abc import Callable

from ..config import SyntaxOptions
from ..documents import Snapshot
from .gate import Mode
from .postprocess import Post, postprocess
from .stop import make_stop

REPEAT_PERIODS = (1, 2, 3, 4)  # block lengths degenerate._lines looks for
KEPT_SHOWN = "kept what was shown"
NOTHING = Post("", "")


def shown_text(snap: Snapshot, offset: int, raw: str, mode: Mode, opts: SyntaxOptions = SyntaxOptions()) -> Post:
    """What an editor may show for the raw completion `raw` generated so far (not finished):
    post-processed complete lines that no continuation can cut (text "" when none are)."""
    nl = raw.rfind("\n")
    if mode is Mode.EMPTY or nl < 0:
        return NOTHING
    done = raw[:nl + 1]
    lines = done.split("\n")[:-1]
    stop = make_stop(snap, offset, mode, opts)  # a fresh one: asking it records a reason
    futures = [done] + [done + "".join(lines[len(lines) - p + j % p] + "\n" for j in range(2 * p))
                        for p in REPEAT_PERIODS if p <= len(lines)]
    keep = min((cut for text in futures if (cut := stop(text)) is not None), default=len(done))
    kept = done[:min(keep, len(done))]
    return postprocess(snap, offset, kept, mode, opts.parse_check) if kept.strip() else NOTHING


class Stream:
    """Feeds `send` the deltas of `shown_text` as raw deltas arrive (the engine's `on_text`);
    `settle` makes the final post-processed result start with everything sent."""

    def __init__(self, snap: Snapshot, offset: int, mode: Mode, opts: SyntaxOptions, send: Callable[[str], None]):
        self.snap, self.offset, self.mode, self.opts, self.send = snap, offset, mode, opts, send
        self.raw = ""
        self.shown = NOTHING  # what was sent, as post-processed
        self.lines = 0  # complete raw lines last judged

    def feed(self, delta: str) -> None:
        self.raw += delta
        lines = self.raw.count("\n")
        if lines == self.lines:
            return  # only a new complete line can settle more
        self.lines = lines
        shown = shown_text(self.snap, self.offset, self.raw, self.mode, self.opts)
        if len(shown.text) > len(self.shown.text) and shown.text.startswith(self.shown.text):
            self.send(shown.text[len(self.shown.text):])
            self.shown = shown

    def settle(self, post: Post) -> Post:
        """The final result: `post` when it extends what was shown, else what was shown."""
        if post.text.startswith(self.shown.text):
            return post
        s = self.shown
        return Post(s.text, ", ".join(r for r in (s.reason, KEPT_SHOWN) if r), s.errors_before, s.errors_after,
                    post.parses)
