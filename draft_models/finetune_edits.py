"""Teach the embedded pair next edits (issue 24 item 4): `python -m draft_models.finetune_edits`.

Starts from a pair made by draft_models.build (--src: the shipped pair by default) and widens
its window to `--ctx` positions (an editable region of 20–40 lines is written twice: as the
original and as the answer). Stages, each checkpointed into --run-dir and
resumed from there like build.py's:
1. induction: strings of frequent tokens repeated (InductionStream), until the target copies;
2. (--realign-steps) realign: edited copies of strings from the whole vocabulary (RealignStream),
   so that it copies by content, rare tokens too, and finds its place again after a change;
   (--subst-steps) substitution: arbitrary spans renamed in real code (SubstituteStream), so that
   it carries the history's change by looking it up, not by guessing;
   (optional, --copy-steps) copy tasks: regions of code answered unchanged;
3. edits: a mix of edit tasks (draft_models/edit_data.py, loss on the answer only; --copy-rate of
   them copy tasks, --realign-rate realign rows) and the ordinary plain/FIM samples of the first
   recipe at the new length, so that completion does not get worse;
4. the draft distilled again from the fine-tuned target on the same mix.
--kind-weights sets the edit kinds' mix (edit_data.KIND_WEIGHTS by default); --grow-layers
deepens the target before any stage (grow_layers: it computes the same until trained).
The defaults are the first run draft_models/MODEL_CARD.md reports; the second went on from it with
--induction-steps 0 --realign-steps 500 --realign-rate 0.15 --target-steps 1100 (neither was
enough: not shipped).
Seeded; held-out files (data.HELD_OUT) stay out. bf16 where the CPU multiplies it natively;
draft_models/gpu_finetune.sh runs the same on a lent GPU.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from . import DEFAULT_DIR
from .data import PAD, corpus_files, read_source
from .edit_data import KIND_WEIGHTS, KINDS, make_task, own_sample_ids, parse_kind_weights, sample_ids
from .tokenizer import save_hf_tokenizer
from .train import SampleStream, TrainConfig, evaluate_loss, run_stage


def to_batch(rows: list[tuple[list[int], list[int]]], pad: int,
             weights: list[list[float]] | None = None) -> tuple[torch.Tensor, ...]:
    """(ids, labels: the id each position predicts, or -100) rows → inputs padded to the longest
    and targets shifted by one; with `weights` (one per id of each row, as the labels), the loss's
    weight per target too."""
    T = max(len(ids) for ids, _ in rows)
    x = torch.full((len(rows), T), pad, dtype=torch.long)
    y = torch.full_like(x, -100)
    w = torch.zeros(len(rows), T) if weights is not None else None
    for b, (ids, labels) in enumerate(rows):
        x[b, : len(ids)] = torch.tensor(ids)
        y[b, : len(ids) - 1] = torch.tensor(labels[1:])
        if w is not None:
            w[b, : len(ids) - 1] = torch.tensor(weights[b][1:])
    return (x, y) if weights is None else (x, y, w)


def changed_positions(region: list[int], answer: list[int]) -> list[int]:
    """Indexes of `answer`'s tokens that are not a copy of `region`'s (what an edit changes: a
    renamed site, an added argument), by a longest-matching-blocks diff of the two id lists."""
    sm = difflib.SequenceMatcher(None, region, answer, autojunk=False)
    return [j for op, _, _, j1, j2 in sm.get_opcodes() if op in ("replace", "insert") for j in range(j1, j2)]


class MixedStream:
    """Batches of edit tasks or of the ordinary stream's samples (see `batch`). A pure function
    of (seed, step), like SampleStream."""

    def __init__(self, texts: list[str], paths: list[str], tok: Tokenizer, seq_len: int, seed: int,
                 edit_rate: float = 0.5, max_region_chars: int = 1400, copy_rate: float = 0.0,
                 realign: RealignStream | None = None, realign_rate: float = 0.0,
                 subst: SubstituteStream | None = None, subst_rate: float = 0.0, site_weight: float = 1.0,
                 kind_weights: tuple[float, ...] = KIND_WEIGHTS):
        self.kind_weights = kind_weights  # the edit kinds' mix (edit_data.KINDS order)
        self.texts, self.paths, self.tok, self.seq_len, self.seed = texts, paths, tok, seq_len, seed
        self.edit_rate, self.max_region_chars, self.copy_rate = edit_rate, max_region_chars, copy_rate
        self.realign, self.realign_rate = realign, realign_rate if realign is not None else 0.0
        self.subst, self.subst_rate = subst, subst_rate if subst is not None else 0.0
        self.site_weight = site_weight  # an edit task's changed answer tokens weigh this much in the loss
        self.plain = SampleStream(texts, tok, seq_len, seed)
        self.pad = tok.token_to_id(PAD)
        self.enc = lambda s: tok.encode(s).ids if s else []

    def _edit(self, rng: random.Random) -> tuple[list[int], int, list[int]] | None:
        """An edit task's ids, where its answer starts, and the ids' positions the edit changed."""
        for _ in range(20):
            i = rng.randrange(len(self.texts))
            task = make_task(self.texts[i], self.paths[i], rng, max_region_chars=self.max_region_chars,
                             weights=self.kind_weights)
            if task is None:
                continue
            ids, start = sample_ids(task, self.tok, self.enc)
            if len(ids) <= self.seq_len:
                # the answer's ids are ids[start:-1] (then the end-of-text id); the region's, encoded alike
                sites = changed_positions(self.enc(task.region_text()), ids[start:-1]) if self.site_weight != 1 else []
                return ids, start, [start + j for j in sites]
        return None

    def _copy(self, rng: random.Random) -> tuple[list[int], int]:
        """A task with no history whose answer is its region unchanged: a few lines of code, or (a
        third of them) the tokens of a few lines shuffled, where nothing but copying predicts the
        answer (real tokens: their embeddings are trained, unlike rare ids). What grows the
        induction heads an edit needs: every unchanged token of an answer is a copy."""
        text = self.texts[rng.randrange(len(self.texts))]
        lines = text.splitlines(keepends=True) or ["\n"]
        lo = rng.randrange(len(lines))
        region = "".join(lines[lo:lo + rng.randint(1, 20)])[: rng.randint(40, self.max_region_chars)]
        if rng.random() < 1 / 3:
            ids = self.enc(region)
            rng.shuffle(ids)
            region = self.tok.decode(ids).replace("\r", "") + "\n"
        return own_sample_ids([], "x.py", region, region, self.tok, self.enc)

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A step is all edit tasks (twice `batch_size`: they are short) with probability
        `edit_rate`, else ordinary samples; the batch is as long as its longest sample. Of an
        edit step's rows, `copy_rate` are copy tasks (`_copy`), `realign_rate` RealignStream rows
        and `subst_rate` SubstituteStream rows (drawn first: what they taught is kept up)."""
        rng = random.Random(self.seed * 1_000_003 + step)
        edits = rng.random() < self.edit_rate
        rows: list[tuple[list[int], list[int]]] = []  # (ids, labels: the id each position predicts, or -100)
        weights: list[list[float]] | None = [] if self.site_weight != 1 else None
        for _ in range(batch_size * 2 if edits else batch_size):
            sites: list[int] = []
            if edits and self.realign_rate and rng.random() < self.realign_rate:
                rows.append(self.realign.row(rng))
            elif edits and self.subst_rate and rng.random() < self.subst_rate:
                rows.append(self.subst.row(rng))
            else:
                got = (self._copy(rng) + ([],) if rng.random() < self.copy_rate else self._edit(rng)) if edits else None
                ids, start, sites = got if got else (self.plain.sample(rng), 0, [])
                rows.append((ids, [-100] * start + ids[start:]))
            if weights is not None:
                w = [1.0] * len(rows[-1][0])
                for p in sites:
                    w[p] = self.site_weight
                weights.append(w)
        return to_batch(rows, self.pad, weights)


class InductionStream:
    """Rows `<fim_suffix> s <fim_middle> s s`: `s` a string of n (16..48) tokens drawn from the
    corpus' most frequent ones (fastpath.json's ranking: their embeddings are trained), the loss on
    both repeats, where only copying helps. The pair never copied (a 10M model trained on ~3M
    tokens has no induction heads), and neither edit tasks nor copies of code grew them in 400
    steps: the LM's own guess is too good there. On these strings the shipped target's copy
    accuracy stayed near 0 for ~750 steps, then went 0.05 → 0.99 within 150 (one run, 2026-12-02).
    A pure function of (seed, step), like the other streams."""

    def __init__(self, frequent: list[int], tok: Tokenizer, seed: int):
        self.frequent, self.seed = frequent, seed
        self.pad, self.suffix, self.middle = (tok.token_to_id(t) for t in (PAD, "<fim_suffix>", "<fim_middle>"))

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + step)
        n = rng.randint(16, 48)
        x = torch.full((batch_size, 3 * n + 2), self.pad, dtype=torch.long)
        y = torch.full_like(x, -100)
        for b in range(batch_size):
            s = [rng.choice(self.frequent) for _ in range(n)]
            x[b] = torch.tensor([self.suffix] + s + [self.middle] + s + s)
            y[b, n + 1: 3 * n + 1] = torch.tensor(s + s)
        return x, y


class RealignStream:
    """Rows `<fim_prefix><fim_suffix> s <fim_middle> s'`: `s` n (16..320) tokens drawn from a random
    subset of V (8..all, log-uniform) of the vocabulary's ordinary tokens, `s'` that string with
    0..4 spans of 1..4 tokens replaced, inserted or deleted; the loss on the tokens of `s'` that
    are copies. What InductionStream leaves out, measured on its checkpoint (2026-12-02): it copies
    strings of its own lengths (≤ 48: 0.99) but not of 128 tokens (0.15) nor code (0.15): it
    learned the offset, not the content. Here the offset moves at every edit and repeats make a
    one-token match ambiguous, so only matching the last few tokens against the original finds the
    place: the re-alignment an answer needs after each change. Every token, not only frequent
    ones: after edits the copies failed on rare ones (`wri`, `ume`, `asyncio`: the identifiers a
    rename moves), as a copying circuit trained on 2 048 tokens maps only those. A pure function of
    (seed, step)."""

    def __init__(self, vocab: list[int], tok: Tokenizer, seed: int, max_len: int = 320):
        self.frequent, self.seed, self.max_len = vocab, seed, max_len
        self.pad, self.prefix, self.suffix, self.middle, self.eos = (
            tok.token_to_id(t) for t in (PAD, "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"))

    def row(self, rng: random.Random) -> tuple[list[int], list[int]]:
        voc = rng.sample(self.frequent, min(len(self.frequent), int(2 ** rng.uniform(3, math.log2(len(self.frequent))))))
        s = [rng.choice(voc) for _ in range(rng.randint(16, self.max_len))]
        out, copied = list(s), [True] * len(s)
        for _ in range(rng.randint(0, 4)):
            at, k = rng.randrange(len(out)), rng.randint(1, 4)
            kind = rng.choice(("sub", "ins", "del"))
            new = [rng.choice(voc) for _ in range(k)]
            if kind == "del":
                del out[at:at + k], copied[at:at + k]
            else:
                end = at + k if kind == "sub" else at
                out[at:end], copied[at:end] = new, [False] * k
        ids = [self.prefix, self.suffix] + s + [self.middle]
        start = len(ids)
        ids += out + [self.eos]
        labels = [-100] * start + [t if c else -100 for t, c in zip(out, copied)] + [self.eos]
        return ids, labels

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + step)
        return to_batch([self.row(rng) for _ in range(batch_size)], self.pad)


class SubstituteStream:
    """Rows in the edit format, `<fim_prefix> -L +L' <fim_suffix> R <fim_middle> R'`: R is 2..20
    lines of real code (tokenized line by line) with a span X (1..3 tokens from the whole
    vocabulary) put at 2..6 places; the history L → L' is the line of one of them with X replaced by
    Y (1..3 tokens; half the time X with tokens added, as renames often are), that place already
    Y in R; the answer R' has Y at every place (R unchanged in 12 % of rows, where X is nowhere
    else). The loss on the whole answer. What the edit tasks left out, measured (MODEL_CARD.md):
    after copying was learnt, the changed tokens stayed at 0.60 — a rename of code the model can
    guess from its prior. Here X is arbitrary, so only looking X up in the history predicts Y (the
    lookup a propagated rename needs), as InductionStream's strings force copying. A pure function
    of (seed, step)."""

    def __init__(self, texts: list[str], vocab: list[int], tok: Tokenizer, seed: int):
        self.texts, self.vocab, self.tok, self.seed = texts, vocab, tok, seed
        self.pad, self.prefix, self.suffix, self.middle, self.eos = (
            tok.token_to_id(t) for t in (PAD, "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>"))
        self.minus, self.plus = tok.encode("-").ids[0], tok.encode("+").ids[0]

    def row(self, rng: random.Random) -> tuple[list[int], list[int]]:
        text = self.texts[rng.randrange(len(self.texts))]
        lines = text.splitlines(keepends=True) or ["pass\n"]
        lo = rng.randrange(len(lines))
        region = [self.tok.encode(ln).ids for ln in lines[lo:lo + rng.randint(2, 20)] if ln.strip()] or [[203]]
        x = [rng.choice(self.vocab) for _ in range(rng.randint(1, 3))]
        y = x + [rng.choice(self.vocab) for _ in range(rng.randint(1, 2))] if rng.random() < 0.5 else \
            [rng.choice(self.vocab) for _ in range(rng.randint(1, 3))]
        places = sorted({(rng.randrange(len(region)), rng.random()) for _ in range(rng.randint(2, 6))})
        if rng.random() < 0.12:  # nothing else to change
            places = places[:1]
        user = rng.randrange(len(places))
        old, cur, ans = [list(ln) for ln in region], [list(ln) for ln in region], [list(ln) for ln in region]
        for j, (li, f) in reversed(list(enumerate(places))):
            at = int(f * max(0, len(region[li]) - 1))  # before the line's last token (its newline)
            old[li][at:at] = x
            cur[li][at:at] = y if j == user else x
            ans[li][at:at] = y
        ul = places[user][0]
        ids = [self.prefix, self.minus] + old[ul] + [self.plus] + cur[ul] + [self.suffix]
        ids += [t for ln in cur for t in ln] + [self.middle]
        start = len(ids)
        ids += [t for ln in ans for t in ln] + [self.eos]
        return ids, [-100] * start + ids[start:]

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = random.Random(self.seed * 1_000_003 + step)
        return to_batch([self.row(rng) for _ in range(batch_size)], self.pad)


def seeds_seen(src: Path) -> list[int]:
    """The seeds of the edit fine-tunes a pair has been through, oldest first, as its
    build_summary.json records them (none: a pair never fine-tuned here, or one from before the
    record)."""
    path = src / "build_summary.json"
    if not path.is_file():
        return []
    return [int(x) for x in json.loads(path.read_text()).get("edits_finetune", {}).get("seeds", [])]


def pick_seed(seen: list[int], requested: int | None) -> tuple[int, bool]:
    """(the seed to train with, whether it repeats one in `seen`): `requested`, else the first
    not in `seen` (a stream is a pure function of seed and step: the same seed would show a
    continuation the very tasks its source learnt, from step 0 — what the runs from the fifth to
    the thirteenth did, MODEL_CARD.md run 14)."""
    if requested is not None:
        return requested, requested in seen
    return next(s for s in range(len(seen) + 1) if s not in seen), False


def _load(d: Path, ctx: int):
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(str(d), torch_dtype=torch.float32)
    m.config.max_position_embeddings = ctx  # RoPE has no table to grow: the fine-tune teaches the new positions
    return m


def grow_layers(model, n: int) -> list[int]:
    """Deepen a Llama `model` to `n` layers without changing what it computes: each new layer is
    a copy of the one it follows (its attention and MLP start from patterns that already work)
    with the two projections that write into the residual stream (o_proj, down_proj) zeroed, so
    it adds nothing until the fine-tune teaches it to. New layers follow evenly spaced old ones.
    Returns the new layers' indices (none when the model has `n` layers or more)."""
    import copy

    old = list(model.model.layers)
    extra = n - len(old)
    if extra <= 0:
        return []
    after = [round((i + 1) * len(old) / extra) - 1 for i in range(extra)]  # the old layers they follow
    layers, added = [], []
    for i, layer in enumerate(old):
        layers.append(layer)
        for _ in range(after.count(i)):
            dup = copy.deepcopy(layer)
            torch.nn.init.zeros_(dup.self_attn.o_proj.weight)
            torch.nn.init.zeros_(dup.mlp.down_proj.weight)
            added.append(len(layers))
            layers.append(dup)
    model.model.layers = torch.nn.ModuleList(layers)
    for i, layer in enumerate(layers):
        layer.self_attn.layer_idx = i  # the KV cache's slot
    model.config.num_hidden_layers = n
    types = getattr(model.config, "layer_types", None)
    if types:
        model.config.layer_types = [types[0]] * n
    return added


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draft_models.finetune_edits", description=__doc__)
    ap.add_argument("--src", type=Path, default=DEFAULT_DIR, help="the pair to start from")
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--run-dir", type=Path, default=Path("runs/edits"))
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--induction-steps", type=int, default=2000,
                    help="the first stage (InductionStream): at most this many steps")
    ap.add_argument("--induction-until", type=float, default=0.9,
                    help="the first stage ends once its held-out strings are copied at this token accuracy "
                         "(checked every --induction-eval-every steps; 0: all --induction-steps)")
    ap.add_argument("--induction-eval-every", type=int, default=50)
    ap.add_argument("--induction-lr", type=float, default=3e-3)
    ap.add_argument("--induction-batch", type=int, default=48)
    ap.add_argument("--target-steps", type=int, default=600, help="edit tasks and ordinary samples")
    ap.add_argument("--draft-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=6)
    ap.add_argument("--edit-rate", type=float, default=0.7)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--max-region-chars", type=int, default=1200, help="shorter regions: an easier start")
    ap.add_argument("--seed", type=int, default=None,
                    help="the tasks' order (a pure function of seed and step); default: one the source's record "
                         "(build_summary.json, edits_finetune.seeds) has not used, so a continuation sees new "
                         "tasks (the same seed repeats the same tasks from step 0), else 0")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cuda where a GPU is lent (draft_models/gpu_finetune.sh)")
    ap.add_argument("--workers", type=int, default=0, help="processes making batches ahead (with --device cuda)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=250, help="steps between held-out evaluations (and at each stage's end)")
    ap.add_argument("--eval-batches", type=int, default=6, help="batches per evaluation (one took ~3 min on one Xeon core)")
    ap.add_argument("--copy-steps", type=int, default=0,
                    help="a stage of copy tasks only (4 times --batch-size rows a step) after the induction stage")
    ap.add_argument("--realign-steps", type=int, default=0,
                    help="a stage of edited copies of frequent-token strings (RealignStream) after the induction stage")
    ap.add_argument("--realign-lr", type=float, default=1e-3)
    ap.add_argument("--realign-batch", type=int, default=12)
    ap.add_argument("--realign-rate", type=float, default=0.0, help="RealignStream rows among the edit rows after that")
    ap.add_argument("--subst-steps", type=int, default=0,
                    help="a stage of arbitrary spans renamed in real code (SubstituteStream) after the realign stage")
    ap.add_argument("--subst-lr", type=float, default=1e-3)
    ap.add_argument("--subst-batch", type=int, default=12)
    ap.add_argument("--subst-rate", type=float, default=0.0, help="SubstituteStream rows among the edit rows after that")
    ap.add_argument("--copy-rate", type=float, default=0.1, help="copy tasks among the edit rows after that")
    ap.add_argument("--site-weight", type=float, default=1.0,
                    help="the loss's weight on an edit answer's changed tokens (the sites the history's change "
                         "carries to: a few of a region's hundred tokens); held-out evaluations then report "
                         "their accuracy apart (site_acc)")
    ap.add_argument("--kind-weights", default="",
                    help="the edit kinds' mix, KIND=WEIGHT,... over " + ", ".join(KINDS) + " (a kind left out keeps "
                         "its default share: " + ", ".join(f"{k}={w}" for k, w in zip(KINDS, KIND_WEIGHTS, strict=True))
                         + "); held-out evaluations keep the default mix")
    ap.add_argument("--grow-layers", type=int, default=0,
                    help="deepen the target to this many layers first (grow_layers: new layers start as identities)")
    a = ap.parse_args(argv)
    try:
        kind_weights = parse_kind_weights(a.kind_weights)
    except ValueError as e:
        ap.error(str(e))
    seen = seeds_seen(a.src)
    a.seed, repeat = pick_seed(seen, a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    a.run_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, file=sys.stderr, flush=True)
        with open(a.run_dir / "log.txt", "a") as f:
            f.write(line + "\n")

    if repeat:
        log(f"warning: seed {a.seed} was used before on {a.src} ({seen}): its tasks repeat from step 0")
    torch.manual_seed(a.seed)
    tok = Tokenizer.from_file(str(a.src / "target" / "tokenizer.json"))
    train_files, held_files = corpus_files(split="train"), corpus_files(split="heldout")
    train_texts, train_paths = [read_source(f) for f in train_files], [f.name for f in train_files]
    fp = a.src / "fastpath.json" if (a.src / "fastpath.json").is_file() else DEFAULT_DIR / "fastpath.json"
    ranked = json.loads(fp.read_text())["frequent"]  # every id, most frequent first
    special = tok.get_added_tokens_decoder()
    ordinary = [t for t in ranked if t not in special]
    realign = RealignStream(ordinary, tok, a.seed + 4)
    subst = SubstituteStream(train_texts, ordinary, tok, a.seed + 5)
    train = MixedStream(train_texts, train_paths, tok, a.ctx, a.seed, a.edit_rate, a.max_region_chars, a.copy_rate,
                        realign, a.realign_rate, subst, a.subst_rate, a.site_weight, kind_weights)
    copy = MixedStream(train_texts, train_paths, tok, a.ctx, a.seed + 2, 1.0, 600, 1.0)
    held_texts = [read_source(f) for f in held_files]
    # evaluated apart: the answers of held-out edit tasks (does it copy and carry the change?) and
    # ordinary held-out samples (completion must not get worse)
    held = MixedStream(held_texts, [f.name for f in held_files], tok, a.ctx, a.seed + 1, 1.0, a.max_region_chars,
                       site_weight=a.site_weight)
    held_plain = MixedStream(held_texts, [f.name for f in held_files], tok, a.ctx, a.seed + 1, 0.0)
    tcfg = TrainConfig(steps=a.target_steps, batch_size=a.batch_size, lr=a.lr, warmup=a.warmup, ckpt_every=50,
                       log_every=10, eval_every=a.eval_every, eval_batches=a.eval_batches, device=a.device,
                       workers=a.workers)
    dcfg = replace(tcfg, steps=a.draft_steps, lr=a.lr * 5 / 3)
    log(f"fine-tune for next edits: ctx {a.ctx}, {len(train_files)} train / {len(held_files)} held-out files, "
        f"edit rate {a.edit_rate}, kinds {dict(zip(KINDS, kind_weights, strict=True))}, seed {a.seed} (the source's: "
        f"{seen}), target {asdict(tcfg)}, draft steps {a.draft_steps}")
    target = _load(a.src / "target", a.ctx)
    added = grow_layers(target, a.grow_layers)
    if added:
        log(f"grown to {a.grow_layers} layers: new (identity at first) at {added}")
    if a.induction_steps:
        ind = InductionStream(ranked[:2048], tok, a.seed + 3)
        ires = run_stage("induction-target", target, ind, InductionStream(ranked[:2048], tok, a.seed + 13),
                         replace(tcfg, steps=a.induction_steps, batch_size=a.induction_batch, lr=a.induction_lr,
                                 eval_every=a.induction_eval_every, eval_batches=2),
                         a.run_dir, log, stop_acc=a.induction_until or None)
        log(f"induction stage done: {json.dumps(ires)}")
    if a.realign_steps:
        rres = run_stage("realign-target", target, realign, held,
                         replace(tcfg, steps=a.realign_steps, batch_size=a.realign_batch, lr=a.realign_lr),
                         a.run_dir, log)
        log(f"realign stage done: {json.dumps(rres)}")
    if a.subst_steps:
        sres = run_stage("subst-target", target, subst, held,
                         replace(tcfg, steps=a.subst_steps, batch_size=a.subst_batch, lr=a.subst_lr),
                         a.run_dir, log)
        log(f"substitution stage done: {json.dumps(sres)}")
    if a.copy_steps:
        cres = run_stage("copy-target", target, copy, held, replace(tcfg, steps=a.copy_steps, batch_size=a.batch_size * 2),
                         a.run_dir, log)
        log(f"copy stage done: {json.dumps(cres)}")
    tres = run_stage("edits-target", target, train, held, tcfg, a.run_dir, log)
    tres["plain"] = evaluate_loss(target, held_plain, tcfg)
    log(f"target done: {json.dumps(tres)}")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    draft = _load(a.src / "draft", a.ctx)
    dres = run_stage("edits-draft", draft, train, held_plain, dcfg, a.run_dir, log, teacher=target)
    log(f"draft done: {json.dumps(dres)}")

    target.config.completer_next_edit = True  # the engine's "auto" next-edit format asks it (Engine.edits_trained)
    for name, model in (("target", target), ("draft", draft)):
        d = a.out / name
        tmp = a.out / f".{name}.new"
        if tmp.exists():
            shutil.rmtree(tmp)
        model.to(torch.bfloat16).save_pretrained(str(tmp), safe_serialization=True)
        save_hf_tokenizer(tok, tmp, a.ctx)
        if d.exists():
            shutil.rmtree(d)
        tmp.rename(d)
    summary_path = a.out / "build_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["edits_finetune"] = {"ctx": a.ctx, "edit_rate": a.edit_rate, "kind_weights": dict(zip(KINDS, kind_weights, strict=True)),
                                 "layers": target.config.num_hidden_layers, "target": tres, "draft": dres,
                                 "target_train": asdict(tcfg), "draft_train": asdict(dcfg),
                                 "seeds": [*seen, a.seed]}
    summary["ctx"] = a.ctx
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
