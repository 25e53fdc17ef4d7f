"""`LlamaCpp`: llama-server's native `/infill` behind the `EngineClient` interface.

The server builds the FIM prompt from the model's own FIM tokens (input_prefix, input_suffix,
`input_extra` chunks for other files). Each document gets its own slot (`id_slot`, a small LRU
map over the server's slots) with `cache_prompt: true`, so the slot's KV cache follows the file
and a keystroke only computes the tokens that changed; a warmup is the same request with
`n_predict: 0`. Repository context (`extra`, client.Chunk) goes as `input_extra`
[{filename, text}], which the server places before the prefix with the model's file separator
(its own FIM template); the same chunks in the same order keep the slot's cache. The sampling
options (temperature, top_p, seed) go with every request. Completions stream as SSE; the in-loop stop and `cancel` close the connection,
which the server takes as a cancel (the slot stops generating).

    llama-server -m model.gguf --port 8012 [-np 4] [--api-key KEY]
    completer-lsp --engine llamacpp:http://127.0.0.1:8012
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .. import confidence
from ..client import Chunk, Completion, EngineError, StopReason, StopText, prompt_budget
from ..edits.formats import EditPrompt, edit_budget, read_answer
from ..prompt import piece_text
from .transport import SAMPLING, Http, TokenMemo, edit_format, follow, live_options, set_gates


def _token_logprobs(ev: dict) -> list[tuple[str, float]]:
    """An /infill stream event's tokens with their log-probabilities (`n_probs`)."""
    return [(p.get("token") or "", float(p.get("logprob", 0.0))) for p in ev.get("completion_probabilities") or []]


STOP_TYPES = {"eos": StopReason.EOS, "limit": StopReason.LENGTH, "word": StopReason.STOP}  # llama-server's → ours


class LlamaCpp:
    def __init__(self, base: str, *, api_key: str | None = None, timeout_ms: int = 10000, retries: int = 2,
                 max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        self.http = Http(base, name="llama-server", api_key=api_key, timeout_ms=timeout_ms, retries=retries)
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self.min_confidence: float | None = None  # the confidence gate (completer/confidence.py): off unless set
        self.next_edit_min_confidence: float | None = None  # the next-edit gate: likewise
        self.ctx = 0          # per slot, from /props
        self.n_slots = 0
        self.model = ""
        self.slots: OrderedDict[str, int] = OrderedDict()  # doc → slot id, least recently used first
        self._lock = threading.Lock()
        self._memo = TokenMemo()
        self.counters = {"completions": 0, "rewrites": 0, "warmups": 0, "new_tokens": 0, "cached_tokens": 0,
                         "prefill_tokens": 0, "feedback_accepted": 0, "feedback_rejected": 0}

    # -- connection --------------------------------------------------------------------------
    def warm_start(self) -> float:
        """Read the server's context size and slot count from /props; milliseconds spent."""
        t0 = time.perf_counter()
        props = self.http.json("GET", "/props")
        try:
            ctx = int(props["default_generation_settings"]["n_ctx"])
            n_slots = int(props.get("total_slots") or 1)
            self.model = str(props.get("model_alias") or props.get("model_path") or "")
        except (KeyError, TypeError, ValueError, AttributeError):
            raise EngineError(code="internal", message=f"llama-server at {self.http.base}: /props has no "
                                                       "default_generation_settings.n_ctx (not a llama-server?)") from None
        with self._lock:
            if n_slots != self.n_slots:  # restarted with another -np: map documents afresh
                self.slots.clear()
            self.ctx, self.n_slots = ctx, n_slots
        self.http.broken = False
        return (time.perf_counter() - t0) * 1e3

    def reconfigure(self, **values: Any) -> None:
        """The options of `values` this client uses (engine_timeout_ms, engine_retries,
        max_new_tokens, temperature, top_p, seed) apply from the next request on; the others are
        the server's own (its model, slots, context) or the in-process engine's."""
        self.http.reconfigure(**values)
        for name, value in live_options(values, SAMPLING).items():
            setattr(self, name, value)
        set_gates(self, values)  # applied here, on the log-probabilities the server sends

    def _ready(self) -> None:
        """Read the server's setup before the first request, and again after a connection
        failed (it may have been restarted with another context size or slot count)."""
        if not self.ctx or self.http.broken:
            self.warm_start()

    def _slot(self, doc_key: str) -> int:
        """The document's slot: its own while it is among the n_slots most recently used."""
        with self._lock:
            if doc_key in self.slots:
                self.slots.move_to_end(doc_key)
                return self.slots[doc_key]
            used = set(self.slots.values())
            free = [s for s in range(self.n_slots) if s not in used]
            if free:
                slot = free[0]
            else:
                _, slot = self.slots.popitem(last=False)
            self.slots[doc_key] = slot
            return slot

    # -- the engine API ----------------------------------------------------------------------
    def _body(self, prefix: str, suffix: str, doc_key: str, n_predict: int, stream: bool,
              extra: Sequence[Chunk]) -> dict:
        body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": n_predict,
                "cache_prompt": True, "id_slot": self._slot(doc_key), "stream": stream,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}
        if extra:
            body["input_extra"] = [{"filename": c.path, "text": c.text} for c in extra]
        return body

    def complete(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
                 max_new: int | None = None, stop_text: StopText | None = None,
                 cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None,
                 node_kind: str | None = None,
                 extra: Sequence[Chunk] = (), n: int | None = None) -> Completion:
        t0 = time.perf_counter()
        self._ready()
        if cancel is not None and cancel.is_set():
            return Completion("", stop_reason=StopReason.CANCELLED)
        n = max_new or self.max_new_tokens
        gate = confidence.StreamGate(self.min_confidence)
        body = self._body(prefix, suffix, doc_key, n, True, extra)
        if gate.on:
            body["n_probs"] = 1  # each token's log-probability, for the confidence gate
        events = gate.events(self.http.stream("/infill", body, cancel, done=lambda ev: bool(ev.get("stop"))),
                             _token_logprobs, lambda ev, t: {**ev, "content": t, "stop": False})
        # with the gate on, the text is given once it is judged: a word it takes back was never shown
        text, last, why, ttft = follow(events, lambda ev: "" if ev.get("stop") else ev.get("content") or "",
                                       stop_text, None if gate.on else on_text, cancel, t0, n)
        if last.get("stop"):  # the final event: the server's own stop reason and timings
            text += last.get("content") or ""
        text, why, unsure, score = gate.finish(text, why, on_text)
        timings = last.get("timings") or {}
        cached, computed = int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0))
        new = int(last.get("tokens_predicted") or 0)
        total = (time.perf_counter() - t0) * 1e3
        c = self.counters
        c["completions"] += 1
        c["new_tokens"] += new
        c["cached_tokens"] += cached
        c["prefill_tokens"] += computed
        return Completion(text, new_tokens=new, target_forwards=new, accepted_per_forward=1.0 if new else 0.0,
                          ttft_ms=ttft if ttft is not None else total, total_ms=total,
                          prompt_tokens=cached + computed if timings else int(last.get("tokens_evaluated") or 0),
                          prefill_tokens=computed,
                          stop_reason=why or STOP_TYPES.get(last.get("stop_type", ""), StopReason.NONE),
                          confidence=score, unsure_text=unsure,
                          extra={"tokens_cached": cached, "id_slot": self.slots.get(doc_key),
                                 "server_ms": {k: timings[k] for k in ("prompt_ms", "predicted_ms") if k in timings}})

    def rewrite(self, request: EditPrompt, *, fmt: str = "auto", doc_key: str = "_default",
                max_new: int | None = None, speculative: bool = True,
                cancel: threading.Event | None = None) -> Completion:
        """The next-edit rewrite as a raw text prompt to `/completion` (greedy, the format's stops,
        the document's slot and prompt cache). The server speculates with its own draft model or
        n-gram mode when it was started with one; `speculative=False` asks it not to
        (`speculative.n_max: 0`). Its draft counts, when it reports them, give τ."""
        t0 = time.perf_counter()
        self._ready()
        f = edit_format(fmt, fim=None, model=self.model)
        if cancel is not None and cancel.is_set():
            return Completion("", stop_reason=StopReason.CANCELLED, edit_format=f.name, malformed=True)
        n = edit_budget(self.count_tokens(f.draft(request)), max_new)
        gate = confidence.StreamGate(self.next_edit_min_confidence)
        body = {"prompt": piece_text(f.prompt(request)), "n_predict": n, "temperature": 0.0, "cache_prompt": True,
                "id_slot": self._slot(doc_key), "stream": True, "stop": list(f.stops)}
        if not speculative:
            body["speculative.n_max"] = 0
        if gate.on:
            body["n_probs"] = 1  # each token's log-probability, for the next-edit gate
        events = gate.events(self.http.stream("/completion", body, cancel, done=lambda ev: bool(ev.get("stop"))),
                             _token_logprobs, lambda ev, t: {**ev, "content": t, "stop": False})
        text, last, why, ttft = follow(events, lambda ev: "" if ev.get("stop") else ev.get("content") or "",
                                       None, None, cancel, t0, n)
        self.counters["rewrites"] += 1
        if (no := confidence.refused_edit(gate, edit_format=f.name, speculative=speculative,
                                          total_ms=(time.perf_counter() - t0) * 1e3)) is not None:
            return no
        if last.get("stop"):
            text += last.get("content") or ""
        timings = last.get("timings") or {}
        new = int(last.get("tokens_predicted") or timings.get("predicted_n") or 0)
        accepted = int(timings.get("draft_n_accepted") or 0)
        forwards = max(new - accepted, 1 if new else 0)
        region = read_answer(f, text)
        self.counters["new_tokens"] += new
        total = (time.perf_counter() - t0) * 1e3
        return Completion(region or "", new_tokens=new, target_forwards=forwards,
                          accepted_per_forward=new / forwards if forwards else 0.0,
                          ttft_ms=ttft if ttft is not None else total, total_ms=total, speculative=speculative,
                          prompt_tokens=int(timings.get("cache_n", 0)) + int(timings.get("prompt_n", 0)),
                          prefill_tokens=int(timings.get("prompt_n", 0)),
                          stop_reason=why or STOP_TYPES.get(last.get("stop_type", ""), StopReason.NONE),
                          edit_format=f.name, malformed=region is None,
                          extra={"draft_n": int(timings.get("draft_n") or 0), "draft_n_accepted": accepted})

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        """Prefill the document's slot (`n_predict: 0`); returns the prompt tokens computed."""
        self._ready()
        r = self.http.json("POST", "/infill", self._body(prefix, suffix, doc_key, 0, False, extra))
        computed = int(((r.get("timings") or {}) if isinstance(r, dict) else {}).get("prompt_n", 0))
        self.counters["warmups"] += 1
        self.counters["prefill_tokens"] += computed
        return computed

    def forget(self, doc_key: str) -> None:
        """Free the document's slot mapping, and erase the slot's cache where the server allows it
        (it needs `--slot-save-path`; otherwise the slot is simply reused by the next document)."""
        with self._lock:
            slot = self.slots.pop(doc_key, None)
        if slot is None:
            return
        try:
            self.http.json("POST", f"/slots/{slot}?action=erase")
        except EngineError as e:
            if e.code not in ("bad_request", "internal"):  # 501 (not enabled) is fine; a dead server is not
                raise

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        """llama-server has no feedback endpoint: counted here (stats)."""
        self.counters["feedback_accepted" if accepted else "feedback_rejected"] += 1

    def count_tokens(self, text: str) -> int:
        """Exact, by the server's /tokenize; each distinct text once (LRU memo)."""
        return self._memo.get(text, self._tokenize) if text else 0

    def _tokenize(self, text: str) -> int:
        r = self.http.json("POST", "/tokenize", {"content": text})
        if not isinstance(r, dict) or not isinstance(r.get("tokens"), list):
            raise EngineError(code="internal", message=f"llama-server at {self.http.base}: /tokenize "
                                                       "answered without a token list")
        return len(r["tokens"])

    def prompt_budget(self, max_new: int | None = None) -> int:
        self._ready()
        return prompt_budget(self.ctx, max_new or self.max_new_tokens)

    def stats(self) -> dict:
        return {"engine": "llamacpp", "url": self.http.base, "model": self.model, "ctx": self.ctx,
                "slots": self.n_slots, "kv_cached_documents": len(self.slots), **self.counters,
                **self.http.counters}

    def close(self) -> None:
        """Nothing held open: every request has its own connection."""
