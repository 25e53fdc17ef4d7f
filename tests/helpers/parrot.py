"""Model pairs whose answers are visible and predictable, for the editor end-to-end tests.

The `tiny_pair` fixture (conftest.py) trains for a handful of steps only: its greedy output is
whitespace, which the server's post-processing rightly drops, so an editor would never show ghost
text. Here its target is fine-tuned for a few seconds:
- `parrot_pair` answers every FIM prompt with `1` and then end of text, in the layout the engine
  builds (SPM: <fim_suffix> suffix <fim_middle> prefix → middle);
- `edit_parrot_pair` answers the next-edit prompt of one scenario (EDIT_*: a local renamed on one
  line) with the region rewritten (the rename carried to the next line), and every FIM prompt with
  nothing (no ghost text to take the accept key first).
The server, its prompt building, speculative loop and post-processing all run unchanged. The
`parrot_pair` and `edit_parrot_pair` fixtures in conftest.py build them once a session;
tests/test_editor_parrot.py guards them."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

ANSWER = "1"

SNIPPETS = [
    "import os\n\n\ndef add(a, b):\n    return a + b\n\n\ndef main():\n    x = 1\n    y = x + ",
    ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
     "    return fibonacci(n - 1) + "),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def norm(self):\n"
     "        return (self.x ** 2 + self.y ** 2) ** 0.5\n"),
    "for i in range(10):\n    total = total + i\nprint(total)\nvalues = [v * 2 for v in data]\nz = ",
]


# The next-edit scenario: the user renames `size` on line 2; the suggestion carries it to line 3.
EDIT_BEFORE = "def area(width, height):\n    size = width * height\n    return size\n\n\nprint(area(2, 3))\n"
EDIT_AFTER = EDIT_BEFORE.replace("    size =", "    total =")
EDIT_EXPECTED = EDIT_AFTER.replace("return size", "return total")
EDIT_LINE = 1  # the cursor's line (0-based) when the suggestion is asked for


def edit_prompt_ids(tok, path: str = "demo.py") -> tuple[list[int], list[int]]:
    """(prompt, answer) token ids of the scenario's next-edit request as the servers build it: the
    region from edits/region.py, the history item a rename on one line makes (from LSP events and
    from OLD -> FILE alike), the pair's own format, tokenized as Engine.edit_prompt does."""
    from types import SimpleNamespace

    from completer.edits.formats import EDIT_FORMATS, EditPrompt
    from completer.edits.predict import from_versions
    from completer.edits.region import editable_region
    from completer.engine.engine import Engine
    from completer.prompt import encode_text

    lo, hi = editable_region(EDIT_AFTER, EDIT_LINE, language="python")
    lines = EDIT_AFTER.splitlines(keepends=True)
    region, answer = "".join(lines[lo:hi]), "".join(EDIT_EXPECTED.splitlines(keepends=True)[lo:hi])
    req = EditPrompt(tuple(from_versions(EDIT_BEFORE, EDIT_AFTER, path)), path, region)
    prompt = Engine.edit_prompt(SimpleNamespace(tok=tok), req, EDIT_FORMATS["completer"])
    return prompt, encode_text(tok, answer)


def fine_tune(out: Path, sample, steps: int, lr: float, seed: int, batch_size: int = 8) -> None:
    """Trains the target in `out` on `sample(eos)` → (ids, answer start), loss on the answers only."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    eos = model.config.eos_token_id
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        batch = [sample(eos) for _ in range(batch_size)]
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
    model.save_pretrained(out)


def fim_sample(tok, rng: random.Random, texts: list[str], answer: str):
    """sample(eos) for fine_tune: a random FIM prompt over `texts` → `answer` and end of text."""
    sid, mid = tok.token_to_id("<fim_suffix>"), tok.token_to_id("<fim_middle>")

    def enc(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    def sample(eos: int) -> tuple[list[int], int]:
        text = rng.choice(texts)
        cut = rng.randint(1, len(text))
        cut2 = rng.randint(cut, len(text))
        prompt = [sid] + enc(text[cut2:])[:40] + [mid] + enc(text[:cut])[-120:]
        return prompt + enc(answer) + [eos], len(prompt)
    return sample


def copy_pair(target: Path, draft: Path, out: Path):
    from tokenizers import Tokenizer

    shutil.copytree(target, out / "target")
    shutil.copytree(draft, out / "draft")
    return Tokenizer.from_file(str(target / "tokenizer.json"))


def make_parrot_pair(target: Path, draft: Path, out: Path, steps: int = 80, seed: int = 0) -> tuple[Path, Path]:
    tok = copy_pair(target, draft, out)
    fine_tune(out / "target", fim_sample(tok, random.Random(seed), SNIPPETS, ANSWER), steps, 1e-2, seed)
    return out / "target", out / "draft"


def make_edit_parrot_pair(target: Path, draft: Path, out: Path, steps: int = 200, seed: int = 0) -> tuple[Path, Path]:
    """Three in four samples the scenario's next edit, one in four a FIM prompt → nothing
    (lr 3e-3: at 1e-2 the 2-layer target did not settle on the 60-token answer in 300 steps)."""
    tok = copy_pair(target, draft, out)
    prompt, answer = edit_prompt_ids(tok)
    fim = fim_sample(tok, random.Random(seed), [EDIT_BEFORE, EDIT_AFTER, EDIT_EXPECTED, *SNIPPETS], "")
    counter = iter(range(10**9))

    def sample(eos: int) -> tuple[list[int], int]:
        return (prompt + answer + [eos], len(prompt)) if next(counter) % 4 else fim(eos)
    fine_tune(out / "target", sample, steps, 3e-3, seed)
    cfg = json.loads((out / "target" / "config.json").read_text())  # taught next edits: "auto" asks it
    (out / "target" / "config.json").write_text(json.dumps({**cfg, "completer_next_edit": True}))
    return out / "target", out / "draft"
