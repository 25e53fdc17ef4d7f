"""FIM prompt formats per model family (a table), and the prompt under a token budget.

SPM (`<fim_suffix> suffix <fim_middle> prefix`) is used when the model was trained with it (the
embedded pair): the prompt ends at the cursor, so typing only appends tokens and the per-document
KV cache keeps everything before them. PSM (`<fim_prefix> prefix <fim_suffix> suffix
<fim_middle>`) is the layout of most public coder models. Without FIM tokens: plain prefix.

Torch-free: remote clients render text prompts for OpenAI-compatible servers with `render`.
"""
from __future__ import annotations

from dataclasses import dataclass

PREFIX_GRID_LINES = 16  # the prefix window starts on a multiple of this line: stable while typing
TOKEN_GRID = 32         # when even one grid block is too long, drop tokens in steps of this


@dataclass(frozen=True)
class FimSpec:
    """One family's FIM format as text. In SPM the `middle` sentinel comes before the prefix,
    which ends the prompt (Codestral: `[SUFFIX]` suffix `[PREFIX]` prefix, no third sentinel).
    Detection (`FimFormat.detect`): the sentinels are special tokens of the tokenizer and, where
    spellings are shared, one of `marks` is too or the config's model_type is in `model_types`."""
    layout: str                  # "psm" | "spm" | "none"
    prefix: str | None
    suffix: str | None
    middle: str | None
    stops: tuple[str, ...]       # generation ends at any of these
    repo_name: str | None = None  # repo-level context: <repo_name>name<file_sep>path\ncode...
    file_sep: str | None = None
    marks: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()

    def sentinels(self) -> tuple[str, ...]:
        return tuple(t for t in (self.prefix, self.suffix, self.middle) if t is not None)


_GENERIC_STOPS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>", "<eos>")
# name → format. Detection tries them in this order, first match wins: formats sharing spellings
# come most specific first (CodeGemma before Qwen, StarCoder before our pair).
FIM_FORMATS: dict[str, FimSpec] = {
    "codegemma": FimSpec("psm", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                         ("<|file_separator|>", "<eos>"), marks=("<|file_separator|>",), model_types=("gemma",)),
    "qwen": FimSpec("psm", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                    ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|im_end|>"),
                    repo_name="<|repo_name|>", file_sep="<|file_sep|>"),
    "starcoder": FimSpec("psm", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", ("<|endoftext|>", "<file_sep>"),
                         repo_name="<repo_name>", file_sep="<file_sep>", marks=("<fim_pad>", "<file_sep>"),
                         model_types=("starcoder2", "gpt_bigcode")),
    # the embedded pair: StarCoder's spellings without its <fim_pad>/<file_sep>, trained SPM-first
    "completer": FimSpec("spm", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", ("<|endoftext|>",)),
    "deepseek": FimSpec("psm", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                        ("<｜end▁of▁sentence｜>", "<|EOT|>")),
    "codellama": FimSpec("psm", "<PRE> ", " <SUF>", " <MID>", ("<EOT>", "</s>")),
    "codestral": FimSpec("spm", None, "[SUFFIX]", "[PREFIX]", ("</s>",)),
    "none": FimSpec("none", None, None, None, _GENERIC_STOPS),
}


def render(name: str, prefix: str, suffix: str) -> str:
    """The text prompt of format `name` (for a server that tokenizes it: OpenAI-compatible
    completions); its stop strings are `FIM_FORMATS[name].stops`."""
    f = _spec(name)
    if f.layout == "spm":
        return f"{f.suffix}{suffix}{f.middle}{prefix}"
    if f.layout == "psm":
        return f"{f.prefix}{prefix}{f.suffix}{suffix}{f.middle}"
    return prefix


def _spec(name: str) -> FimSpec:
    if name not in FIM_FORMATS:
        raise ValueError(f"FIM format {name!r}: expected auto or one of {', '.join(FIM_FORMATS)}")
    return FIM_FORMATS[name]


def _token_id(tok, text: str) -> int | None:
    """The id of a special token spelled `text` (CodeLlama's sentencepiece vocabulary spells
    "<PRE> " as "▁<PRE>")."""
    core = text.strip()
    for t in (text, core, "▁" + core):
        i = tok.token_to_id(t)
        if i is not None:
            return i
    return None


@dataclass(frozen=True)
class FimFormat:
    """A FIM format resolved against one tokenizer: the sentinels' ids and the stop ids."""
    prefix: int | None
    suffix: int | None
    middle: int | None
    eos: frozenset[int]
    layout: str  # "spm" | "psm" | "none"
    name: str = "none"  # key of FIM_FORMATS

    @classmethod
    def detect(cls, tok, name: str = "auto", model_type: str | None = None) -> FimFormat:
        """The format `name` (a key of FIM_FORMATS), or for "auto" the first in the table whose
        sentinels are tokens of `tok` (see FimSpec); "none" (plain prefix) when none is."""
        if name == "auto":
            name = next((n for n, f in FIM_FORMATS.items() if f.layout != "none" and _has(tok, f, model_type)),
                        "none")
        f = _spec(name)
        missing = [t for t in f.sentinels() if _token_id(tok, t) is None]
        if missing:
            raise ValueError(f"FIM format {name!r} needs the special tokens {', '.join(map(repr, missing))}, "
                             "which this tokenizer lacks")
        ids = [None if t is None else _token_id(tok, t) for t in (f.prefix, f.suffix, f.middle)]
        eos = frozenset(i for i in (_token_id(tok, t) for t in f.stops + _GENERIC_STOPS) if i is not None)
        return cls(*ids, eos, f.layout, name)


def _has(tok, f: FimSpec, model_type: str | None) -> bool:
    if any(_token_id(tok, t) is None for t in f.sentinels()):
        return False
    return not f.marks or model_type in f.model_types or any(_token_id(tok, m) is not None for m in f.marks)


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
    if fmt.layout == "spm":  # Codestral: [SUFFIX] suffix [PREFIX] prefix (its "middle" is [PREFIX])
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
