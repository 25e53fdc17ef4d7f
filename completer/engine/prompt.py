"""The token prompt of a completion: the FIM tokens of the model's format (completer/fim.py)
around the chunks of other files, the prefix and the suffix, under a token budget.

The syntax layer chooses what goes in (same-file and cross-file) and its context fits the budget:
it is taken whole. A caller that passes a raw prefix and suffix (a /v1 request, a WebSocket
frame without a language) gets the one cut here: a window snapped to a grid of lines, so that
it stays the same while the user types and the per-document KV cache keeps matching.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..client import Chunk
from ..fim import (
    FIM_FORMATS,
    MAX_CHARS_PER_TOKEN,
    SENTINEL_TOKENS,
    FimFormat,
    chunks_budget,
    extra_pieces,
    leads_prompt,
    token_id,
)

PREFIX_GRID_LINES = 16  # the prefix window starts on a multiple of this line: stable while typing
TOKEN_GRID = 32         # when even one grid block is too long, drop tokens in steps of this


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


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def build_prompt(tok, fmt: FimFormat, prefix: str, suffix: str, budget: int,
                 extra: Sequence[Chunk] = (), language: str | None = None,
                 suffix_share: float = 0.25) -> list[int]:
    """Token ids of a FIM prompt whose length is at most `budget`, with the chunks `extra`
    (rendered by fim.extra_pieces; `language`: the cursor file's) counted in it. What fits is
    taken whole; else chunks stay whole, in order, while they take at most half the budget, the
    suffix keeps its first lines up to `suffix_share`, the prefix its last lines from a window
    start snapped to a grid of lines."""
    enc = lambda s: encode_text(tok, s)
    if fmt.layout != "none":
        budget -= SENTINEL_TOKENS
    head: list[int] = []
    for c in extra:  # whole chunks in the caller's order while they fit half the budget
        ids = [i for text, special in extra_pieces(fmt.name, [c], language) for i in _piece(tok, enc, text, special)]
        if len(head) + len(ids) > chunks_budget(budget):
            break
        head += ids
    budget -= len(head)
    if fmt.layout == "none":
        suffix = ""
    pre_ids = suf_ids = None
    if len(prefix) + len(suffix) <= budget * MAX_CHARS_PER_TOKEN:  # else it cannot fit whole
        pre_ids, suf_ids = enc(prefix), enc(suffix)
        if len(pre_ids) + len(suf_ids) > budget:
            pre_ids = suf_ids = None  # the one cut below
    if suf_ids is None:
        suf_ids = []
        if suffix:
            want = int(budget * suffix_share)
            lines, take = _lines(suffix), []
            for ln in lines:  # whole lines until the share is used
                take.append(ln)
                if len(take) % 8 == 0 and len(enc("".join(take))) > want:
                    break
            suf_ids = enc("".join(take))[:want]
        pre_ids = _tail_lines(enc, prefix, budget - len(suf_ids))
    lead = head if leads_prompt(fmt.name) else []
    if not lead:
        pre_ids = head + pre_ids
    if fmt.layout == "none":
        return lead + pre_ids
    if fmt.layout == "spm":  # Codestral: [SUFFIX] suffix [PREFIX] prefix (its "middle" is [PREFIX])
        return lead + [fmt.suffix] + suf_ids + [fmt.middle] + pre_ids
    return lead + [fmt.prefix] + pre_ids + [fmt.suffix] + suf_ids + [fmt.middle]


def _piece(tok, enc, text: str, special: bool) -> list[int]:
    """A separator is its special token; a path or code is document text."""
    i = token_id(tok, text) if special else None
    return [i] if i is not None else enc(text)


def _tail_lines(enc, text: str, budget: int) -> list[int]:
    """Encode `text` from the latest grid line whose tail fits in `budget` tokens."""
    if budget <= 0:
        return []
    lines = _lines(text)
    starts = list(range(0, len(lines), PREFIX_GRID_LINES))
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
    ids = enc(text[offs[starts[lo]]:]) if starts else enc(text)
    if len(ids) <= budget:
        return ids
    # Too long even from the nearest grid line: drop whole TOKEN_GRID steps from the front, so
    # the window start moves once per TOKEN_GRID typed tokens, not on every keystroke.
    drop = -(-(len(ids) - budget) // TOKEN_GRID) * TOKEN_GRID
    return ids[drop:]
