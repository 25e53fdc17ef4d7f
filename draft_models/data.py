"""Training data for the embedded pair: Python source that exists offline (the standard library
and the installed sources of a fixed list of packages, nothing else), deduplicated, a fixed
held-out split, and the sample format (plain code and fill-in-the-middle) shared with inference."""
from __future__ import annotations

import hashlib
import importlib.util
import random
import re
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


# The only sources the pair may train on, with their licences (named in the model card). Every
# other package's code is where quality is measured (bench/holes.py --source pypi): never here.
SOURCES = {
    "stdlib": "PSF-2.0",
    "torch": "BSD-3-Clause",
    "transformers": "Apache-2.0",
    "numpy": "BSD-3-Clause",
    "sympy": "BSD-3-Clause",
    "networkx": "BSD-3-Clause",
}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_root(name: str) -> Path:
    """The folder of an allowed source: the stdlib, or an installed package's own directory
    (found without importing it). Anything outside SOURCES is refused."""
    if name not in SOURCES:
        raise ValueError(f"{name!r} is not a training source: the pair trains only on {', '.join(SOURCES)}")
    if name == "stdlib":
        return stdlib_root()
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        raise ValueError(f"training source {name!r} is not installed")
    return Path(next(iter(found.submodule_search_locations)))


def is_training_path(name: str, rel: str) -> bool:
    """Whether `rel` (relative to source `name`'s root) is in the training split: not held out,
    and in the stdlib not under its site-packages (other packages are where quality is measured)."""
    if name != "stdlib":
        return name in SOURCES
    return not rel.startswith("site-packages/") and not _is_held_out(rel)


def source_files(name: str, split: str = "train") -> list[Path]:
    """Sorted .py files of source `name`; the held-out split exists only in the stdlib."""
    if name == "stdlib":
        return corpus_files(split=split)
    if split != "train":
        return []
    root = source_root(name)
    return [p for p in sorted(root.rglob("*.py")) if p.stat().st_size <= MAX_FILE_BYTES]


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


# -- deduplication ---------------------------------------------------------------------------------
DEDUP_MIN_LINES = 8  # a top-level block this long is dropped when one of the same shape came before
_TOP = re.compile(r"^(?:async def |def |class |@)", re.MULTILINE)
_MEMBER = re.compile(r"^    (?:async def |def |@)", re.MULTILINE)
_SHAPE = [(re.compile(r'(?s)""".*?"""|\'\'\'.*?\'\'\'|"[^"\n]*"|\'[^\'\n]*\''), "s"),
          (re.compile(r"\b\d[\w.]*"), "0"), (re.compile(r"[A-Za-z_]\w*"), "x"), (re.compile(r"\s+"), " ")]


def _shape(block: str) -> bytes:
    """A block with its names, strings and numbers blanked: transformers' "Copied from ... with
    Llama->Mistral" classes differ only in names, and keep their shape."""
    for pat, rep in _SHAPE:
        block = pat.sub(rep, block)
    return hashlib.blake2b(block.encode(), digest_size=16).digest()


def top_level_blocks(text: str, pattern: re.Pattern = _TOP) -> list[str]:
    """The file cut before each top-level def, class or decorator run (the header first); with
    `_MEMBER`, a class cut before each of its methods."""
    starts = [m.start() for m in pattern.finditer(text)]
    starts = [0] + [s for i, s in enumerate(starts) if not (i and text[starts[i - 1]:s].lstrip().startswith("@")
                                                             and text[starts[i - 1]:s].count("\n") <= 1)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)]) if b > a]


def dedup(docs: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], dict]:
    """(name, text) in order → the same with exact duplicate files dropped and, inside the rest,
    every top-level block of ≥ DEDUP_MIN_LINES lines whose shape an earlier block had; stats."""
    files, shapes, out = set(), set(), []
    stats = {"files_in": len(docs), "bytes_in": 0, "files_dup": 0, "blocks_dup": 0}
    for name, text in docs:
        stats["bytes_in"] += len(text)
        key = hashlib.blake2b(text.encode(errors="replace"), digest_size=16).digest()
        if key in files:
            stats["files_dup"] += 1
            continue
        files.add(key)
        kept = []
        for block in top_level_blocks(text):
            parts = top_level_blocks(block, _MEMBER) if block.startswith("class ") else [block]
            for part in parts:  # a class's methods one by one: copies are often methods
                if part.count("\n") >= DEDUP_MIN_LINES:
                    h = _shape(part)
                    if h in shapes:
                        stats["blocks_dup"] += 1
                        continue
                    shapes.add(h)
                kept.append(part)
        if kept:
            out.append((name, "".join(kept)))
    stats.update(files_out=len(out), bytes_out=sum(len(t) for _, t in out))
    return out, stats


def training_corpus(sources: tuple[str, ...] = tuple(SOURCES), max_files: int | None = None
                    ) -> tuple[list[tuple[str, str]], dict]:
    """The deduplicated training split of `sources` as ("source/relative/path.py", text), the
    stdlib first (its copy of a shared block is the one kept); stats per source."""
    docs = []
    for name in sources:
        root = source_root(name)
        for p in source_files(name, "train")[:max_files]:
            docs.append((f"{name}/{p.relative_to(root).as_posix()}", read_source(p)))
    out, stats = dedup(docs)
    stats["sources"] = {name: {"licence": SOURCES[name],
                               "files": sum(1 for n, _ in out if n.startswith(name + "/")),
                               "bytes": sum(len(t) for n, t in out if n.startswith(name + "/"))}
                        for name in sources}
    return out, stats
