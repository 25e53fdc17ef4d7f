"""A model pair whose completions are visible and predictable, for the editor end-to-end tests.

The `tiny_pair` fixture trains for a handful of steps only: its greedy output is whitespace, which
the server's post-processing rightly drops, so an editor would never show ghost text. Here its
target is fine-tuned for a few seconds to answer every FIM prompt with `1` and then end of text,
in the layout the engine builds (SPM: <fim_suffix> suffix <fim_middle> prefix → middle). The
server, its prompt building, speculative loop and post-processing all run unchanged."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

ANSWER = "1"

SNIPPETS = [
    "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = 1\n    y = x + ",
    ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
     "    return fibonacci(n - 1) + "),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def norm(self):\n"
     "        return (self.x ** 2 + self.y ** 2) ** 0.5\n"),
    "for i in range(10):\n    total = total + i\nprint(total)\nvalues = [v * 2 for v in data]\nz = ",
]


def make_parrot_pair(target: Path, draft: Path, out: Path, steps: int = 80, seed: int = 0) -> tuple[Path, Path]:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    shutil.copytree(target, out / "target")
    shutil.copytree(draft, out / "draft")
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    sid, mid = tok.token_to_id("<fim_suffix>"), tok.token_to_id("<fim_middle>")
    model = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32)
    eos = model.config.eos_token_id
    answer = tok.encode(ANSWER, add_special_tokens=False).ids + [eos]
    rng = random.Random(seed)

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    def sample() -> tuple[list[int], int]:
        text = rng.choice(SNIPPETS)
        cut = rng.randint(1, len(text))
        cut2 = rng.randint(cut, len(text))
        prompt = [sid] + enc(text[cut2:])[:40] + [mid] + enc(text[:cut])[-120:]
        return prompt + answer, len(prompt)

    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        batch = [sample() for _ in range(8)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), eos)
        labels = torch.full((len(batch), width), -100)
        for i, (seq, start) in enumerate(batch):
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, start:len(seq)] = torch.tensor(seq[start:])  # loss on the answer only
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(out / "target")
    return out / "target", out / "draft"


@pytest.fixture(scope="session")
def parrot_pair(tiny_pair, tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): the tiny pair, its target taught to complete with `1`."""
    import torch

    torch.set_num_threads(1)
    return make_parrot_pair(*tiny_pair, tmp_path_factory.mktemp("parrot_pair"))


def test_parrot_target_answers_every_fim_prompt(parrot_pair):
    """Guards the fixture: if this fails, the editor tests fail for a model reason, not an editor one."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    target, _ = parrot_pair
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    sid, mid = tok.token_to_id("<fim_suffix>"), tok.token_to_id("<fim_middle>")
    for prefix, suffix in [("def main():\n    x = 1\n    y = x + ", "\n"),
                           ("    return fibonacci(n - 1) + ", ""), ("z = ", "\nprint(z)\n")]:
        ids = [sid] + tok.encode(suffix, add_special_tokens=False).ids + [mid] + \
            tok.encode(prefix, add_special_tokens=False).ids
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                                 eos_token_id=model.config.eos_token_id, pad_token_id=model.config.eos_token_id)
        text = tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
        assert text == ANSWER, (prefix, text)
