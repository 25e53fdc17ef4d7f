"""`OpenAI`: `/v1/completions` of any OpenAI-compatible server (vLLM, SGLang, llama-server, Ollama,
our own `completer serve`) behind the `EngineClient` interface.

The FIM prompt is built here from the model family's format (completer.fim.FIM_FORMATS;
`fim_format` names the family, "auto" reads it from the model name the server reports at
/v1/models); "suffix" sends OpenAI's `suffix` field and lets the server build it (our
`completer serve`, Ollama). Repository context (`extra`, client.Chunk) is rendered into the
prompt by completer.prompt, the prompt builder (the family's file separators, else a path comment per chunk); in
"suffix" mode it goes to our server as the optional `extra` field. The sampling options
(temperature, top_p; seed when sampling) go with every request. With `min_confidence` set, the
confidence gate (completer/confidence.py) runs on the log-probabilities the server streams
(`logprobs: 1`; OpenAI's and vLLM's `token_logprobs`, llama-server's `content` list); a server
that sends none leaves the completion as it is, and our own server gates itself. Completions stream as SSE;
the in-loop stop and `cancel` close the connection. The document key goes in `user`, which our
server uses to keep the document's KV cache. The API key (`api_key`, else `COMPLETER_API_KEY`)
is sent as `Authorization: Bearer` and nowhere else.

    completer-lsp --engine openai:http://127.0.0.1:8000/v1   # e.g. vllm serve Qwen/Qwen2.5-Coder-1.5B
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import confidence
from ..client import Chunk, Completion, EngineError, StopReason, StopText, prompt_budget
from ..edits.formats import EditPrompt, edit_budget, read_answer
from ..fim import FIM_FORMATS
from ..prompt import piece_text
from ..prompt import render as fim_text
from .transport import SAMPLING, Http, Superseded, TokenMemo, edit_format, follow, live_options, set_gates

DEFAULT_CTX = 2048      # when the server does not say (vLLM says max_model_len, llama-server n_ctx_train)
CHARS_PER_TOKEN = 3.0   # token estimate when the server has no /tokenize: errs towards more tokens
FINISH_REASONS = {"stop": StopReason.EOS, "length": StopReason.LENGTH}  # OpenAI's finish_reason → ours


SERVER_FIM = "suffix"  # the server builds the FIM prompt from OpenAI's `suffix` field (our serve, Ollama)
# model-name substring → FIM_FORMATS name, first match wins ("auto")
AUTO = (("qwen", "qwen"), ("codegemma", "codegemma"), ("codellama", "codellama"), ("code-llama", "codellama"),
        ("deepseek", "deepseek"), ("codestral", "codestral"), ("starcoder", "starcoder"),
        ("santacoder", "starcoder"))


def fim_format_for(name: str, model: str, owned_by: str = "") -> str:
    """The format named by `name` (a FIM_FORMATS name or "suffix"), or for "auto" the one the
    model name implies; our own server ("owned_by": "completer") builds its prompt itself."""
    names = (*FIM_FORMATS, SERVER_FIM)
    if name != "auto":
        if name not in names:
            raise EngineError(code="bad_request", message=f"fim_format {name!r}: use auto or one of {', '.join(names)}")
        return name
    if owned_by == "completer":
        return SERVER_FIM
    low = model.lower()
    for key, fam in AUTO:
        if key in low:
            return fam
    raise EngineError(code="model", message=f"cannot tell the FIM format of model {model!r} from its name: "
                                            f"set fim_format to one of {', '.join(names)}")


class OpenAI:
    def __init__(self, base: str, *, api_key: str | None = None, model: str | None = None,
                 fim_format: str = "auto", timeout_ms: int = 10000, retries: int = 2,
                 max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        # requests go to {root}/v1/completions; /tokenize lives beside /v1, at the root
        self.api = "/v1"
        self.http = Http(base.rstrip("/").removesuffix("/v1"), name="the OpenAI-compatible server", api_key=api_key, timeout_ms=timeout_ms,
                         retries=retries)
        self.model, self.fim_name = model, fim_format
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self.min_confidence: float | None = None  # the confidence gate: off unless set (no calibration here)
        self.next_edit_min_confidence: float | None = None  # the next-edit gate: likewise
        self.fmt: str | None = None  # a FIM_FORMATS name or SERVER_FIM
        self.ctx = 0
        self.exact_tokens = False  # whether the server answered /tokenize
        self._memo = TokenMemo()
        self.counters = {"completions": 0, "rewrites": 0, "warmups": 0, "new_tokens": 0, "prompt_tokens": 0,
                         "feedback_accepted": 0, "feedback_rejected": 0}

    # -- connection --------------------------------------------------------------------------
    def warm_start(self) -> float:
        """Check the model against /v1/models, choose the FIM format, the context size and a
        token counter; milliseconds spent."""
        t0 = time.perf_counter()
        r = self.http.json("GET", self.api + "/models")
        models = r.get("data") if isinstance(r, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) and "id" in m for m in models):
            raise EngineError(code="internal", message=f"{self.http.base}{self.api}/models did not list models "
                                                       "(not an OpenAI-compatible server?)")
        ids = [str(m["id"]) for m in models]
        if not ids:
            raise EngineError(code="model", message=f"the server at {self.http.base} serves no model yet")
        if self.model is None:
            self.model = ids[0]
        elif self.model not in ids:
            raise EngineError(code="model", message=f"the server at {self.http.base} has no model "
                                                    f"{self.model!r}; it serves: {', '.join(ids)} (engine_model)")
        info = models[ids.index(self.model)]
        self.fmt = fim_format_for(self.fim_name, self.model, str(info.get("owned_by", "")))
        meta = info.get("meta") if isinstance(info.get("meta"), dict) else {}
        self.ctx = int(info.get("max_model_len") or info.get("context_length") or meta.get("n_ctx_train")
                       or DEFAULT_CTX)
        try:  # llama-server and our server read "content", vLLM and SGLang "prompt"
            self.exact_tokens = isinstance(self._tokenize("def"), int)
        except EngineError:
            self.exact_tokens = False
        return (time.perf_counter() - t0) * 1e3

    def reconfigure(self, **values: Any) -> None:
        """The options of `values` this client uses (engine_timeout_ms, engine_retries,
        max_new_tokens, temperature, top_p, seed, min_confidence) apply from the next request on;
        the model and its format (engine_model, fim_format) need a new client (config marks them reload)."""
        self.http.reconfigure(**values)
        for name, value in live_options(values, SAMPLING).items():
            setattr(self, name, value)
        set_gates(self, values)  # applied here, on the log-probabilities the server sends

    def _ready(self) -> None:
        if self.fmt is None:
            self.warm_start()

    def _tokenize(self, text: str) -> int:
        body = {"content": text, "prompt": text, "model": self.model, "add_special": False,
                "add_special_tokens": False}
        r = self.http.json("POST", "/tokenize", body)
        if not isinstance(r, dict) or not isinstance(r.get("tokens"), list):
            raise EngineError(code="internal", message="/tokenize answered without a token list")
        return len(r["tokens"])

    # -- the engine API ----------------------------------------------------------------------
    def _body(self, prefix: str, suffix: str, doc_key: str, max_tokens: int, stream: bool,
              extra: Sequence[Chunk]) -> dict:
        body = {"model": self.model, "max_tokens": max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "stream": stream, "user": doc_key}
        if self.temperature > 0:  # greedy needs no seed (and some servers reject one)
            body["seed"] = self.seed
        if self.fmt == SERVER_FIM:
            body.update(prompt=prefix, suffix=suffix)
            if extra:
                body["extra"] = [{"path": c.path, "text": c.text} for c in extra]
        else:
            body.update(prompt=fim_text(self.fmt, prefix, suffix, extra),
                        stop=list(FIM_FORMATS[self.fmt].stops))
        if stream:
            body["stream_options"] = {"include_usage": True}
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
        # our own server gates with its model's calibration (and takes no `logprobs`)
        gate = confidence.StreamGate(None if self.fmt == SERVER_FIM else self.min_confidence)
        body = self._body(prefix, suffix, doc_key, n, True, extra)
        if gate.on:
            body["logprobs"] = 1  # each token's log-probability, for the confidence gate
        events = gate.events(self.http.stream(self.api + "/completions", body, cancel, done=lambda ev: False),
                             _token_logprobs, _with_text)  # until data: [DONE]
        finish: dict = {}
        usage: dict = {}
        text_of = _event_reader(usage, finish)
        # with the gate on, the text is given once it is judged: a word it takes back was never shown
        text, _, why, ttft = follow(events, text_of, stop_text, None if gate.on else on_text, cancel, t0, n)
        text, why, unsure, score = gate.finish(text, why, on_text)
        total = (time.perf_counter() - t0) * 1e3
        new = int(usage.get("completion_tokens") or 0)
        prompt = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        self.counters["completions"] += 1
        self.counters["new_tokens"] += new
        self.counters["prompt_tokens"] += prompt
        return Completion(text, new_tokens=new, target_forwards=new, accepted_per_forward=1.0 if new else 0.0,
                          ttft_ms=ttft if ttft is not None else total, total_ms=total, prompt_tokens=prompt,
                          prefill_tokens=prompt - cached,
                          stop_reason=why or FINISH_REASONS.get(finish.get("reason", ""), StopReason.NONE),
                          confidence=score, unsure_text=unsure,
                          extra={"model": self.model, "fim_format": self.fmt, "tokens_cached": cached})

    def rewrite(self, request: EditPrompt, *, fmt: str = "auto", doc_key: str = "_default",
                max_new: int | None = None, speculative: bool = True,
                cancel: threading.Event | None = None) -> Completion:
        """The next-edit rewrite as a raw text prompt to `/v1/completions` (greedy, the format's
        stops). Speculation is the server's own (vLLM's n-gram or draft model, when configured);
        the API has no per-request switch, so `speculative` is only reported."""
        t0 = time.perf_counter()
        self._ready()
        f = edit_format(fmt, fim=None if self.fmt == SERVER_FIM else self.fmt, model=self.model or "")
        if cancel is not None and cancel.is_set():
            return Completion("", stop_reason=StopReason.CANCELLED, edit_format=f.name, malformed=True)
        n = edit_budget(self.count_tokens(f.draft(request)), max_new)
        # our own server gates with its model's calibration (and takes no `logprobs`)
        gate = confidence.StreamGate(None if self.fmt == SERVER_FIM else self.next_edit_min_confidence)
        body = {"model": self.model, "prompt": piece_text(f.prompt(request)), "max_tokens": n, "temperature": 0.0,
                "stream": True, "stop": list(f.stops), "user": doc_key, "stream_options": {"include_usage": True}}
        if gate.on:
            body["logprobs"] = 1  # each token's log-probability, for the next-edit gate
        events = gate.events(self.http.stream(self.api + "/completions", body, cancel, done=lambda ev: False),
                             _token_logprobs, _with_text)
        finish: dict = {}
        usage: dict = {}
        text_of = _event_reader(usage, finish)
        text, _, why, ttft = follow(events, text_of, None, None, cancel, t0, n)
        self.counters["rewrites"] += 1
        if (no := confidence.refused_edit(gate, edit_format=f.name, speculative=speculative,
                                          total_ms=(time.perf_counter() - t0) * 1e3)) is not None:
            return no
        new, prompt = int(usage.get("completion_tokens") or 0), int(usage.get("prompt_tokens") or 0)
        region = read_answer(f, text)
        self.counters["new_tokens"] += new
        total = (time.perf_counter() - t0) * 1e3
        return Completion(region or "", new_tokens=new, target_forwards=new, accepted_per_forward=1.0 if new else 0.0,
                          ttft_ms=ttft if ttft is not None else total, total_ms=total, speculative=speculative,
                          prompt_tokens=prompt,
                          stop_reason=why or FINISH_REASONS.get(finish.get("reason", ""), StopReason.NONE),
                          edit_format=f.name, malformed=region is None, extra={"model": self.model})

    def warmup(self, prefix: str, suffix: str = "", *, doc_key: str = "_default",
               extra: Sequence[Chunk] = ()) -> int:
        """A one-token request (servers refuse `max_tokens: 0`): the server's prefix cache keeps
        the prompt. Returns the prompt tokens the server reports (0 if it does not)."""
        self._ready()
        try:
            r = self.http.json("POST", self.api + "/completions", self._body(prefix, suffix, doc_key, 1, False, extra))
        except Superseded:  # a completion for the document came meanwhile: it prefills anyway
            return 0
        usage = r.get("usage") if isinstance(r, dict) and isinstance(r.get("usage"), dict) else {}
        self.counters["warmups"] += 1
        return int(usage.get("prompt_tokens") or 0)

    def forget(self, doc_key: str) -> None:
        """The API has no way to free a document's cache: the server's own policy evicts it."""

    def feedback(self, doc_key: str, text: str, accepted: bool, accepted_chars: int | None = None) -> None:
        """No feedback endpoint in the API: counted here (stats)."""
        self.counters["feedback_accepted" if accepted else "feedback_rejected"] += 1

    def count_tokens(self, text: str) -> int:
        """Exact by the server's /tokenize when it has one (memoised per distinct text), else
        len(text) / CHARS_PER_TOKEN rounded up."""
        if not text:
            return 0
        self._ready()
        if not self.exact_tokens:
            return -(-len(text) // int(CHARS_PER_TOKEN))
        return self._memo.get(text, self._tokenize)

    def prompt_budget(self, max_new: int | None = None) -> int:
        self._ready()
        return prompt_budget(self.ctx, max_new or self.max_new_tokens)

    def stats(self) -> dict:
        return {"engine": "openai", "url": self.http.base, "model": self.model,
                "fim_format": self.fmt, "ctx": self.ctx,
                "exact_tokens": self.exact_tokens, **self.counters, **self.http.counters}

    def close(self) -> None:
        """Nothing held open: every request has its own connection."""


def _event_reader(usage: dict, finish: dict) -> Callable[[dict], str]:
    """Reads one streamed /v1/completions event: its text; its usage and finish_reason go into
    `usage` and `finish` (a server may send them in any event, or in none)."""
    def text_of(ev: dict) -> str:
        if isinstance(ev.get("usage"), dict):
            usage.update(ev["usage"])
        choices = ev.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        if choices[0].get("finish_reason"):
            finish["reason"] = choices[0]["finish_reason"]
        return str(choices[0].get("text") or "")
    return text_of


def _token_logprobs(ev: dict) -> list[tuple[str, float]]:
    """A streamed /v1/completions event's tokens with their log-probabilities: OpenAI's (and
    vLLM's) `logprobs: {tokens, token_logprobs}`, or llama-server's `logprobs: {content: [{token,
    logprob}]}`; [] where the server sent none (the gate then lets the event through)."""
    choices = ev.get("choices")
    lp = choices[0].get("logprobs") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("content"), list):
        return [(str(t.get("token") or ""), float(t.get("logprob") or 0.0)) for t in lp["content"] if isinstance(t, dict)]
    tokens, lps = lp.get("tokens"), lp.get("token_logprobs")
    if isinstance(tokens, list) and isinstance(lps, list):
        return [(str(t), float(v if v is not None else 0.0)) for t, v in zip(tokens, lps, strict=False)]
    return []


def _with_text(ev: dict, text: str) -> dict:
    """The event holding only `text` (the sure tokens before a refused one), not finished."""
    choice = {**ev["choices"][0], "text": text, "finish_reason": None}
    return {**ev, "choices": [choice]}
