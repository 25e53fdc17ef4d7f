"""A scripted EngineClient (no model, no torch): it replays a canned completion through the
caller's stop rule and records what it was asked."""
from __future__ import annotations

from completer.client import Completion


class Scripted:
    """An EngineClient that replays a canned completion through the caller's stop_text."""

    def __init__(self, reply: str, budget: int = 200):
        self.reply, self.budget, self.calls, self.warm = reply, budget, [], []

    def count_tokens(self, text: str) -> int:
        return (len(text) + 3) // 4

    def prompt_budget(self, max_new=None) -> int:
        return self.budget

    def warmup(self, prefix, suffix="", *, doc_key, extra=()):
        self.warm.append((prefix, suffix, doc_key))
        return self.count_tokens(prefix + suffix)

    def forget(self, doc_key):
        pass

    def feedback(self, doc_key, text, accepted, accepted_chars=None):
        pass

    def warm_start(self):
        return 0.0

    def stats(self):
        return {"calls": len(self.calls)}

    def close(self):
        pass

    def reconfigure(self, **values):
        pass

    def rewrite(self, request, *, fmt="auto", doc_key="_default", max_new=None, speculative=True, cancel=None):
        return Completion(request.region, stop_reason="eos")  # no next edit: the region as it is

    def complete(self, prefix, suffix="", *, doc_key="_default", max_new=None, stop_text=None, cancel=None,
                 on_text=None, node_kind=None, extra=(), n=None):
        self.calls.append({"prefix": prefix, "suffix": suffix, "doc_key": doc_key, "max_new": max_new,
                           "cancel": cancel, "node_kind": node_kind, "extra": tuple(extra), "n": n})
        text = ""
        for ch in self.reply:  # one "token" per character, like a decode loop
            text += ch
            if on_text:
                on_text(ch)
            if stop_text is not None and (k := stop_text(text)) is not None:
                text = text[:k]
                break
        return Completion(text, new_tokens=len(text), ttft_ms=1.0, total_ms=2.0, prompt_tokens=10,
                          stop_reason="stop" if len(text) < len(self.reply) else "eos")
