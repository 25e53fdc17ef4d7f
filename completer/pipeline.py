"""The completion pipeline shared by the language server, the CLI and the benchmarks, without
torch: gate → context → engine.complete (with the in-loop syntax stop) → post-process.

The engine is any `completer.client.EngineClient`: the in-process `Engine` or a remote engine.
`make_engine` builds one from the option names the CLI and the LSP share. Every result is the one
flat `Completion`; the syntax layer's decisions go in its `extra`, with the optional checks its
deadline made it skip (`syntax_skipped`). A text that is not an open document is parsed only
around the cursor (`documents.snapshot_around`): the syntax stage costs the same for any size.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .client import Chunk, Completion, EngineClient
from .documents import WINDOW_CHARS, PositionError, Snapshot, language_for, offset_at, snapshot_around
from .syntax import Mode, SyntaxOptions, gate, make_stop, node_kind, postprocess, select_context
from .syntax.context import MAX_CHARS_PER_TOKEN
from .syntax.deadline import NEVER, Deadline
from .syntax.stream import Stream

FIM_TOKENS = 3  # <fim_suffix>, <fim_middle> and <fim_prefix>/none: the engine's build_prompt keeps 3


@dataclass(frozen=True)
class CompletionOptions:
    max_new_tokens: int | None = None   # None = the engine's own default
    syntax: SyntaxOptions = field(default_factory=SyntaxOptions)


def resolve_offset(text: str | Snapshot, position: int | tuple[int, int]) -> int:
    """A char offset from an offset or a 0-based (line, column in chars; lines end at \\r\\n, \\r
    or \\n, as in the language server's documents); PositionError if outside."""
    text = text.text if isinstance(text, Snapshot) else text
    if isinstance(position, int):
        if not 0 <= position <= len(text):
            raise PositionError(f"offset {position} is outside the document (0..{len(text)})")
        return position
    return offset_at(text, *position, exact=True)


def _locate(engine: EngineClient, text: str | Snapshot, position: int | tuple[int, int], language: str | None,
            options: CompletionOptions) -> tuple[Snapshot, int, int]:
    """(snapshot, offset in it, where it starts in `text`): an open document's snapshot as it
    is; a text parsed around the cursor, as far as the context can reach."""
    offset = resolve_offset(text, position)
    if isinstance(text, Snapshot):
        return text, offset, 0
    reach = max(WINDOW_CHARS, 2 * MAX_CHARS_PER_TOKEN * engine.prompt_budget(options.max_new_tokens))
    snap, start = snapshot_around(text, language_for(language), offset, reach)
    return snap, offset - start, start


def prompt_for(engine: EngineClient, snap: Snapshot, offset: int, options: CompletionOptions,
               deadline: Deadline = NEVER):
    """(decision, context) for a completion at `offset`; context is None when gated off."""
    decision = gate(snap, offset, options.syntax)
    if decision.mode is Mode.EMPTY:
        return decision, None
    budget = engine.prompt_budget(options.max_new_tokens) - FIM_TOKENS
    return decision, select_context(snap, offset, engine.count_tokens, budget, options.syntax, deadline)


def complete_at(engine: EngineClient, text: str | Snapshot, position: int | tuple[int, int], *,
                language: str | None = None, doc_key: str = "_default",
                options: CompletionOptions = CompletionOptions(),
                cancel: threading.Event | None = None,
                on_text: Callable[[str], None] | None = None, extra: Sequence[Chunk] = ()) -> Completion:
    """One completion at `position` of `text` (a string, or a documents.Snapshot with its tree).
    `on_text` receives deltas of text the returned (post-processed) text starts with, as it
    settles (syntax/stream.py)."""
    t0 = time.perf_counter()
    deadline = Deadline.within(options.syntax.syntax_budget_ms)
    snap, offset, start = _locate(engine, text, position, language, options)
    decision, ctx = prompt_for(engine, snap, offset, options, deadline)
    syntax: dict = {"gate": decision.mode.value, "gate_reason": decision.reason, "node_kind": None,
                    "language": snap.language or "plaintext"}
    if ctx is None:
        ms = round((time.perf_counter() - t0) * 1e3, 3)
        return Completion("", total_ms=ms, stop_reason="gated",
                          extra={**syntax, "syntax_ms": ms, "syntax_skipped": []})
    stop = make_stop(snap, offset, decision.mode, options.syntax)
    t1 = time.perf_counter()
    kind = node_kind(snap, offset)  # the engine adapts its draft length per kind of node
    shown = Stream(snap, offset, decision.mode, options.syntax, on_text) if on_text is not None else None
    comp = engine.complete(ctx.prefix, ctx.suffix, doc_key=doc_key, max_new=options.max_new_tokens,
                           stop_text=stop, cancel=cancel, on_text=shown.feed if shown else None, node_kind=kind,
                           extra=extra)
    t2 = time.perf_counter()
    raw = comp.text
    cut = stop(raw)  # generation may have ended by EOS or length before the stop fired
    if stop.reason == "degenerate":  # also when only the final text showed it (EOS or length came first)
        comp.stop_reason = "degenerate"
    post = postprocess(snap, offset, raw if cut is None else raw[:cut], decision.mode,
                       options.syntax.parse_check, deadline.later(t2 - t1))  # the engine's time is not the syntax layer's
    if shown is not None:
        post = shown.settle(post)
    t3 = time.perf_counter()
    comp.extra.update(syntax, node_kind=kind, context_tokens=ctx.tokens, raw_context_tokens=ctx.raw_tokens,
                      tokens_saved=ctx.saved, spans=[(s.kind, s.start + start, s.end + start) for s in ctx.spans],
                      syntax_skipped=list(ctx.skipped + post.skipped),
                      raw_text=raw, postprocess=post.reason, parse_errors_before=post.errors_before,
                      parse_errors_after=post.errors_after, syntax_ms=round((t1 - t0) * 1e3, 3),
                      engine_total_ms=round((t2 - t1) * 1e3, 3), postprocess_ms=round((t3 - t2) * 1e3, 3))
    comp.text = post.text
    comp.total_ms = (t3 - t0) * 1e3
    return comp


def warmup_at(engine: EngineClient, text: str | Snapshot, position: int | tuple[int, int], *, doc_key: str,
              language: str | None = None, options: CompletionOptions = CompletionOptions(),
              extra: Sequence[Chunk] = ()) -> int:
    """Prefill the engine's cache with the prompt `complete_at` would use for the same arguments
    (the same snapshot, window and chunks `extra`); returns the tokens computed (0 when gated off
    or already cached)."""
    snap, offset, _ = _locate(engine, text, position, language, options)
    _, ctx = prompt_for(engine, snap, offset, options)
    return 0 if ctx is None else engine.warmup(ctx.prefix, ctx.suffix, doc_key=doc_key, extra=extra)


def make_engine(engine: str | None = None, *, engine_api_key: str | None = None, engine_model: str | None = None,
                engine_timeout_ms: int = 10_000, engine_retries: int = 2,
                progress: Callable[[int, str], None] | None = None, **config) -> EngineClient:
    """A remote engine when `engine` is a URL (ws://, llamacpp:http://, openai:http://), else the
    in-process engine built from EngineConfig's options. Loads models or connects: slow.
    `progress(percent, message)` follows an in-process load (warm_start reaches 100 %).
    `engine_api_key` is the key to send, as config.Resolved.engine_key decided (None: none; the
    environment is not read here, so that a key never reaches an engine it was not set for)."""
    if engine:
        from .remote import connect

        key = engine_api_key or ""  # "": connect must not fall back to the environment either
        return connect(engine, token=key, api_key=key, model=engine_model,
                       fim_format=config.get("fim_format", "auto"), timeout_ms=engine_timeout_ms,
                       retries=engine_retries, options=config)
    from dataclasses import fields

    from .config import EngineConfig
    from .engine.engine import Engine

    return Engine(EngineConfig(**{f.name: config[f.name] for f in fields(EngineConfig) if f.name in config}),
                  progress=progress)
