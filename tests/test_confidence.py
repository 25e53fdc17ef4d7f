"""The confidence gate (completer/confidence.py): the loop stops before the first token the target
is unsure of, a partial word is taken back, nothing shown is a typed drop, and an engine that
gives no scores is never gated."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.lsp import inline, open_doc, server_stats, start, tiny_options

from completer import confidence
from completer.client import Completion
from completer.engine.drafters import Drafter
from completer.engine.runner import RunnerBase
from completer.engine.sampling import Proposal, Sampling
from completer.engine.speculative import generate
from completer.pipeline import complete_at

ROOT = Path(__file__).resolve().parents[1]
V = 16


class Scripted(RunnerBase):
    """A target runner that, after `prompt`, emits `script[i]` with probability `probs[i]` (the
    rest of the mass spread over the other tokens), whatever was fed."""

    def __init__(self, prompt: list[int], script: list[int], probs: list[float]):
        self.n, self.script, self.probs, self.ids, self.max_len = len(prompt), script, probs, [], 64

    def sync(self, seq):
        self.ids = []
        return seq

    def truncate(self, n):
        del self.ids[n:]

    def forward(self, feed):
        start = len(self.ids)
        self.ids += feed
        rows = []
        for pos in range(start, len(self.ids)):  # the row at position pos predicts token pos + 1
            i = min(pos + 1 - self.n, len(self.script) - 1)
            p = torch.full((V,), (1 - self.probs[i]) / (V - 1), dtype=torch.float64)
            p[self.script[i]] = self.probs[i]
            rows.append(p.log())
        return torch.stack(rows)  # [len(feed), V]


class Oracle(Drafter):
    """Proposes the script itself: every draft is accepted, several tokens a verify."""

    def __init__(self, prompt, script):
        self.n, self.script = len(prompt), script

    def propose(self, seq, k):
        return Proposal(self.script[len(seq) - self.n:][:k], None, "oracle")


class K:
    k = 4

    def clock(self):
        return 0.0

    def update(self, *a):
        pass


PROMPT, SCRIPT = [1, 2, 3], [5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("drafted", [False, True])
def test_the_loop_stops_before_the_first_unsure_token(drafted):
    probs = [0.9, 0.8, 0.95, 0.3, 0.9, 0.9]
    draft = (Oracle(PROMPT, SCRIPT), K()) if drafted else (None, None)
    out, st = generate(Scripted(PROMPT, SCRIPT, probs), PROMPT, 6, Sampling(), *draft, floor=math.log(0.5))
    assert out == SCRIPT[:3] and st.stop_reason == "unsure" and st.unsure == SCRIPT[3]
    assert [round(math.exp(lp), 6) for lp in st.logprobs] == [0.9, 0.8, 0.95]
    assert confidence.score(st.logprobs) == 0.8


def test_without_a_floor_every_token_is_kept_with_its_score():
    probs = [0.9, 0.2, 0.9, 0.9, 0.9, 0.9]
    out, st = generate(Scripted(PROMPT, SCRIPT, probs), PROMPT, 6, Sampling())
    assert out == SCRIPT and st.stop_reason == "length" and st.unsure is None
    assert confidence.score(st.logprobs) == 0.2


def test_an_unsure_first_token_leaves_nothing():
    out, st = generate(Scripted(PROMPT, SCRIPT, [0.1] * 6), PROMPT, 6, Sampling(), floor=math.log(0.5))
    assert out == [] and st.stop_reason == "unsure" and st.unsure == SCRIPT[0] and st.logprobs == []


@pytest.mark.parametrize("sure, unsure, kept", [
    ("self.items.app", "end(item)", "self.items."),   # half a name is a wrong name
    ("self.items.append", "(item)", "self.items.append"),
    ("return x + ", "y", "return x + "),
    ("count", "er", ""),
    ("x = 1", "", "x = 1"),
])
def test_a_partial_word_is_taken_back(sure, unsure, kept):
    assert confidence.whole_words(sure, unsure) == kept


def test_the_option_or_the_models_calibration_or_off():
    assert confidence.resolve(None, None) == 0.0 and confidence.floor(0.0) == confidence.OFF
    assert confidence.resolve(None, 0.4) == 0.4 and confidence.resolve(0.0, 0.4) == 0.0
    assert confidence.floor(confidence.resolve(0.25, 0.4)) == math.log(0.25)


class NoScores:
    """An engine that returns text without token scores (llama-server or an OpenAI server that
    sends no logprobs): the gate never applies to it."""

    def __init__(self, text: str):
        self.text = text

    def complete(self, prefix, suffix="", **kw):
        return Completion(self.text, new_tokens=3, stop_reason="eos")

    def count_tokens(self, text):
        return len(text) // 3 + 1

    def prompt_budget(self, max_new=None):
        return 400


def test_an_engine_without_scores_is_not_gated():
    text = "def area(r):\n    return 3.14 * r * r\n\n\ndef volume(r, h):\n    return \n"
    got = complete_at(NoScores("area(r) * h"), text, text.index("return \n") + 7, language="python")
    assert got.text == "area(r) * h" and got.confidence is None and got.syntax.dropped is None


@pytest.mark.slow
def test_the_cli_reports_confidence_and_the_drop(tiny_pair, tmp_path):
    target, draft = tiny_pair
    src = tmp_path / "area.py"
    src.write_text("def area(r):\n    return 3.14 * r * r\n\n\ndef volume(r, h):\n    return \n")

    def run(mc: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "completer.cli", "complete", str(src),
                            "--line", "5", "--col", "11", "--json", "--target", str(target), "--draft", str(draft),
                            "--device", "cpu", "--min-confidence", mc],
                           capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    quiet, loud = run("1"), run("0")
    assert quiet["text"] == "" and quiet["stop_reason"] == "unsure" and quiet["confidence"] is None
    assert quiet["dropped"] == {"rule": "confidence", "text": quiet["unsure_text"]} and quiet["unsure_text"]
    assert loud["stop_reason"] != "unsure" and loud["new_tokens"] > 0 and 0 < loud["confidence"] <= 1


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_language_server_counts_a_quiet_miss(client, tiny_pair):
    """Through the real completer-lsp: the option from initializationOptions, nothing shown, and
    `completer/stats` counts the drop by its rule; a reconfigured 0 shows text again."""
    from lsprotocol import types as t

    await start(client, tiny_options(tiny_pair, min_confidence=1.0))
    open_doc(client, "def area(r):\n    return 3.14 * r * r\n\n\ndef volume(r, h):\n    return \n")
    got = await client.text_document_inline_completion_async(inline(5, 11))
    assert not got.items
    stats = await server_stats(client)
    assert stats.empty == 1 and stats.dropped_confidence == 1 and stats.wasted_tokens == 0
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"min_confidence": 0}}))
    got = await client.text_document_inline_completion_async(inline(5, 11))
    stats = await server_stats(client)
    assert stats.dropped_confidence == 1 and stats.empty + getattr(stats, "shown", 0) == 2
    assert (stats.confidence.p50 is not None) == bool(got.items)  # the score of what was shown
