"""FIM prompt formats per model family (a table), their detection against a tokenizer, and how
the chunks of other files (client.Chunk, repository context) are written for a family.
Torch-free: config takes its choices from the table, the OpenAI-compatible client renders its
text prompts with `render`, the engine builds token prompts from the same pieces
(engine/prompt.py).

SPM (`<fim_suffix> suffix <fim_middle> prefix`) is used when the model was trained with it (the
embedded pair): the prompt ends at the cursor, so typing only appends tokens and the per-document
KV cache keeps everything before them. PSM (`<fim_prefix> prefix <fim_suffix> suffix
<fim_middle>`) is the layout of most public coder models. Without FIM tokens: plain prefix.

Repository context: a family with repository tokens (Qwen2.5-Coder `<|file_sep|>`, StarCoder2
`<file_sep>`) gets one `{file_sep}path\\ntext` section per chunk before its FIM prompt, as it was
trained on repository-level samples. Any other family gets each chunk as a path comment and its
text at the start of the prefix (a model without such tokens reads them as more of the file).
Chunks keep the caller's order, so the prompt's head stays the same while the user types.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .client import Chunk

SENTINEL_TOKENS = 3      # the most FIM tokens a format adds around the text (PSM: prefix, suffix, middle)
DEFAULT_COMMENT = "#"    # the path comment of a language without line comments (plain text)
# Characters per token never exceed this for the tokenizers we meet (code averages 3-4): it bounds
# how much text is looked at and tokenized, by the syntax layer and the engine alike.
MAX_CHARS_PER_TOKEN = 12


def chunks_budget(budget: int) -> int:
    """Tokens of a prompt's `budget` that the chunks of other files may take (whole chunks, in
    order, while they fit): the rule the engine's prompt (engine/prompt.py) applies and the
    syntax layer plans the cursor file's window by (pipeline.py)."""
    return budget // 2


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


# -- repository context ----------------------------------------------------------------------
def extra_pieces(name: str, chunks: Sequence[Chunk], language: str | None = None) -> list[tuple[str, bool]]:
    """The chunks as (text, is_special_token) pieces, in order: a separator token is special,
    everything from a document (paths, code) is not, so that an engine can encode the code
    without ever reading a special token in it. Where they go: before the whole FIM prompt when
    the family has a file separator (`leads_prompt`), else at the start of the prefix. A path
    comment is written in the syntax of the chunk's own file, else of `language` (the cursor
    file's, for a path of no known language), else with '#'."""
    f = spec(name)
    if f.file_sep is not None:
        out: list[tuple[str, bool]] = []
        for c in chunks:
            out += [(f.file_sep, True), (f"{c.path}\n{_ended(c.text)}", False)]
        return out
    return [(f"{_comment(language, c.path)} {c.path}\n{_ended(c.text)}\n", False) for c in chunks]


def leads_prompt(name: str) -> bool:
    """Whether the family's chunks come before the FIM prompt (repository tokens) rather than at
    the start of the prefix."""
    return spec(name).file_sep is not None


def render_extra(fmt: str, chunks: Sequence[Chunk], language: str | None = None) -> str:
    """The chunks as text for format `fmt` (see extra_pieces for where it goes)."""
    return "".join(text for text, _ in extra_pieces(fmt, chunks, language))


def render(name: str, prefix: str, suffix: str, extra: Sequence[Chunk] = (), language: str | None = None) -> str:
    """The text prompt of format `name` with the chunks `extra` (for a server that tokenizes it:
    OpenAI-compatible completions); its stop strings are `FIM_FORMATS[name].stops`."""
    f = spec(name)
    head = render_extra(name, extra, language)
    lead = head if leads_prompt(name) else ""
    prefix = prefix if lead else head + prefix
    if f.layout == "spm":
        return f"{lead}{f.suffix}{suffix}{f.middle}{prefix}"
    if f.layout == "psm":
        return f"{lead}{f.prefix}{prefix}{f.suffix}{suffix}{f.middle}"
    return lead + prefix


def _comment(language: str | None, path: str) -> str:
    from .documents import language_for  # tree-sitter's bindings: loaded only for a chunk
    from .syntax.lang import spec as lang_spec

    return lang_spec(language_for(None, path) or language).line_comment or DEFAULT_COMMENT


def _ended(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


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
