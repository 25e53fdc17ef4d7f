"""FIM prompt formats per model family (a table) and their detection against a tokenizer.
Torch-free: config takes its choices from the table; how a prompt is laid out in a family's
format, as text and as ids, is completer/prompt.py's (the prompt builder).

SPM (`<fim_suffix> suffix <fim_middle> prefix`) is used when the model was trained with it (the
embedded pair): the prompt ends at the cursor. PSM (`<fim_prefix> prefix <fim_suffix> suffix
<fim_middle>`) is the layout of most public coder models. Without FIM tokens: plain prefix. A
family with repository tokens (`repo_name`, `file_sep`) was trained on repository-level samples.
"""
from __future__ import annotations

from dataclasses import dataclass


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


def spec(name: str) -> FimSpec:
    if name not in FIM_FORMATS:
        raise ValueError(f"FIM format {name!r}: expected auto or one of {', '.join(FIM_FORMATS)}")
    return FIM_FORMATS[name]


# -- against a tokenizer -----------------------------------------------------------------------
def token_id(tok, text: str) -> int | None:
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
        f = spec(name)
        missing = [t for t in f.sentinels() if token_id(tok, t) is None]
        if missing:
            raise ValueError(f"FIM format {name!r} needs the special tokens {', '.join(map(repr, missing))}, "
                             "which this tokenizer lacks")
        ids = [None if t is None else token_id(tok, t) for t in (f.prefix, f.suffix, f.middle)]
        eos = frozenset(i for i in (token_id(tok, t) for t in f.stops + _GENERIC_STOPS) if i is not None)
        return cls(*ids, eos, f.layout, name)


def _has(tok, f: FimSpec, model_type: str | None) -> bool:
    if any(token_id(tok, t) is None for t in f.sentinels()):
        return False
    return not f.marks or model_type in f.model_types or any(token_id(tok, m) is not None for m in f.marks)
