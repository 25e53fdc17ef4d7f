"""The completion pipeline shared by the language server, the CLI and the benchmarks, without
torch: gate → context → engine.complete (with the in-loop syntax stop) → post-process.

The engine is any `completer.client.EngineClient`: the in-process `Engine` or a remote engine.
`make_engine` builds one from the option names the CLI and the LSP share. Every result is the one
flat `Completion`; the syntax layer's decisions are its typed `syntax` record (syntax/decision.py:
the gate, the prompt's context, post-processing, the checks its deadline made it skip, the rule
that dropped a completion that shows nothing). A text that is not an open document is parsed only
around the cursor (`documents.snapshot_around`): the syntax stage costs the same for any size.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .client import Chunk, Completion, EngineClient, StopReason
from .documents import (
    WINDOW_CHARS,
    PositionError,
    Snapshot,
    language_for,
    line_of,
    offset_at,
    snapshot_around,
)
from .prompt import MAX_CHARS_PER_TOKEN, render_extra, text_budget, window_budget
from .syntax import (
    Context,
    Mode,
    Post,
    SyntaxOptions,
    gate,
    make_stop,
    node_kind,
    postprocess,
    select_context,
)
from .syntax.context import enclosing_definition
from .syntax.deadline import NEVER, Deadline
from .syntax.decision import Dropped, SyntaxDecision
from .syntax.stream import Stream

if TYPE_CHECKING:
    from .workspace import Snippet, WorkspaceIndex


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
            options: CompletionOptions) -> tuple[Snapshot, int, int, int]:
    """(snapshot, offset in it, where it starts in `text`, in chars and in lines): an open
    document's snapshot as it is; a text parsed around the cursor, as far as the context can reach."""
    offset = resolve_offset(text, position)
    if isinstance(text, Snapshot):
        return text, offset, 0, 0
    reach = max(WINDOW_CHARS, 2 * MAX_CHARS_PER_TOKEN * engine.prompt_budget(options.max_new_tokens))
    snap, start = snapshot_around(text, language_for(language), offset, reach)
    return snap, offset - start, start, line_of(text, start)


@dataclass(frozen=True)
class Entry:
    """One piece of what went into the prompt: a chunk of another file, or a part of the cursor
    file's own context (a header item, the prefix or suffix window). `path` is relative to the
    workspace root; lines are 0-based and inclusive, in that file."""
    kind: str   # definition | similar (other files); import | signature | sibling | prefix | suffix
    path: str
    start_line: int
    end_line: int
    tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Prompt:
    """What a completion's prompt holds: the chunks of other files (repository context, in the
    order the engine renders them before the prefix) and the cursor file's window."""
    window: Context
    chunks: tuple[Chunk, ...]
    context: tuple[Entry, ...]

    @property
    def prefix(self) -> str:
        return self.window.prefix

    @property
    def suffix(self) -> str:
        return self.window.suffix


class _LastChunks:
    """The cross-file snippets last chosen per (index, file), so that the prompt's head stays
    the same while the cursor stays inside one definition: a new retrieval replaces them only
    when it holds something they do not (a name newly used, a definition that changed), or the
    cursor left the definition. The per-document KV cache keeps matching meanwhile."""

    def __init__(self, per_index: int = 256):
        self.per_index, self.lock = per_index, threading.Lock()
        self.last: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def choose(self, workspace, path: str, scope: int | None, fresh: list[Snippet], budget: int) -> list[Snippet]:
        with self.lock:
            seen = self.last.setdefault(workspace, OrderedDict())
            old = seen.get(path)
            if (old is not None and old[0] == scope and set(fresh) <= set(old[1])
                    and sum(s.tokens for s in old[1]) <= budget):
                seen.move_to_end(path)
                return old[1]
            seen[path] = (scope, fresh)
            seen.move_to_end(path)
            if len(seen) > self.per_index:
                seen.popitem(last=False)
            return fresh


_LAST = _LastChunks()


def prompt_for(engine: EngineClient, snap: Snapshot, offset: int, options: CompletionOptions,
               deadline: Deadline = NEVER, workspace: WorkspaceIndex | None = None, path: str | None = None,
               extra: Sequence[Chunk] = (), first_line: int = 0):
    """(decision, Prompt) for a completion at `offset` of `snap`; the Prompt is None when gated
    off. The syntax layer chooses everything that goes in; the engine only adds its FIM tokens.
    With a `workspace` index and the file's `path`, the definitions and snippets of other files
    the cursor needs take up to the index options' `cross_file_share` of the budget, in a stable
    order (by path and line, kept while the cursor stays in one definition); `extra`, chunks the
    caller chose (a `completer serve` client's), go first; the cursor file's windows get the rest. `first_line`: the file's line where `snap` starts (a text
    parsed around the cursor), for the entries' line numbers."""
    decision = gate(snap, offset, options.syntax)
    if decision.mode is Mode.EMPTY:
        return decision, None
    total = engine.prompt_budget(options.max_new_tokens)
    budget = text_budget(total)
    snippets, rel = [], None
    if workspace is not None and path is not None:
        rel = workspace.rel(path)
        share = int(budget * workspace.options.cross_file_share)
        if rel is not None and share > 0:
            fresh = sorted(workspace.retrieve(path, snap.text, offset, share),
                           key=lambda s: (s.path, s.start_line))
            snippets = _LAST.choose(workspace, rel, enclosing_definition(snap, offset), fresh, share)
    chunks = tuple(extra) + tuple(Chunk(s.path, s.text) for s in snippets)
    # counted with what the engine adds around them (a path comment each, or a file separator and the path)
    spent = engine.count_tokens(render_extra("none", chunks, snap.language)) if chunks else 0
    window = select_context(snap, offset, engine.count_tokens, window_budget(total, spent), options.syntax, deadline)
    here = rel or (Path(path).name if path else "")
    own = tuple(Entry(sp.kind, here, first_line + line_of(snap.text, sp.start),
                      first_line + line_of(snap.text, max(sp.end - 1, sp.start)),
                      engine.count_tokens(snap.text[sp.start:sp.end] if sp.shown is None else sp.shown))
                for sp in window.spans)
    cross = tuple(Entry(s.kind, s.path, s.start_line, s.end_line, s.tokens) for s in snippets)
    return decision, Prompt(window, chunks, cross + own)


def complete_at(engine: EngineClient, text: str | Snapshot, position: int | tuple[int, int], *,
                language: str | None = None, doc_key: str = "_default",
                options: CompletionOptions = CompletionOptions(),
                cancel: threading.Event | None = None,
                on_text: Callable[[str], None] | None = None, extra: Sequence[Chunk] = (),
                workspace: WorkspaceIndex | None = None, path: str | None = None, n: int | None = None) -> Completion:
    """One completion at `position` of `text` (a string, or a documents.Snapshot with its tree),
    with the chunks `extra` a caller chose and those `workspace` gives for the file at `path`
    (prompt_for). `on_text` receives deltas of text the returned (post-processed) text starts
    with, as it settles (syntax/stream.py). The result's `context` lists what the prompt holds.
    `n`: up to n completions (EngineClient.complete); each alternative is post-processed as the
    main one and kept when it still shows something other than it and the alternatives before it."""
    t0 = time.perf_counter()
    deadline = Deadline.within(options.syntax.syntax_budget_ms)
    snap, offset, start, first_line = _locate(engine, text, position, language, options)
    decision, prompt = prompt_for(engine, snap, offset, options, deadline, workspace=workspace, path=path,
                                  extra=extra, first_line=first_line)
    gated = SyntaxDecision(snap.language or "plaintext", decision.mode.value, decision.reason)
    if prompt is None:
        ms = round((time.perf_counter() - t0) * 1e3, 3)
        return Completion("", total_ms=ms, stop_reason=StopReason.GATED, syntax=replace(gated, syntax_ms=ms))
    ctx = prompt.window
    stop = make_stop(snap, offset, decision.mode, options.syntax)
    t1 = time.perf_counter()
    kind = node_kind(snap, offset)  # the engine adapts its draft length per kind of node
    shown = Stream(snap, offset, decision.mode, options.syntax, on_text) if on_text is not None else None
    comp = engine.complete(ctx.prefix, ctx.suffix, doc_key=doc_key, max_new=options.max_new_tokens,
                           stop_text=stop, cancel=cancel, on_text=shown.feed if shown else None, node_kind=kind,
                           extra=prompt.chunks, n=n)
    t2 = time.perf_counter()
    raw = comp.text
    cut = stop(raw)  # generation may have ended by EOS or length before the stop fired
    if stop.reason == "degenerate":  # also when only the final text showed it (EOS or length came first)
        comp.stop_reason = StopReason.DEGENERATE
    post = postprocess(snap, offset, raw if cut is None else raw[:cut], decision.mode,
                       options.syntax.parse_check, deadline.later(t2 - t1))  # the engine's time is not the syntax layer's
    if shown is not None:
        post = shown.settle(post)
    t3 = time.perf_counter()
    comp.syntax = replace(
        gated, node_kind=kind, context_tokens=ctx.tokens, raw_context_tokens=ctx.raw_tokens, tokens_saved=ctx.saved,
        spans=tuple((s.kind, s.start + start, s.end + start) for s in ctx.spans),
        context=tuple(e.as_dict() for e in prompt.context), skipped=ctx.skipped + post.skipped, raw_text=raw,
        postprocess=post.reason, parse_errors_before=post.errors_before, parse_errors_after=post.errors_after,
        dropped=_dropped(stop.generated, raw if cut is None else raw[:cut], stop.reason, post, comp),
        syntax_ms=round((t1 - t0) * 1e3, 3),
        engine_total_ms=round((t2 - t1) * 1e3, 3), postprocess_ms=round((t3 - t2) * 1e3, 3))
    comp.text = post.text
    # alternatives are cycled from a shown completion: none when the main one shows nothing
    comp.alternatives = (_alternatives(snap, offset, decision.mode, options, deadline.later(t2 - t1), comp)
                         if comp.text.strip() else [])
    comp.total_ms = (time.perf_counter() - t0) * 1e3
    return comp


def _alternatives(snap: Snapshot, offset: int, mode: Mode, options: CompletionOptions, deadline: Deadline,
                  main: Completion) -> list[Completion]:
    """The engine's alternatives through the main completion's post-processing (each judged by a
    stop rule of its own), in the engine's order, without those that show nothing, what the main
    completion or an earlier alternative shows, or only the start of it (a partial accept takes that)."""
    seen, kept = [main.text], []
    for alt in main.alternatives:
        stop = make_stop(snap, offset, mode, options.syntax)
        cut = stop(alt.text)
        post = postprocess(snap, offset, alt.text if cut is None else alt.text[:cut], mode,
                           options.syntax.parse_check, deadline)
        if post.text.strip() and not any(s.startswith(post.text) for s in seen):
            seen.append(post.text)
            kept.append(replace(alt, text=post.text))
    return kept


def _dropped(generated: str, kept: str, stop_reason: StopReason | None, post: Post, comp: Completion) -> Dropped | None:
    """Which rule left nothing to show of a generated completion: the confidence gate when it
    kept nothing (completer/confidence.py), the stop (degenerate or syntax) when it kept nothing,
    else post-processing; None when something shows or nothing was generated."""
    if post.text.strip():
        return None
    if comp.stop_reason == StopReason.UNSURE and not kept.strip():
        return Dropped("confidence", comp.text + comp.unsure_text)
    if not generated:
        return None
    if not kept.strip():
        return Dropped(stop_reason or StopReason.SYNTAX, generated)
    return Dropped(post.reason or "empty", generated)


def warmup_at(engine: EngineClient, text: str | Snapshot, position: int | tuple[int, int], *, doc_key: str,
              language: str | None = None, options: CompletionOptions = CompletionOptions(),
              extra: Sequence[Chunk] = (), workspace: WorkspaceIndex | None = None, path: str | None = None) -> int:
    """Prefill the engine's cache with the prompt `complete_at` would use for the same arguments
    (the same snapshot, window and chunks); returns the tokens computed (0 when gated off or
    already cached)."""
    snap, offset, _, first_line = _locate(engine, text, position, language, options)
    _, prompt = prompt_for(engine, snap, offset, options, workspace=workspace, path=path, extra=extra,
                           first_line=first_line)
    return 0 if prompt is None else engine.warmup(prompt.prefix, prompt.suffix, doc_key=doc_key, extra=prompt.chunks)


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
