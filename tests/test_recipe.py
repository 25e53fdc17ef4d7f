"""The recipe (`python -m draft_models.build --preset tiny`) runs end to end in seconds, produces
loadable models, resumes from its checkpoints, and its data pipeline keeps the held-out split out."""
from __future__ import annotations

import json
import random

import torch

from draft_models.data import HELD_OUT, corpus_files, random_fim_split


def test_tiny_recipe_produces_loadable_pair(tiny_pair):
    from transformers import AutoModelForCausalLM

    target, draft = tiny_pair
    for d in (target, draft):
        assert (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file()
        m = AutoModelForCausalLM.from_pretrained(d)
        out = m.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
        assert out.shape == (1, 6)
    summary = json.loads((target.parent / "build_summary.json").read_text())
    assert summary["target"]["steps"] > 0 and "agree" in summary["draft"]
    assert (target.parent / "fastpath.json").is_file()


def test_rerun_resumes_instead_of_retraining(tiny_pair, tmp_path):
    from draft_models.build import build

    run = target_run = tiny_pair[0].parent.parent / "run"
    log_before = (run / "log.txt").read_text()
    build("tiny", tmp_path / "out", target_run, seed=0)
    new = (run / "log.txt").read_text()[len(log_before):]
    assert "[target] resumed at step 6" in new and "[draft] resumed at step 4" in new


def test_heldout_split_is_disjoint():
    train = {p.as_posix() for p in corpus_files(split="train")}
    held = {p.as_posix() for p in corpus_files(split="heldout")}
    assert train and held and not train & held
    assert all(any(f"/{h}/" in p or p.endswith(f"/{h}.py") for h in HELD_OUT) for p in held)


def test_fim_split_reassembles_the_text():
    rng = random.Random(0)
    text = "def f(x):\n    return x + 1\n\nclass A:\n    pass\n"
    for _ in range(200):
        s = random_fim_split(text, rng)
        assert s.prefix + s.middle + s.suffix == text
