"""Next-edit prompt formats (a table, like completer/fim.py's FIM table): how the edit history
and the editable region are written for a model, and how its answer is read back.

The embedded pair's own format ("completer") reuses its FIM tokens. It is defined by the pair's
recipe (draft_models/edit_format.py: what the fine-tune renders its samples with) and used here
as it is:

    <fim_prefix>{history}<fim_suffix>{region}<fim_middle>{the region rewritten}<|endoftext|>

`history` is the recent edit events, oldest first, each as its changed lines only (`-old`,
`+new`, no context and no hunk headers: line numbers would change with every edit and the
region is right there), preceded by `# path` when the event is in another file. The region is
tokenized on its own, as the answer is: an unchanged line is the same tokens in both, which is
what the speculative-edit drafter (engine/drafters.EditDrafter) copies from.

Two public formats sit beside it, written from their documentation (both models are of the
Qwen2.5-Coder family): Zed's Zeta (an instruction prompt in plain text: the user's edits as diffs,
the excerpt with `<|editable_region_start|>` / `<|editable_region_end|>` around the region and
`<|user_cursor_is_here|>` at the cursor; the answer repeats the markers around the region
rewritten) and Sweep's next-edit model (Qwen's `<|file_sep|>` sections: other files' snippets, each edit as
`{path}.diff` with `original:` / `updated:` blocks, then `original/{path}` (the region before the
last edit), `current/{path}` and an open `updated/{path}` the model writes). `detect` picks one:
the embedded pair (its FIM format) gets its own, a model named zeta or sweep gets that one, a
Qwen-style tokenizer (`<|file_sep|>`) Sweep's, anything else Zeta's (plain text: any model reads it).

Torch-free: the language server imports it.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draft_models.edit_format import HistoryItem, Piece, own_prompt


@dataclass(frozen=True)
class EditPrompt:
    """What a next-edit prompt is made of: the history (oldest first), the file's path, the
    editable region (whole lines), the cursor as a char offset in it, the file's text just
    before and after the region and other files' snippets (context a format may show: Zeta
    shows the text around the region, Sweep the snippets; ours neither)."""
    history: tuple[HistoryItem, ...]
    path: str
    region: str
    cursor: int = 0
    before: str = ""
    after: str = ""
    extra: tuple = ()  # other files' snippets (client.Chunk: path, text), for a format that shows them


@dataclass(frozen=True)
class EditFormat:
    """One model family's next-edit format. `prompt(req)` gives the prompt as pieces; `draft(req)`
    is the answer when nothing changes (what the speculative-edit drafter copies from); the answer
    is read back by `region(text)` (None: no region in it) and ends at one of `stops`; `models`
    are model-name substrings that select it."""
    name: str
    prompt: Callable[[EditPrompt], list[Piece]]
    stops: tuple[str, ...]
    draft: Callable[[EditPrompt], str] = lambda r: r.region
    region: Callable[[str], str | None] = lambda text: text
    models: tuple[str, ...] = ()


# -- Zed's Zeta -------------------------------------------------------------------------------
ZETA_START, ZETA_END = "<|editable_region_start|>", "<|editable_region_end|>"
ZETA_CURSOR, ZETA_FILE_START = "<|user_cursor_is_here|>", "<|start_of_file|>"
_ZETA_INSTRUCTION = ("You are a code completion assistant and your task is to analyze user edits and then "
                     "rewrite an excerpt that the user provides, suggesting the appropriate edits within the "
                     "excerpt, taking into account the cursor location.")


def _zeta_edits(history: Sequence[HistoryItem]) -> str:
    """Each edit as Zeta's events: `User edited "path":` and a unified diff hunk (its line
    numbers count from the edit's first line: the history does not carry the file's)."""
    out = []
    for h in history:
        hunk = list(difflib.unified_diff(h.old.splitlines(), h.new.splitlines(), lineterm=""))[2:]
        if hunk:
            out.append(f'User edited "{h.path}":\n\n```diff\n' + "\n".join(hunk) + "\n```\n")
    return "\n".join(out)


def _ended(s: str) -> str:
    return s if not s or s.endswith("\n") else s + "\n"


def _zeta_excerpt(r: EditPrompt, region: str) -> str:
    return (f"```{r.path}\n{ZETA_FILE_START if not r.before else ''}{_ended(r.before)}"
            f"{ZETA_START}\n{_ended(region)}{ZETA_END}")


def zeta_prompt(r: EditPrompt) -> list[Piece]:
    excerpt = _zeta_excerpt(r, r.region[:r.cursor] + ZETA_CURSOR + r.region[r.cursor:])
    return [Piece(f"### Instruction:\n{_ZETA_INSTRUCTION}\n\n### User Edits:\n\n{_zeta_edits(r.history)}\n"
                  f"### User Excerpt:\n\n{excerpt}\n{_ended(r.after)}```\n\n### Response:\n\n")]


def zeta_draft(r: EditPrompt) -> str:
    """The excerpt as the answer repeats it (context, markers, the region) without the cursor."""
    return _zeta_excerpt(r, r.region)


def zeta_region(text: str) -> str | None:
    """The text between the markers (the end marker is the stop, so it may be missing); the
    cursor marker the model may copy is dropped."""
    i = text.find(ZETA_START)
    if i < 0:
        return None
    body = text[i + len(ZETA_START):].removeprefix("\n")
    return body.split(ZETA_END, 1)[0].replace(ZETA_CURSOR, "")


# -- Sweep's next-edit model ----------------------------------------------------------------------
SWEEP_SEP = "<|file_sep|>"


def _unapplied(r: EditPrompt) -> str:
    """The region before the last edit of the history (the region itself when that edit is elsewhere)."""
    last = r.history[-1] if r.history else None
    if last is None or last.path != r.path or not last.new or last.new not in r.region:
        return r.region
    return r.region.replace(last.new, last.old, 1)


def sweep_prompt(r: EditPrompt) -> list[Piece]:
    sep = Piece(SWEEP_SEP, True)
    out: list[Piece] = []
    for c in r.extra:
        out += [sep, Piece(f"{c.path}\n{_ended(c.text)}")]
    for h in r.history:
        out += [sep, Piece(f"{h.path}.diff\noriginal:\n{_ended(h.old)}updated:\n{_ended(h.new)}")]
    return out + [sep, Piece(f"original/{r.path}\n{_ended(_unapplied(r))}"), sep,
                  Piece(f"current/{r.path}\n{_ended(r.region)}"), sep, Piece(f"updated/{r.path}\n")]


EDIT_FORMATS: dict[str, EditFormat] = {
    "completer": EditFormat("completer", lambda r: own_prompt(r.history, r.path, r.region), ("<|endoftext|>",)),
    "zeta": EditFormat("zeta", zeta_prompt, (ZETA_END, "<|endoftext|>", "<|im_end|>"), zeta_draft, zeta_region,
                       ("zeta",)),
    "sweep": EditFormat("sweep", sweep_prompt, (SWEEP_SEP, "<|endoftext|>", "<|im_end|>"), models=("sweep",)),
}


def edit_budget(draft_tokens: int, max_new: int | None = None) -> int:
    """Tokens a rewrite may generate: the caller's bound, else the unchanged answer's tokens
    x 1.25 + 32 (room for what the edit adds)."""
    return max_new or draft_tokens * 5 // 4 + 32


def read_answer(f: EditFormat, text: str) -> str | None:
    """The region in an answer of format `f` (cut at the first of its stops; None: none in it)."""
    for stop in f.stops:
        text = text.split(stop, 1)[0]
    return f.region(text)


def detect(name: str, *, fim: str | None = None, model: str = "",
           has_token: Callable[[str], bool] = lambda text: False) -> EditFormat:
    """The format `name`, or for "auto": ours for the embedded pair (its FIM format is
    "completer"), else the one a model name names, else Sweep's for a tokenizer with Qwen's
    `<|file_sep|>` (or a Qwen FIM format), else Zeta's (plain text). ValueError for an unknown name."""
    if name != "auto":
        if name not in EDIT_FORMATS:
            raise ValueError(f"next-edit format {name!r}: expected auto or one of {', '.join(EDIT_FORMATS)}")
        return EDIT_FORMATS[name]
    if fim == "completer":
        return EDIT_FORMATS["completer"]
    low = model.lower()
    for f in EDIT_FORMATS.values():
        if any(m in low for m in f.models):
            return f
    return EDIT_FORMATS["sweep" if fim == "qwen" or has_token(SWEEP_SEP) else "zeta"]
