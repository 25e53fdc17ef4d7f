"""Rebuild the embedded model pair: `python -m draft_models.build [--preset tiny|default]`.

Stages: tokenizer → target (FIM, cross-entropy) → draft (KL to the target) → export as HF model
directories (safetensors, bf16) with the tokenizer in each → fast-path table (fastpath.json). Seeded; logs to RUN_DIR/log.txt;
each stage resumes from its checkpoint, so rerunning the same command continues a stopped run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from . import DEFAULT_DIR
from .data import SOURCES, corpus_files, read_source, training_corpus
from .tokenizer import save_hf_tokenizer, train_tokenizer
from .train import ModelShape, SampleStream, TrainConfig, new_model, run_stage


@dataclass(frozen=True)
class Preset:
    vocab_size: int
    ctx: int                 # training sequence length = the models' context window
    target: ModelShape
    draft: ModelShape
    target_train: TrainConfig
    draft_train: TrainConfig
    max_files: int | None    # None = the whole training split (per source)
    sources: tuple[str, ...] = ("stdlib",)  # data.SOURCES to train on, deduplicated together
    repo_rate: float = 0.0   # share of rows that are repository-level samples (with --repo-samples)


PRESETS = {
    # Seconds on 2 cores: for tests of the recipe itself.
    "tiny": Preset(
        vocab_size=400, ctx=256,
        target=ModelShape(hidden=64, layers=2, heads=2, intermediate=128),
        draft=ModelShape(hidden=32, layers=1, heads=2, intermediate=64),
        target_train=TrainConfig(steps=6, batch_size=2, lr=3e-3, warmup=2, ckpt_every=3,
                                 log_every=3, eval_every=6, eval_batches=1),
        draft_train=TrainConfig(steps=4, batch_size=2, lr=3e-3, warmup=2, ckpt_every=2,
                                log_every=2, eval_every=4, eval_batches=1),
        max_files=12),
    # The shipped pair: 10.3M target, 2.5M draft (most of it the tied embedding), a 1 024-token
    # window. The second build (2026-12-04) warm-started from the first's weights and trained on
    # every source in data.SOURCES, a quarter of its rows repository-level samples. Rows of
    # 2 × 1 024 tokens: on 2 AMD EPYC (AVX512-BF16) cores in bf16 they ran at ≈2 600
    # tokens/s against ≈2 100 for 4 × 1 024 and ≈2 400 for 8 × 512 (a few steps each).
    "default": Preset(
        vocab_size=8192, ctx=1024,
        target=ModelShape(hidden=288, layers=8, heads=4, intermediate=768),
        draft=ModelShape(hidden=192, layers=2, heads=3, intermediate=512),
        target_train=TrainConfig(steps=3500, batch_size=2, lr=1e-3, warmup=100, eval_every=1000,
                                 eval_batches=16),
        draft_train=TrainConfig(steps=1200, batch_size=2, lr=2e-3, warmup=60, eval_every=500,
                                eval_batches=16),
        max_files=None, sources=tuple(SOURCES), repo_rate=0.25),
}
# The size study of issue 36 ("the same token budget at the current shape and at a ~25–40 M
# target"): the default recipe with a 29.5 M target (d 512, 8 layers, 8 heads, MLP 1 376); the
# draft's shape unchanged. Run both from scratch with the same --target-steps and compare.
PRESETS["wide"] = replace(PRESETS["default"], target=ModelShape(hidden=512, layers=8, heads=8, intermediate=1376))


def build(preset_name: str, out_dir: Path, run_dir: Path, seed: int = 0,
          target_steps: int | None = None, draft_steps: int | None = None,
          warm_start: Path | None = None, repo_samples: list[Path] = (), eval_every: int | None = None) -> dict:
    p = PRESETS[preset_name]
    tt = replace(p.target_train, steps=target_steps) if target_steps else p.target_train
    dt = replace(p.draft_train, steps=draft_steps) if draft_steps else p.draft_train
    if eval_every:
        tt, dt = replace(tt, eval_every=eval_every), replace(dt, eval_every=eval_every)
    run_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, file=sys.stderr, flush=True)
        with open(run_dir / "log.txt", "a") as logf:  # a line at a time: the log survives a killed build
            logf.write(line + "\n")

    torch.manual_seed(seed)
    docs, corpus = training_corpus(p.sources, p.max_files)
    train_files = corpus_files(split="train")[: p.max_files]  # the stdlib's: tokenizer and fast path
    held_files = corpus_files(split="heldout")[: p.max_files]
    log(f"preset {preset_name}: {corpus['files_out']} train files ({corpus['bytes_out'] / 1e6:.1f} MB after "
        f"deduplication of {corpus['bytes_in'] / 1e6:.1f} MB: {json.dumps(corpus['sources'])}), "
        f"{len(held_files)} held-out files")

    from tokenizers import Tokenizer
    tok_path = run_dir / "tokenizer.json"
    if warm_start is not None and not tok_path.exists():  # the same vocabulary as the weights it starts from
        shutil.copy(warm_start / "target" / "tokenizer.json", tok_path)
    if tok_path.exists():
        tok = Tokenizer.from_file(str(tok_path))
    else:
        t0 = time.time()
        tok = train_tokenizer(p.vocab_size, train_files)
        tok.save(str(tok_path))
        log(f"tokenizer: vocab {tok.get_vocab_size()} in {time.time() - t0:.1f}s")
    vocab = tok.get_vocab_size()
    repo = [json.loads(line) for f in repo_samples for line in Path(f).read_text().splitlines()]
    if repo:
        log(f"repository-level samples: {len(repo)} from {len(repo_samples)} files, rate {p.repo_rate}")
    train = SampleStream([t for _, t in docs], tok, p.ctx, seed, repo=repo, repo_rate=p.repo_rate)
    held = SampleStream([read_source(f) for f in held_files], tok, p.ctx, seed + 1)

    target = new_model(p.target, vocab, p.ctx, tok, seed)
    if warm_start is not None:
        _load_weights(target, warm_start / "target", log)
    log(f"target: {sum(x.numel() for x in target.parameters()) / 1e6:.2f}M params {asdict(p.target)}")
    tres = run_stage("target", target, train, held, tt, run_dir, log)
    log(f"target done: {json.dumps(tres)}")

    target.eval()
    draft = new_model(p.draft, vocab, p.ctx, tok, seed + 7)
    if warm_start is not None:
        _load_weights(draft, warm_start / "draft", log)
    log(f"draft: {sum(x.numel() for x in draft.parameters()) / 1e6:.2f}M params {asdict(p.draft)}")
    dres = run_stage("draft", draft, train, held, dt, run_dir, log, teacher=target)
    log(f"draft done: {json.dumps(dres)}")

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, model in (("target", target), ("draft", draft)):
        d = out_dir / name
        if d.exists():
            shutil.rmtree(d)
        model.to(torch.bfloat16).save_pretrained(str(d), safe_serialization=True)
        save_hf_tokenizer(tok, d, p.ctx)
    from .fastpath import mine_tables
    tables = mine_tables(tok, train_files)
    (out_dir / "fastpath.json").write_text(json.dumps(tables, separators=(",", ":")) + "\n")
    log(f"fast path: {len(tables['rows'])} contexts")
    summary = {"preset": preset_name, "seed": seed, "target": tres, "draft": dres,
               "target_shape": asdict(p.target), "draft_shape": asdict(p.draft),
               "target_train": asdict(tt), "draft_train": asdict(dt), "vocab_size": vocab,
               "ctx": p.ctx, "corpus": corpus, "heldout_files": len(held_files),
               "warm_start": str(warm_start) if warm_start else None, "repo_samples": len(repo),
               "repo_rate": p.repo_rate}
    (out_dir / "build_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {out_dir}")
    return summary


def _load_weights(model, src: Path, log) -> None:
    """Start from the weights of an HF directory of the same shape (its window may differ: RoPE
    has no weights)."""
    from safetensors.torch import load_file

    state = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise ValueError(f"{src}: weights do not fit the preset's shape ({missing=}, {unexpected=})")
    model.tie_weights()
    log(f"warm start from {src}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draft_models.build", description=__doc__)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="default")
    ap.add_argument("--out", type=Path, help="output folder (default: the embedded pair for "
                    "'default', runs/<preset>/out otherwise)")
    ap.add_argument("--run-dir", type=Path, help="checkpoints and log (default: runs/<preset>)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-steps", type=int, help="override the preset's target steps")
    ap.add_argument("--draft-steps", type=int, help="override the preset's draft steps")
    ap.add_argument("--eval-every", type=int, help="override the preset's held-out evaluation interval (steps)")
    ap.add_argument("--warm-start", type=Path, help="a pair's folder (target/, draft/) to start from, its "
                    "tokenizer kept (e.g. draft_models/default: the shipped pair)")
    ap.add_argument("--repo-samples", type=Path, nargs="*", default=[],
                    help="JSONL files of python -m completer.workspace.samples")
    a = ap.parse_args(argv)
    run_dir = a.run_dir or Path("runs") / a.preset
    out = a.out or (DEFAULT_DIR if a.preset == "default" else run_dir / "out")
    build(a.preset, out, run_dir, a.seed, a.target_steps, a.draft_steps, a.warm_start, a.repo_samples,
          a.eval_every)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
