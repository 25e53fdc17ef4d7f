"""`TypeThrough`: client-side type-through for the remote engines that do not do it themselves
(llama-server, OpenAI-compatible servers; our `completer serve` does it in its engine): the rule
of completer/typethrough.py applied to the last completion of each document, whose rest is
returned without a request."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .. import typethrough
from ..client import Chunk, Completion, EngineClient, StopReason, StopText
from ..edits.formats import EditPrompt
from .transport import live_options

MAX_DOCS = 1024  # type-through remembers the last completion of this many documents


class TypeThrough:
    """An EngineClient around `inner` that serves typed-through completions itself."""

    def __init__(self, inner: EngineClient):
        self.inner = inner
        self.enabled = True  # the type_through option
        self.last: OrderedDict[str, tuple[str, str, str]] = OrderedDict()  # doc → (prefix, suffix, text)
        self._lock = threading.Lock()
        self.served = 0

    def reconfigure(self, **values: Any) -> None:
        """type_through turns this on or off from the next request on; the rest goes to the client."""
        live = live_options(values, ("type_through",))
        if "type_through" in live:
            with self._lock:
                self.enabled = live["type_through"]
                self.last.clear()
        self.inner.reconfigure(**values)

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None,
                 node_kind: str | None = None,
                 extra: Sequence[Chunk] = (), n: int | None = None) -> Completion:
        t0 = time.perf_counter()
        with self._lock:
            old = self.last.get(doc_key)
        if old is not None:
            rest = _typed_rest(old, prefix, suffix)
            if rest:
                with self._lock:
                    self.last[doc_key] = (prefix, suffix, rest)
                    self.served += 1
                if on_text is not None:
                    on_text(rest)
                ms = (time.perf_counter() - t0) * 1e3
                return Completion(rest, ttft_ms=ms, total_ms=ms, stop_reason=StopReason.TYPE_THROUGH,
                                  type_through=True)
        c = self.inner.complete(prefix, suffix, doc_key=doc_key, max_new=max_new, stop_text=stop_text,
                                cancel=cancel, on_text=on_text, node_kind=node_kind,
                                extra=extra, n=n)
        with self._lock:
            if self.enabled and c.text and c.stop_reason != StopReason.CANCELLED:
                self.last[doc_key] = (prefix, suffix, c.text)
                self.last.move_to_end(doc_key)
                while len(self.last) > MAX_DOCS:
                    self.last.popitem(last=False)
            else:
                self.last.pop(doc_key, None)
        return c

    def forget(self, doc_key: str) -> None:
        with self._lock:
            self.last.pop(doc_key, None)
        self.inner.forget(doc_key)

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        return self.inner.warmup(prefix, suffix, doc_key=doc_key, extra=extra)

    def rewrite(self, request: EditPrompt, **kw: Any) -> Completion:
        """Next edits are not typed through: the inner client's."""
        return self.inner.rewrite(request, **kw)

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        self.inner.feedback(doc_key, text, accepted, accepted_chars)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def prompt_budget(self, max_new: int | None = None) -> int:
        return self.inner.prompt_budget(max_new)

    def warm_start(self) -> float:
        return self.inner.warm_start()

    def stats(self) -> dict:
        return {**self.inner.stats(), "type_through": self.served}

    def close(self) -> None:
        self.inner.close()


def _typed_rest(old: tuple[str, str, str], prefix: str, suffix: str) -> str:
    """What remains of the old completion (prefix, suffix, text) after the characters typed
    since, or "" when this request is not the old one plus typing into it."""
    old_prefix, old_suffix, text = old
    typed = typethrough.typed(old_prefix, old_suffix, prefix, suffix)
    return "" if typed is None else typethrough.rest(text, typed)
