"""The prompt builder: the one owner of a completion prompt's budget, of the grid its window is
cut on and of the FIM layout, as text (a server that tokenizes it: the OpenAI-compatible client)
and as ids (the engine's complete, warmup and prefetch; `piece_ids` for rewrite's next-edit
pieces). Torch-free: the syntax layer, the pipeline and the remote clients import it.

Budget. A prompt of `budget` tokens (client.prompt_budget) keeps SENTINEL_TOKENS for the FIM
tokens (`text_budget`). Chunks of other files (client.Chunk) go in whole, in the caller's order,
while they take at most half of the rest (`fit_chunks`); the cursor file's window gets what they
leave. The pipeline plans its window by the same numbers (`window_budget`), so the engine takes
the syntax layer's context whole.

Window. A window that must be cut opens on a grid, so that it stays where it was while the user
types and the per-document KV cache keeps matching: on a line that is a multiple of GRID_LINES,
and inside one line longer than the budget on a multiple of CUT_GRID chars moved to whitespace
(`cut_inside`). The syntax layer moves that line to a syntax boundary (syntax/context.py); a raw
prefix and suffix (a /v1 request, a WebSocket frame without a language) are cut here (`fim_ids`).

Layout. `layout` puts the parts in the family's order (completer/fim.py's table) once, for text
and for ids. SPM (`<fim_suffix> suffix <fim_middle> prefix`, the embedded pair) ends at the cursor,
so typing only appends tokens; PSM (`<fim_prefix> prefix <fim_suffix> suffix <fim_middle>`) is
most public coder models'; without FIM tokens: the prefix alone. A family with repository tokens
(Qwen2.5-Coder `<|file_sep|>`, StarCoder2 `<file_sep>`) gets one `{file_sep}path\\ntext` section
per chunk before the FIM prompt, as it was trained on repository-level samples; any other family
gets each chunk as a path comment and its text at the start of the prefix. Chunks keep the
caller's order, so the prompt's head stays the same while the user types.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, TypeVar

from .client import Chunk
from .fim import FIM_FORMATS, FimFormat, spec, token_id

SENTINEL_TOKENS = 3      # the most FIM tokens a format adds around the text (PSM: prefix, suffix, middle)
# Characters per token never exceed this for the tokenizers we meet (code averages 3-4): it bounds
# how much text is looked at and tokenized, by the syntax layer and the engine alike.
MAX_CHARS_PER_TOKEN = 12
GRID_LINES = 16          # a window opens on a multiple of this line (SyntaxOptions.grid_lines' default)
SUFFIX_SHARE = 0.25      # of the window's budget, what the suffix may take (SyntaxOptions.suffix_share's default)
# A window cut inside one long line (minified code, data) opens on a grid of this many chars, so
# it moves once per CUT_GRID typed chars and the engine's cache keeps what is before it.
CUT_GRID = 256
DEFAULT_COMMENT = "#"    # the path comment of a language without line comments (plain text)
_SPACE = re.compile(r"\s")


class Piece(NamedTuple):
    """Part of a prompt: a special token spelled `text`, or text from a document (never read as
    a special token). draft_models.edit_format.Piece, a next-edit prompt's, has the same fields."""
    text: str
    special: bool = False


# -- budget ----------------------------------------------------------------------------------
def text_budget(budget: int, layout: str = "psm") -> int:
    """Tokens of a prompt of `budget` left for text once the FIM tokens of a `layout` are kept
    (a caller that does not know the engine's format keeps them: any format fits)."""
    return budget - SENTINEL_TOKENS if layout != "none" else budget


def chunks_budget(budget: int) -> int:
    """Tokens of `budget` (text tokens) that the chunks of other files may take."""
    return budget // 2


def fit_chunks(costs: Iterable[int], budget: int) -> int:
    """How many of the chunks costing `costs` tokens go in a prompt of `budget` text tokens:
    whole, in order, while together they take at most chunks_budget(budget)."""
    n = used = 0
    for c in costs:
        if used + c > chunks_budget(budget):
            break
        n, used = n + 1, used + c
    return n


def window_budget(budget: int, chunk_tokens: int) -> int:
    """Tokens of a prompt of `budget` (client.prompt_budget) the cursor file's window may take
    when the chunks of other files count `chunk_tokens` as `render_extra(\"none\", ...)` writes
    them: at most their share is kept for them (what the engine keeps of them is never more)."""
    budget = text_budget(budget)
    return budget - min(chunk_tokens, chunks_budget(budget))


# -- window ----------------------------------------------------------------------------------
def cut_inside(text: str, a: int, b: int, count_tokens: Callable[[str], int], room: int, tail: bool) -> int:
    """A cut p inside one long line [a, b) so that text[p:b] (`tail`: the prefix side) or
    text[a:p] (the suffix side) fits `room` tokens, about as much as fits: on the CUT_GRID of
    absolute positions, then moved to whitespace within a grid step so that the window does not
    open or end inside a token. Costs a few tokenizer calls over at most `room` tokens of text."""
    if room <= 0 or a >= b:
        return b if tail else a
    sample = text[max(b - 2048, a):b] if tail else text[a:min(a + 2048, b)]
    span = int(room * len(sample) / max(count_tokens(sample), 1))  # chars that should fit
    for _ in range(8):
        if tail:
            p = min(max(-(-(b - span) // CUT_GRID) * CUT_GRID, a), b)
            fits = count_tokens(text[p:b]) <= room
        else:
            p = max(min((a + span) // CUT_GRID * CUT_GRID, b), a)
            fits = count_tokens(text[a:p]) <= room
        if fits:
            break
        span = span * 3 // 4
    else:
        return b if tail else a
    if tail and p > a:  # whitespace within one grid step, else the grid itself (text without any)
        m = _SPACE.search(text, p, min(p + CUT_GRID, b))
        return m.end() if m else p
    if not tail and p < b:
        k = max(text.rfind(" ", max(p - CUT_GRID, a), p), text.rfind("\t", max(p - CUT_GRID, a), p))
        return k if k > a else p
    return p


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _tail(enc: Callable[[str], list[int]], text: str, budget: int) -> list[int]:
    """Ids of `text` from the earliest grid line whose tail fits `budget` tokens; from a cut on
    the char grid inside that line when even the last grid line's tail is too long."""
    if budget <= 0:
        return []
    lines = _lines(text)
    starts = list(range(0, len(lines), GRID_LINES))
    offs, acc = [], 0
    for ln in lines:
        offs.append(acc)
        acc += len(ln)
    lo, hi = 0, len(starts) - 1 if starts else 0
    if not starts or len(text) < budget:  # ≥1 char per token: fits outright
        ids = enc(text)
        if len(ids) <= budget:
            return ids
    while lo < hi:  # first grid start whose tail fits
        mid = (lo + hi) // 2
        if len(enc(text[offs[starts[mid]]:])) <= budget:
            hi = mid
        else:
            lo = mid + 1
    start = offs[starts[lo]] if starts else 0
    ids = enc(text[start:])
    if len(ids) <= budget:
        return ids
    ids = enc(text[cut_inside(text, start, len(text), lambda s: len(enc(s)), budget, tail=True):])
    return ids if len(ids) <= budget else []


def _head(enc: Callable[[str], list[int]], text: str, want: int) -> list[int]:
    """Ids of the first lines of `text` up to `want` tokens (a suffix: its end does not move
    while the user types before it)."""
    lines, take = _lines(text), []
    for ln in lines:  # whole lines until the share is used
        take.append(ln)
        if len(take) % 8 == 0 and len(enc("".join(take))) > want:
            break
    return enc("".join(take))[:want]


# -- layout ----------------------------------------------------------------------------------
T = TypeVar("T", str, list)


def layout(name: str, head: T, prefix: T, suffix: T, sentinel: Callable[[str], T]) -> list[T]:
    """The parts of family `name`'s FIM prompt in order: `head` (the chunks, see extra_pieces),
    the prefix, the suffix and the family's sentinels (`sentinel(spelling)`), as text or as ids."""
    f = spec(name)
    lead = [head] if leads_prompt(name) else []
    pre = [prefix] if lead else [head, prefix]
    if f.layout == "spm":  # Codestral: [SUFFIX] suffix [PREFIX] prefix (its "middle" is [PREFIX])
        return [*lead, sentinel(f.suffix), suffix, sentinel(f.middle), *pre]
    if f.layout == "psm":
        return [*lead, sentinel(f.prefix), *pre, sentinel(f.suffix), suffix, sentinel(f.middle)]
    return [*lead, *pre]


def extra_pieces(name: str, chunks: Sequence[Chunk], language: str | None = None) -> list[Piece]:
    """The chunks as pieces, in order: a separator token is special, everything from a document
    (paths, code) is not, so that an engine encodes the code without ever reading a special token
    in it. Where they go: before the whole FIM prompt when the family has a file separator
    (`leads_prompt`), else at the start of the prefix. A path comment is written in the syntax of
    the chunk's own file, else of `language` (the cursor file's, for a path of no known language),
    else with '#'."""
    f = spec(name)
    if f.file_sep is not None:
        out: list[Piece] = []
        for c in chunks:
            out += [Piece(f.file_sep, True), Piece(f"{c.path}\n{_ended(c.text)}")]
        return out
    return [Piece(f"{_comment(language, c.path)} {c.path}\n{_ended(c.text)}\n") for c in chunks]


def leads_prompt(name: str) -> bool:
    """Whether the family's chunks come before the FIM prompt (repository tokens) rather than at
    the start of the prefix."""
    return spec(name).file_sep is not None


def render_extra(fmt: str, chunks: Sequence[Chunk], language: str | None = None) -> str:
    """The chunks as text for format `fmt` (see extra_pieces for where it goes)."""
    return piece_text(extra_pieces(fmt, chunks, language))


def render(name: str, prefix: str, suffix: str, extra: Sequence[Chunk] = (), language: str | None = None) -> str:
    """The text prompt of format `name` with the chunks `extra` (for a server that tokenizes it:
    OpenAI-compatible completions); its stop strings are `FIM_FORMATS[name].stops`."""
    return "".join(layout(name, render_extra(name, extra, language), prefix, suffix, lambda s: s))


def _comment(language: str | None, path: str) -> str:
    from .documents import language_for  # tree-sitter's bindings: loaded only for a chunk
    from .syntax.lang import spec as lang_spec

    return lang_spec(language_for(None, path) or language).line_comment or DEFAULT_COMMENT


def _ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def piece_text(pieces: Iterable[Piece]) -> str:
    """Pieces as text, for a server that tokenizes it (special pieces by their spelling)."""
    return "".join(p.text for p in pieces)


def piece_ids(tok, pieces: Iterable[Piece], missing: Callable[[str], None] | None = None) -> list[int]:
    """Pieces as ids: a special piece is its token, text is document text (encode_text). A special
    piece the vocabulary lacks goes to `missing` (which raises), else it is read as text."""
    out: list[int] = []
    for p in pieces:
        i = token_id(tok, p.text) if p.special else None
        if p.special and i is None and missing is not None:
            missing(p.text)
        out += [i] if i is not None else encode_text(tok, p.text)
    return out


# -- ids ---------------------------------------------------------------------------------------
def fim_ids(tok, fmt: FimFormat, prefix: str, suffix: str, budget: int,
            extra: Sequence[Chunk] = (), language: str | None = None,
            suffix_share: float = SUFFIX_SHARE) -> list[int]:
    """Token ids of a FIM prompt whose length is at most `budget`, with the chunks `extra`
    (`language`: the cursor file's) counted in it. What fits is taken whole (the syntax layer's
    context); else chunks go in by fit_chunks, the suffix keeps its first lines up to
    `suffix_share`, the prefix its last lines from a window start on the grid."""
    enc = lambda s: encode_text(tok, s)
    budget = text_budget(budget, fmt.layout)
    chunk_ids: list[list[int]] = []

    def costs():  # encoded while fit_chunks asks: a chunk after the first that does not fit is not
        for c in extra:
            chunk_ids.append(piece_ids(tok, extra_pieces(fmt.name, [c], language)))
            yield len(chunk_ids[-1])

    head = [i for ids in chunk_ids[:fit_chunks(costs(), budget)] for i in ids]
    budget -= len(head)
    if fmt.layout == "none":
        suffix = ""
    pre_ids = suf_ids = None
    if len(prefix) + len(suffix) <= budget * MAX_CHARS_PER_TOKEN:  # else it cannot fit whole
        pre_ids, suf_ids = enc(prefix), enc(suffix)
        if len(pre_ids) + len(suf_ids) > budget:
            pre_ids = suf_ids = None  # the one cut below
    if suf_ids is None:
        suf_ids = _head(enc, suffix, int(budget * suffix_share)) if suffix else []
        pre_ids = _tail(enc, prefix, budget - len(suf_ids))
    f = spec(fmt.name)
    sentinels = {f.prefix: [fmt.prefix], f.suffix: [fmt.suffix], f.middle: [fmt.middle]}
    return [i for part in layout(fmt.name, head, pre_ids, suf_ids, sentinels.__getitem__) for i in part]


@dataclass(frozen=True)
class _TextTokenizer:
    tok: object              # a copy of the model's tokenizer that reads special tokens as text
    control: frozenset[int]  # ids document text must never produce
    split: re.Pattern | None  # the control strings, when the vocabulary has any outside its specials


@lru_cache(maxsize=8)
def _text_tokenizer(tok) -> _TextTokenizer:
    plain = type(tok).from_str(tok.to_str())
    plain.encode_special_tokens = True
    added = tok.get_added_tokens_decoder()
    control = {i for i, t in added.items() if t.special}
    strings = {t.content for i, t in added.items() if t.special}
    for f in FIM_FORMATS.values():  # a family may keep its FIM tokens as plain added tokens (Qwen2.5)
        for text in (*f.sentinels(), *f.stops, f.repo_name, f.file_sep):
            i = token_id(tok, text) if text else None
            if i is not None:
                control.add(i)
                strings.add(text.strip())
    strings = sorted((t for t in strings if len(t) > 1), key=len, reverse=True)
    return _TextTokenizer(plain, frozenset(control), re.compile("|".join(map(re.escape, strings))) if strings else None)


def encode_text(tok, text: str) -> list[int]:
    """Ids of document text, never a control token. `encode(..., add_special_tokens=False)` only
    leaves out what a template adds around the text: "<|endoftext|>" written in a document is
    still the end-of-text token. A copy of the tokenizer with `encode_special_tokens` reads the
    special tokens as text; a control string the vocabulary holds as a plain added token is
    split after its first char (measured: encode_text costs what encode does, see
    tests/test_bounds.py)."""
    if not text:
        return []
    t = _text_tokenizer(tok)
    ids = t.tok.encode(text, add_special_tokens=False).ids
    if t.control.isdisjoint(ids):
        return ids
    ids, start = [], 0
    for m in t.split.finditer(text) if t.split is not None else ():
        ids += t.tok.encode(text[start:m.start() + 1], add_special_tokens=False).ids
        start = m.start() + 1
    ids += t.tok.encode(text[start:], add_special_tokens=False).ids
    return [i for i in ids if i not in t.control]  # a one-char control string cannot be split
