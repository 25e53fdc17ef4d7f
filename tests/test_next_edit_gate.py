"""The next-edit confidence gate (issue 36, part 2 for next edits): a model's rewrite with one token
below `next_edit_min_confidence` is no answer — the engine stops decoding there (stop_reason
"unsure", its confidence the refused token's probability) and `predict` drops it as "unsure"
(a rename in the last edit stands in: tests/test_next_edit.py's drop rules). The threshold is the
option, else the model's calibration (`completer_next_edit_min_confidence` in its config.json,
bench/next_edit.py --calibrate), else off; the same through the CLI and the language server.
The remote clients' gate is tests/test_remote_gate.py's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.engines import engine, random_pair
from helpers.lsp import server_stats, start, tiny_options
from helpers.parrot import EDIT_AFTER, EDIT_BEFORE, EDIT_EXPECTED, EDIT_LINE
from lsprotocol import types as t

from completer.edits.formats import EditPrompt
from completer.edits.predict import from_versions

ROOT = Path(__file__).resolve().parents[1]
REQ = EditPrompt(tuple(from_versions(EDIT_BEFORE, EDIT_AFTER, "demo.py")), "demo.py", EDIT_AFTER)


def test_the_engine_drops_a_rewrite_it_was_unsure_of(tok):
    e = engine(random_pair(tok))
    try:
        plain = e.rewrite(REQ, fmt="completer", doc_key="a", max_new=12)
        assert plain.stop_reason != "unsure" and plain.new_tokens > 0 and 0 < plain.confidence <= 1
        assert e.stats()["next_edit_min_confidence_in_force"] == 0.0  # no option, no calibration: off
        e.reconfigure(next_edit_min_confidence=1.0)  # no token is that sure
        none = e.rewrite(REQ, fmt="completer", doc_key="a", max_new=12)
        assert (none.text, none.stop_reason, none.malformed) == ("", "unsure", False)
        assert none.unsure_text and 0 < none.confidence < 1 and none.new_tokens == 0
        assert plain.token_ids and e.decode(plain.token_ids[:1]) == none.unsure_text  # the first token refused
        st = e.stats()
        assert st["rewrites_unsure"] == 1 and st["rewrites"] == 2 and st["next_edit_min_confidence_in_force"] == 1.0
        # under the answer's own score (its least sure token's probability, rounded to 4 places):
        # the same answer; over it: refused at a token no surer than the threshold
        e.reconfigure(next_edit_min_confidence=plain.confidence / 2)
        same = e.rewrite(REQ, fmt="completer", doc_key="a", max_new=12)
        assert same.token_ids == plain.token_ids and same.stop_reason == plain.stop_reason
        e.reconfigure(next_edit_min_confidence=min(1.0, plain.confidence * 2))
        cut = e.rewrite(REQ, fmt="completer", doc_key="a", max_new=12)
        assert cut.stop_reason == "unsure" and cut.text == ""
        assert plain.confidence <= cut.confidence < plain.confidence * 2
    finally:
        e.close()


def test_the_models_calibration_is_the_default_and_the_option_overrides_it(tok):
    pair = random_pair(tok)
    pair.target.config.completer_next_edit_min_confidence = 1.0
    e = engine(pair)
    try:
        assert e.stats()["next_edit_min_confidence_in_force"] == 1.0
        assert e.rewrite(REQ, fmt="completer", doc_key="c", max_new=6).stop_reason == "unsure"
        e.reconfigure(next_edit_min_confidence=0.0)  # 0: off, whatever the calibration says
        assert e.stats()["next_edit_min_confidence_in_force"] == 0.0
        assert e.rewrite(REQ, fmt="completer", doc_key="c", max_new=6).stop_reason != "unsure"
        assert e.stats()["min_confidence_in_force"] == 0.0  # the completion gate is another option
    finally:
        e.close()


@pytest.mark.slow
def test_the_cli_reports_the_drop_and_the_score(edit_parrot_pair, tmp_path):
    target, draft = edit_parrot_pair
    (tmp_path / "old.py").write_text(EDIT_BEFORE)
    (tmp_path / "demo.py").write_text(EDIT_AFTER)

    def run(*more: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "completer.cli", "next-edit", str(tmp_path / "demo.py"),
                            "--before", str(tmp_path / "old.py"), "--line", str(EDIT_LINE), "--col", "4", "--json",
                            "--target", str(target), "--draft", str(draft), "--device", "cpu",
                            "--no-next-edit-rename-first", *more],
                           capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    shown = run("--no-next-edit-rename", "--next-edit-min-confidence", "0")
    assert shown["source"] == "model" and shown["edits"] and "reason" not in shown
    assert 0 < shown["confidence"] <= 1
    quiet = run("--no-next-edit-rename", "--next-edit-min-confidence", "1")
    assert quiet["edits"] == [] and quiet["reason"] == "unsure" and 0 < quiet["confidence"] < 1
    # the rename rule stands in for the refused answer
    carried = run("--next-edit-min-confidence", "1")
    assert carried["source"] == "rename" and carried["model_reason"] == "unsure" and carried["edits"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_language_server_drops_and_counts_an_unsure_next_edit(client, edit_parrot_pair):
    """Through the real completer-lsp: the option from initializationOptions, completer/nextEdit
    answers no edits with the reason, completer/stats counts it; reconfigured to 0 the parrot's
    answer is shown."""
    uri = "file:///tmp/demo.py"
    await start(client, tiny_options(edit_parrot_pair, next_edit_min_confidence=1.0, next_edit_rename=False,
                                     warmup=False))
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id="python", version=1, text=EDIT_BEFORE)))
    size = EDIT_BEFORE.splitlines()[EDIT_LINE].index("size")
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[t.TextDocumentContentChangePartial(
            range=t.Range(start=t.Position(line=EDIT_LINE, character=size),
                          end=t.Position(line=EDIT_LINE, character=size + 4)), text="total")]))

    def ask():
        return client.protocol.send_request_async("completer/nextEdit", {
            "textDocument": {"uri": uri}, "position": {"line": EDIT_LINE, "character": size + 5}})

    got = await ask()
    assert got.edits == [] and got.reason == "unsure"
    stats = await server_stats(client)
    assert stats.next_edit_dropped_unsure == 1
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(
        settings={"completer": {"next_edit_min_confidence": 0}}))
    got = await ask()
    assert got.edits and not hasattr(got, "reason")
    lines = EDIT_AFTER.splitlines(keepends=True)
    edits = [((e.range.start.line, e.range.start.character), (e.range.end.line, e.range.end.character), e.newText)
             for e in got.edits]
    text = "".join(lines)
    for (sl, sc), (el, ec), new in sorted(edits, reverse=True):
        a = sum(map(len, lines[:sl])) + sc
        b = sum(map(len, lines[:el])) + ec
        text = text[:a] + new + text[b:]
    assert text == EDIT_EXPECTED
    assert (await server_stats(client)).next_edit_dropped_unsure == 1
