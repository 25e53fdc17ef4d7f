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


def test_only_the_whitelisted_sources_are_read():
    import pytest

    from draft_models.data import SOURCES, is_training_path, source_root, training_corpus

    assert set(SOURCES) == {"stdlib", "torch", "transformers", "numpy", "sympy", "networkx"}
    for other in ("attrs", "httpx", "site-packages", "../stdlib"):
        with pytest.raises(ValueError, match="not a training source"):
            source_root(other)
        with pytest.raises(ValueError):
            training_corpus(("stdlib", other), max_files=1)
    assert not is_training_path("stdlib", "site-packages/attrs/__init__.py")
    assert not is_training_path("stdlib", "json/decoder.py") and is_training_path("stdlib", "csv.py")


def test_dedup_drops_copies_and_renamed_blocks():
    from draft_models.data import dedup

    body = "".join(f"    x{i} = a + {i}\n" for i in range(9))
    a = f"import os\n\n\ndef llama_norm(a):\n{body}    return a\n"
    b = a.replace("llama", "mistral")  # "Copied from ... with Llama->Mistral": the same shape
    c = "class C:\n    def keep(self):\n        return 1\n\n" + f"    def llama_norm(self, a):\n{body}        return a\n"
    out, stats = dedup([("a.py", a), ("a_copy.py", a), ("b.py", b), ("c.py", c)])
    assert [n for n, _ in out] == ["a.py", "b.py", "c.py"] and stats["files_dup"] == 1
    assert out[1][1] == "import os\n\n\n" and "mistral" not in out[1][1]  # its function was a copy
    assert "def keep" in out[2][1] and stats["blocks_dup"] >= 1


def test_repository_samples_put_the_chunks_before_the_prefix(tmp_path):
    from tokenizers import Tokenizer

    from completer.workspace.samples import samples
    from draft_models import DEFAULT_TARGET
    from draft_models.train import SampleStream

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "geometry.py").write_text('def area(width, height):\n    """Area of a rectangle."""\n    return width * height\n')
    body = "".join(f"    total = total + area({i}, {i + 1})\n" for i in range(12))
    (pkg / "report.py").write_text(f"from .geometry import area\n\n\ndef report():\n    total = 0\n{body}    return total\n")
    tok = Tokenizer.from_file(str(DEFAULT_TARGET / "tokenizer.json"))
    count = lambda s: len(tok.encode(s).ids)
    recs = list(samples(pkg, "pkg", count, 5, budget=200, seed=1))
    assert recs and all(r["path"] == "pkg/report.py" for r in recs)
    assert all(c[0] == "pkg/geometry.py" and "def area(width, height)" in c[1] for r in recs for c in r["chunks"])
    stream = SampleStream(["x = 1\n" * 50], tok, 256, 0, repo=recs, repo_rate=1.0)
    text = tok.decode(stream.sample(random.Random(0)), skip_special_tokens=False)
    head = text.split("<fim_middle>", 1)[1]
    assert text.startswith("<fim_suffix>") and head.startswith("# pkg/geometry.py\ndef area(width, height)")


def test_a_stage_trains_in_each_dtype_the_cpu_has(tmp_path):
    from dataclasses import replace

    from tokenizers import Tokenizer

    from draft_models import DEFAULT_TARGET
    from draft_models.build import PRESETS
    from draft_models.train import SampleStream, native_bf16, new_model, run_stage

    tok = Tokenizer.from_file(str(DEFAULT_TARGET / "tokenizer.json"))
    p = PRESETS["tiny"]
    stream = SampleStream(["def f(x):\n    return x + 1\n" * 40], tok, 64, 0)
    for bf16 in ([False, True] if native_bf16() else [False]):
        model = new_model(p.target, tok.get_vocab_size(), 64, tok, 0)
        cfg = replace(p.target_train, steps=2, bf16=bf16, ckpt_every=2, eval_every=2, log_every=1)
        lines = []
        res = run_stage(f"t{bf16}", model, stream, stream, cfg, tmp_path, lines.append)
        assert res["steps"] == 2 and res["loss"] == res["loss"]  # finite, not NaN
        assert any(("bf16" if bf16 else "fp32") in line for line in lines)
