"""FIM prompt layout for a model's special tokens, under a token budget.

SPM (`<fim_suffix> suffix <fim_middle> prefix`) is used when the model was trained with it (the
embedded pair): the prompt ends at the cursor, so typing only appends tokens and the per-document
KV cache keeps everything before them. PSM (`<fim_prefix> prefix <fim_suffix> suffix
<fim_middle>`) is the layout of most public coder models. Without FIM tokens: plain prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

_NAMES = {  # role → spellings used by model families
    "prefix": ("<fim_prefix>", "<|fim_prefix|>", "<PRE>", "<｜fim▁begin｜>"),
    "suffix": ("<fim_suffix>", "<|fim_suffix|>", "<SUF>", "<｜fim▁hole｜>"),
    "middle": ("<fim_middle>", "<|fim_middle|>", "<MID>", "<｜fim▁end｜>"),
    "eot": ("<|endoftext|>", "<|fim_pad|>", "<EOT>", "</s>", "<|end_of_text|>", "<|im_end|>"),
}
PREFIX_GRID_LINES = 16  # the prefix window starts on a multiple of this line: stable while typing
TOKEN_GRID = 32         # when even one grid block is too long, drop tokens in steps of this


@dataclass(frozen=True)
class FimFormat:
    prefix: int | None
    suffix: int | None
    middle: int | None
    eos: frozenset[int]
    layout: str  # "spm" | "psm" | "none"

    @classmethod
    def detect(cls, tok, layout: str = "auto") -> FimFormat:
        ids = {role: next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)
               for role, names in _NAMES.items()}
        eos = frozenset(tok.token_to_id(n) for n in _NAMES["eot"] if tok.token_to_id(n) is not None)
        has_fim = None not in (ids["prefix"], ids["suffix"], ids["middle"])
        if not has_fim:
            layout = "none"
        elif layout == "auto":
            # The embedded tokenizer spells them <fim_*> and was trained SPM-first.
            layout = "spm" if tok.token_to_id("<fim_suffix>") is not None else "psm"
        return cls(ids["prefix"], ids["suffix"], ids["middle"], eos, layout)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def build_prompt(tok, fmt: FimFormat, prefix: str, suffix: str, budget: int,
                 suffix_share: float = 0.25) -> list[int]:
    """Token ids of a FIM prompt whose length is at most `budget`. The suffix keeps its first
    lines, the prefix its last lines from a window start snapped to a grid of lines."""
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids if s else []
    if fmt.layout == "none":
        return _tail_lines(enc, prefix, budget)
    budget -= 3
    suf_ids: list[int] = []
    if suffix:
        want = int(budget * suffix_share)
        lines, take = _lines(suffix), []
        for ln in lines:  # whole lines until the share is used
            take.append(ln)
            if len(take) % 8 == 0 and len(enc("".join(take))) > want:
                break
        suf_ids = enc("".join(take))[:want]
    pre_ids = _tail_lines(enc, prefix, budget - len(suf_ids))
    if fmt.layout == "spm":
        return [fmt.suffix] + suf_ids + [fmt.middle] + pre_ids
    return [fmt.prefix] + pre_ids + [fmt.suffix] + suf_ids + [fmt.middle]


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
