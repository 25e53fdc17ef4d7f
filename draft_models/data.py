"""Training data for the embedded pair: Python source that exists offline, a fixed held-out
split, and the sample format (plain code and fill-in-the-middle) shared with inference."""
from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Special tokens. Ids are fixed by their order in the tokenizer (0..4).
EOT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, PAD = (
    "<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<pad>")
SPECIAL_TOKENS = [EOT, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, PAD]

# Whole stdlib packages the models never see: benchmarks and quality numbers count only here
# (plus third-party code fetched at benchmark time).
HELD_OUT = ("email", "json", "asyncio", "test/test_email", "test/test_json", "test/test_asyncio")
MAX_FILE_BYTES = 300_000  # a few generated files (pydoc_data/topics.py) are mostly one string


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_held_out(rel: str) -> bool:
    return any(rel == h or rel.startswith(h + "/") or rel == h + ".py" for h in HELD_OUT)


def corpus_files(root: Path | None = None, split: str = "train") -> list[Path]:
    """Sorted .py files of the stdlib for `split` in {"train", "heldout"} (site-packages excluded)."""
    root = root or stdlib_root()
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith("site-packages/") or p.stat().st_size > MAX_FILE_BYTES:
            continue
        if _is_held_out(rel) == (split == "heldout"):
            out.append(p)
    return out


def read_source(p: Path) -> str:
    # A few stdlib test files are not UTF-8 on purpose.
    return p.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class FimSplit:
    prefix: str
    middle: str
    suffix: str


def random_fim_split(text: str, rng: random.Random) -> FimSplit:
    """Cut a hole the way editors see them: mostly the rest of a line or a few whole lines,
    starting mid-line or after the indentation of a line."""
    n = len(text)
    if rng.random() < 0.5:
        s = rng.randrange(n + 1)
    else:
        line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < n]
        s = rng.choice(line_starts)
        while s < n and text[s] in " \t":
            s += 1
    r = rng.random()
    if r < 0.5:  # rest of the line
        e = text.find("\n", s)
        e = n if e < 0 else e
    elif r < 0.85:  # up to k more lines
        e = s
        for _ in range(rng.randint(1, 8)):
            nxt = text.find("\n", e + 1)
            e = n if nxt < 0 else nxt
    else:
        e = min(n, s + rng.randint(1, 200))
    return FimSplit(text[:s], text[s:e], text[e:])
