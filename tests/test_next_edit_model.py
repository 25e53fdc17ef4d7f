"""`next_edit_model` (issue 36): next edits from a model of their own beside the completion pair —
the pair's completions stay exactly as they were, the rewrites are exactly the next-edit model's
(the same ids as that model asked alone: greedy, drafted from the region), its gate and counters
show in the engine's stats, and a next edit's caches go with `forget`. Through the CLI: the
embedded-format pair that was never taught next edits answers one once given the model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.parrot import EDIT_AFTER, EDIT_BEFORE, EDIT_EXPECTED, EDIT_LINE

from completer.config import EngineConfig
from completer.edits.diff import TextEdit, apply_edits
from completer.edits.formats import EditPrompt
from completer.edits.predict import from_versions
from completer.engine.engine import Engine

pytestmark = pytest.mark.slow  # the tiny pair and the edit parrot are trained for the session
ROOT = Path(__file__).resolve().parents[1]
REQ = EditPrompt(tuple(from_versions(EDIT_BEFORE, EDIT_AFTER, "demo.py")), "demo.py", EDIT_AFTER)
COMMON = {"device": "cpu", "type_through": False, "prefetch": False, "warmup_chunk": 16}


def test_the_next_edit_model_writes_the_rewrites_and_the_pair_the_completions(tiny_pair, edit_parrot_pair):
    target, draft = tiny_pair
    both = Engine(EngineConfig(target=str(target), draft=str(draft), next_edit_model=str(edit_parrot_pair[0]),
                               **COMMON))
    pair = Engine(EngineConfig(target=str(target), draft=str(draft), **COMMON))
    editor = Engine(EngineConfig(target=str(edit_parrot_pair[0]), drafter="none", **COMMON))
    try:
        assert pair.edits_untrained() and not both.edits_untrained() and not editor.edits_untrained()
        got, alone = both.rewrite(REQ, doc_key="e"), editor.rewrite(REQ, doc_key="e")
        assert got.token_ids == alone.token_ids and got.text == alone.text and got.new_tokens > 0
        assert pair.rewrite(REQ, doc_key="e").stop_reason == "untrained"
        prefix = "def mean(values):\n    total = 0\n    for v in values:\n        "
        mine, theirs = both.complete(prefix, "\n", doc_key="c.py", max_new=8), pair.complete(prefix, "\n", doc_key="c.py", max_new=8)
        assert mine.token_ids == theirs.token_ids and mine.text == theirs.text
        st = both.stats()
        assert st["next_edit_model"] == str(edit_parrot_pair[0]) and st["target"] == pair.stats()["target"]
        assert st["rewrites"] == 1 and st["requests"] == 2 and st["next_edit_weight_bytes"] > 0
        assert st["next_edit_kv_bytes"] > 0 and st["kv_cached_documents"] == 1  # the rewrite's cache is the editor's
        assert both.forget("e") and both.stats()["next_edit_kv_bytes"] == 0
        both.complete(prefix, "\n", doc_key="d.py", max_new=2)  # one key for both (completer serve's): one forget
        both.rewrite(REQ, doc_key="d.py")
        assert both.stats()["kv_cached_documents"] == 2 and both.stats()["next_edit_kv_bytes"] > 0
        assert both.forget("d.py") and both.stats()["next_edit_kv_bytes"] == 0
        assert both.stats()["kv_cached_documents"] == 1  # c.py's
        both.reconfigure(next_edit_min_confidence=1.0)  # the live options reach the next-edit model too
        assert both.stats()["next_edit_min_confidence_in_force"] == 1.0
        assert both.rewrite(REQ, doc_key="e").stop_reason == "unsure" and both.stats()["rewrites_unsure"] == 1
    finally:
        for e in (both, pair, editor):
            e.close()


def test_the_cli_asks_the_next_edit_model(tiny_pair, edit_parrot_pair, tmp_path):
    (tmp_path / "old.py").write_text(EDIT_BEFORE)
    (tmp_path / "demo.py").write_text(EDIT_AFTER)

    def run(*more: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "completer.cli", "next-edit", str(tmp_path / "demo.py"),
                            "--before", str(tmp_path / "old.py"), "--line", str(EDIT_LINE), "--col", "4", "--json",
                            "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", "cpu",
                            "--no-next-edit-rename", "--next-edit-min-confidence", "0", *more],
                           capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    assert run()["reason"] == "untrained"
    got = run("--next-edit-model", str(edit_parrot_pair[0]))
    assert got["source"] == "model" and got["edits"] and "reason" not in got
    assert apply_edits(EDIT_AFTER, [TextEdit(**e) for e in got["edits"]]) == EDIT_EXPECTED
