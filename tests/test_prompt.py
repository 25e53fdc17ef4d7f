"""completer/prompt.py, the prompt builder: the chunks' rule, one grid for every window cut (the
engine's raw cut and the syntax layer's), and a window that stays put while the user types."""
from __future__ import annotations

import itertools

import pytest

from completer.client import Chunk
from completer.fim import FimFormat
from completer.prompt import (
    CUT_GRID,
    GRID_LINES,
    chunks_budget,
    cut_inside,
    encode_text,
    fim_ids,
    fit_chunks,
    text_budget,
    window_budget,
)


@pytest.fixture(scope="module")
def ours():
    from completer.engine.models import load_tokenizer
    from draft_models import DEFAULT_TARGET

    tok = load_tokenizer(str(DEFAULT_TARGET))
    return tok, FimFormat.detect(tok)


@pytest.mark.parametrize("costs,budget,n", [
    ([], 100, 0), ([50], 100, 1), ([51], 100, 0), ([10, 30, 5], 100, 3), ([10, 45, 5], 100, 1), ([0, 0], 0, 2)])
def test_chunks_go_in_whole_in_order_within_half(costs, budget, n):
    assert fit_chunks(costs, budget) == n
    assert sum(costs[:n]) <= chunks_budget(budget)


def test_the_pipeline_plans_with_the_engines_numbers():
    """The window the syntax layer is given plus the most the chunks may take is the engine's text
    budget: a context that fits is taken whole by the engine."""
    for total in (64, 300, 2045):
        for spent in (0, 10, total, 10 * total):
            assert window_budget(total, spent) + min(spent, chunks_budget(text_budget(total))) == text_budget(total)
    assert text_budget(100, "none") == 100 and text_budget(100, "spm") == 97


def test_a_raw_cut_inside_one_line_is_on_the_char_grid_and_stays_while_typing(ours):
    """A raw prefix that is one line longer than the budget: the window opens where cut_inside
    says (the syntax layer's cut), on whitespace within a CUT_GRID step, and typing more of the
    line keeps every id before the cursor's (the per-document KV cache matches)."""
    tok, fmt = ours
    line = "x = [" + ", ".join(str(i) for i in range(3000))
    enc = lambda s: encode_text(tok, s)
    start = cut_inside(line, 0, len(line), lambda s: len(enc(s)), 200, tail=True)
    assert start % CUT_GRID == 0 or line[start - 1] == " "
    ids = fim_ids(tok, fmt, line, "", 200 + 3)
    assert ids[ids.index(fmt.middle) + 1:] == enc(line[start:])
    typed = [fim_ids(tok, fmt, line + ", 30" + "0" * i, "", 203) for i in range(4)]
    for a, b in itertools.pairwise(typed):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert same >= len(a) - 2  # only the last tokens (the number being typed) change


def test_a_raw_prefix_window_opens_on_a_grid_line(ours):
    tok, fmt = ours
    prefix = "".join(f"value_{i} = compute({i}, {i + 1})\n" for i in range(200))
    ids = fim_ids(tok, fmt, prefix, "", 300)
    text = tok.decode(ids[ids.index(fmt.middle) + 1:])
    first = int(text.split(" ", 1)[0].removeprefix("value_"))
    assert first % GRID_LINES == 0 and prefix.endswith(text)


def test_chunks_that_do_not_fit_are_left_out_whole(ours):
    tok, fmt = ours
    small, big = Chunk("a.py", "def f():\n    return 1\n"), Chunk("b.py", "y = 2\n" * 300)
    ids = fim_ids(tok, fmt, "f(", "", 200, (small, big, small))
    text = tok.decode(ids)
    assert "# a.py" in text and "b.py" not in text and text.count("# a.py") == 1  # in order: none after the one left out
