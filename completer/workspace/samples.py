"""Repository-level training samples: holes cut in the files of a workspace, each with the
cross-file chunks this index retrieves at the hole, in the order the pipeline puts them in a
prompt (by path and line, completer/pipeline.prompt_for). The embedded pair's recipe reads the
JSONL as data (draft_models knows nothing of this package), so the model learns to use the
context the product sends, in the format the product sends it.

    python -m completer.workspace.samples --source networkx --tokenizer draft_models/default/target \\
        --n 2000 --out runs/repo/networkx.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from draft_models.data import is_training_path, random_fim_split, source_root

from ..config import WorkspaceOptions
from .index import WorkspaceIndex

PREFIX_CHARS = 6000  # more than a 1 024-token window holds: the recipe cuts it to fit
SUFFIX_CHARS = 2000


def samples(root: Path, name: str, count_tokens, n: int, budget: int, seed: int = 0,
            allowed: Callable[[str], bool] = lambda rel: True):
    """Yield up to `n` records {path, prefix, middle, suffix, chunks: [[path, text], ...]} at
    random holes of the workspace `root` (paths written as `name/relative/path`), only those
    where the index found context and every path is `allowed` (relative to the root)."""
    index = WorkspaceIndex(root, WorkspaceOptions(index_memory_mb=4096, index_max_file_kb=300),
                           count_tokens=count_tokens)
    index.build()
    rng = random.Random(seed)
    files = [rel for rel in sorted(index._outlines) if allowed(rel)]
    made = tries = 0
    while made < n and tries < 20 * n and files:
        tries += 1
        rel = rng.choice(files)
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if len(text) < 200:
            continue
        sp = random_fim_split(text, rng)
        cursor = len(sp.prefix)
        snippets = sorted(index.retrieve(rel, text, cursor, budget),
                          key=lambda s: (s.path, s.start_line))
        if not snippets or not all(allowed(s.path) for s in snippets):
            continue
        made += 1
        head = sp.prefix[-PREFIX_CHARS:]
        if len(head) < len(sp.prefix):
            head = head[head.find("\n") + 1:]
        yield {"path": f"{name}/{rel}", "prefix": head, "middle": sp.middle, "suffix": sp.suffix[:SUFFIX_CHARS],
               "chunks": [[f"{name}/{s.path}", s.text] for s in snippets]}


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(prog="python -m completer.workspace.samples", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="a training source (draft_models.data.SOURCES)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a model directory with tokenizer.json")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--budget", type=int, default=284,
                    help="cross-file tokens (the default: 0.3 of a 1 024-token window's prompt budget)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    tok = Tokenizer.from_file(str(a.tokenizer / "tokenizer.json"))
    count = lambda s: len(tok.encode(s, add_special_tokens=False).ids)
    t0 = time.time()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        k = 0
        # the stdlib's root holds its held-out packages and a site-packages: never sampled
        allowed = lambda rel: is_training_path(a.source, rel)
        for k, rec in enumerate(samples(source_root(a.source), a.source, count, a.n, a.budget, a.seed, allowed), 1):
            f.write(json.dumps(rec) + "\n")
    print(f"{a.source}: {k} samples in {time.time() - t0:.0f} s -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
