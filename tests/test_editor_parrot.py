"""The parrot pairs (tests/helpers/parrot.py) answer as the editor end-to-end tests expect: if
these fail, those fail for a model reason, not an editor one."""
from __future__ import annotations

import pytest
from helpers.parrot import ANSWER, edit_prompt_ids

pytestmark = pytest.mark.slow


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


def test_edit_parrot_rewrites_the_scenario_and_completes_nothing(edit_parrot_pair):
    """Guards the fixture: the next-edit prompt → the region with the rename carried on; a FIM
    prompt → end of text at once."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    target, _ = edit_parrot_pair
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    prompt, answer = edit_prompt_ids(tok)

    def greedy(ids: list[int], n: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                                 pad_token_id=eos)
        return out[0, len(ids):].tolist()
    assert greedy(prompt, len(answer) + 4) == answer + [eos]
    assert "return total" in tok.decode(answer) and "return size" in tok.decode(prompt)
    sid, mid = tok.token_to_id("<fim_suffix>"), tok.token_to_id("<fim_middle>")
    for prefix, suffix in [("    total = width * height\n    return ", "\n"), ("print(area(", ")\n")]:
        ids = [sid] + tok.encode(suffix, add_special_tokens=False).ids + [mid] + \
            tok.encode(prefix, add_special_tokens=False).ids
        assert greedy(ids, 4) == [eos], prefix
