"""Mine the frequent-token fast path: (a, b) → c where the corpus makes c near-certain.

`python -m draft_models.fastpath --tokenizer DIR_OR_JSON --out FILE` counts token trigrams over the
training split and keeps contexts seen ≥ `min_count` times whose most frequent continuation
has probability ≥ `min_prob`. The drafter chains these lookups at zero model cost. It also ranks
every token by frequency (`frequent`): the engine scores only the head of that list with the
draft model's LM head.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from .data import corpus_files, read_source


def mine_tables(tok, files: list[Path], min_count: int = 20, min_prob: float = 0.9) -> dict:
    """fastpath.json's content: the trigram rows, and every token id by corpus frequency
    (`frequent`, most frequent first: a draft's LM head can be restricted to its head)."""
    seqs = [e.ids for e in tok.encode_batch([read_source(f) for f in files], add_special_tokens=False)]
    counts = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for ids in seqs:
        counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=len(counts))
    return {"min_count": min_count, "min_prob": min_prob, "rows": mine(tok, seqs, min_count, min_prob),
            "frequent": [int(i) for i in np.argsort(-counts, kind="stable")]}


def mine(tok, seqs: list[list[int]], min_count: int = 20, min_prob: float = 0.9) -> list[tuple[int, int, int]]:
    V = tok.get_vocab_size()
    keys = []
    for ids in seqs:
        a = np.asarray(ids, dtype=np.int64)
        if len(a) >= 3:
            keys.append((a[:-2] * V + a[1:-1]) * V + a[2:])  # trigram code a·V² + b·V + c
    uniq, counts = np.unique(np.concatenate(keys), return_counts=True)
    ctx = uniq // V  # (a, b) code
    # per context: total count and its most frequent continuation (uniq is sorted by ctx)
    starts = np.flatnonzero(np.r_[True, ctx[1:] != ctx[:-1]])
    totals = np.add.reduceat(counts, starts)
    best = np.maximum.reduceat(counts, starts)
    keep = (totals >= min_count) & (best >= min_prob * totals)
    rows = []
    for s, t, b in zip(starts[keep], totals[keep], best[keep]):
        seg = slice(s, s + int(np.searchsorted(ctx[s:], ctx[s], side="right")))
        c = int(uniq[seg][np.argmax(counts[seg])] % V)
        rows.append((int(ctx[s] // V), int(ctx[s] % V), c))
    return rows


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(prog="python -m draft_models.fastpath", description=__doc__)
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json or a model dir")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--min-count", type=int, default=20)
    ap.add_argument("--min-prob", type=float, default=0.9)
    ap.add_argument("--max-files", type=int)
    a = ap.parse_args(argv)
    path = a.tokenizer / "tokenizer.json" if a.tokenizer.is_dir() else a.tokenizer
    tok = Tokenizer.from_file(str(path))
    tables = mine_tables(tok, corpus_files(split="train")[: a.max_files], a.min_count, a.min_prob)
    a.out.write_text(json.dumps(tables, separators=(",", ":")) + "\n")
    print(f"{len(tables['rows'])} fast-path contexts, {len(tables['frequent'])} ranked tokens → {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
