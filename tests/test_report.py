"""bench/report.py: docs/benchmarks.md's current section is what the committed records give, every
benchmark figure in the docs names an existing record and that record's command (and the check
fails when one does not), a benchmark without a record says which command makes it, and every
section renders and draws from a record shaped as its script writes it."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def report():
    """bench/report.py, loaded as its own module (bench/ is no package; its dataclasses need the entry)."""
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    mod = sys.modules["bench_report"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_page_is_in_step_with_the_committed_records(tmp_path):
    """The generator on a copy of bench/out's records writes docs/benchmarks.md byte for byte."""
    r = report()
    for p in (ROOT / "bench" / "out").glob("*.json"):
        shutil.copy(p, tmp_path)
    page = r.PAGE.read_text(encoding="utf-8")
    assert r.render(page, r.load(tmp_path)) == page, \
        "docs/benchmarks.md is out of step with bench/out: run python bench/report.py"


def test_the_figures_on_disk_are_the_ones_the_page_shows():
    r = report()
    shown = {png for png, *_ in r.current(r.load(r.RECORDS))[1]}
    assert shown, "the committed records draw no figure"
    assert {p.name for p in r.IMG.glob("*.png")} == shown


def test_every_benchmark_figure_in_the_docs_names_its_command_and_record():
    r = report()
    assert r.check_figures(r.pages()) == []
    text = r.PAGE.read_text(encoding="utf-8")
    assert text.count("](img/bench/") == len(r.current(r.load(r.RECORDS))[1])


def _site(tmp_path: Path, caption: str, record: dict | None) -> list[Path]:
    """A repository with one page showing one benchmark figure, its caption and maybe its record."""
    (tmp_path / "docs" / "img" / "bench").mkdir(parents=True)
    (tmp_path / "docs" / "img" / "bench" / "x.png").write_bytes(b"\x89PNG")
    page = tmp_path / "docs" / "benchmarks.md"
    page.write_text(f"# B\n\n![x](img/bench/x.png)\n\n{caption}\n", encoding="utf-8")
    if record is not None:
        (tmp_path / "bench" / "out").mkdir(parents=True)
        (tmp_path / "bench" / "out" / "x.json").write_text(json.dumps(record))
    return [page]


GOOD = "*X. Data: [`bench/out/x.json`](../bench/out/x.json), from `python bench/x.py --n 2`.*"


@pytest.mark.parametrize(("caption", "record", "problem"), [
    (GOOD, None, "bench/out/x.json does not exist"),
    (GOOD, {"command": "python bench/x.py --n 3"}, "was made by `python bench/x.py --n 3`"),
    ("*X, from somewhere.*", {"command": "python bench/x.py --n 2"}, "does not name its record and command"),
    (GOOD.replace("(../bench/out/x.json)", "(../bench/out/y.json)"), {"command": "python bench/x.py --n 2"},
     "the caption links"),
])
def test_the_check_fails_on_a_figure_without_its_record(tmp_path, caption, record, problem):
    r = report()
    bad = r.check_figures(_site(tmp_path, caption, record), tmp_path)
    assert len(bad) == 1 and problem in bad[0], bad


def test_the_check_passes_a_figure_with_its_record(tmp_path):
    r = report()
    assert r.check_figures(_site(tmp_path, GOOD, {"command": "python bench/x.py --n 2"}), tmp_path) == []


def test_a_benchmark_without_a_record_says_which_command_makes_it():
    r = report()
    text, figs = r.current({})
    assert figs == [] and "](img/" not in text
    for s in r.SECTIONS:
        assert f"### {s.title}\n\n*Not measured yet: run `{s.fill}`.*" in text


def _record(bench: str, results: dict, command: str | None = None) -> dict:
    return {"bench": bench, "command": command or f"python bench/{bench}.py", "cpu": "Some CPU", "cores": 2,
            "threads": 1, "date": "2026-12-05T10:00:00Z", "commit": "0123456789ab", "dirty": False,
            "results": results}


def _gate_row(shown: float) -> dict:
    return {"holes": 4, "shown_%": shown, "exact": 1, "wrong_first": 1, "exact_of_shown_%": 50.0,
            "wrong_first_of_shown_%": 50.0, "chars_kept_of_shown_%": 40.0, "chars_got_%": 20.0,
            "exact_of_all_%": 25.0, "decode_tokens": 30, "ms_p50": 9.0}


def _speculative_row(ms: list[float]) -> dict:
    return {"ms_per_token_p50": 3.0, "tokens_per_s": 333.3, "vs_plain": 1.0, "vs_hf_assisted": None,
            "tau": float("nan"), "decode_ms_per_token_p50": 1.2, "decode_vs_plain": 1.0,
            "decode_vs_hf_assisted": None, "same_ids": "2/2", "accept_by_pos": [None] * 8, "by_source": {},
            "decode_ms_per_token_by_prompt": ms}


# one record per section, shaped as its script writes it (bench/<script>.py, the record.write call)
RECORDS = {
    "peers": _record("peers", {"threads": 1, "device": "cpu", "new": 32, "models": {"embedded 10.3M pair": {
        "depth": 445, "prompts": 2, "methods": {
            "ours auto plain": {"decode": 4.1, "prefill": 3000.0, "e2e": 230.0, "tau": None, "runner": "NativeRunner"},
            "ours fast-int8@2 plain": {"decode": 0.9, "prefill": 6000.0, "e2e": 110.0, "tau": None, "runner": "N"},
            "ours auto default (speculative)": {"decode": 1.8, "prefill": 3100.0, "e2e": 190.0, "tau": 2.7,
                                                "runner": "NativeRunner c=0.031 v8=1.25"},
            "llama.cpp q8_0": {"decode": 4.3, "prefill": 1600.0, "e2e": 403.0, "tau": None},
            "llama.cpp q4_0": {"decode": 3.8, "prefill": 2100.0, "e2e": None, "tau": None}}}}}),
    "speculative": _record("speculative", {
        "step_ratio": {"target_ms": 1.2, "draft_ms": 0.1, "c": 0.083, "verify7_ratio": 1.3},
        "verify_costs": [1.0, 1.02, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4], "n": 2, "new": 48, "quant": "auto",
        "draft_vocab": 2048, "threads": 1, "prompts": ["email/a.py", "json/b.py"],
        "methods": {"plain (ours)": _speculative_row([1.2, 1.3]), "ours: combined": _speculative_row([0.7, 0.9])}}),
    "decode": _record("decode", {"prompts": 2, "depth": 400, "new": 48,
                                 "rows": {"new plain": {"ms_per_token_median": 1.0, "tau_median": 1.0},
                                          "new speculative": {"ms_per_token_median": 0.8, "tau_median": 2.1}},
                                 "per_prompt": {"new plain": [1.0, 1.1], "new speculative": [0.7, 0.9]}}),
    "keystrokes_lsp": _record("keystrokes", {"args": {"lsp": "True"}, "sites": ["a.py"], "summary": {
        "local": {"requests": 2, "p50": 80.0, "p90": 200.0, "p99": 300.0, "shown_rate": 0.5, "tokens_shown": 9,
                  "tokens_generated": None, "tokens_max": 48, "engine_error": None}},
        "rows": [{"mode": "local", "e2e_ms": 80.0, "shown": True}, {"mode": "local", "e2e_ms": 200.0, "shown": False},
                 {"mode": "server_stats", "engine": "local", "stats": {}}]}),
    "keystrokes": _record("keystrokes", {"sites": [["email/a.py", 240]], "head_tokens": 2000, "ctx": 1024,
                                         "summary": {"cache": {
                                             "requests": 2, "ttft_ms": {"p50": 9.0, "p90": 20.0, "p99": 30.0},
                                             "total_ms": {"p50": 30.0, "p90": 60.0, "p99": 90.0},
                                             "cache_hit_rate": 1.0, "type_through_rate": 0.0, "warmups": 3,
                                             "warmup_ms_p50": 4.0}},
                                         "one_char_edit": {}, "rows": [{"mode": "cache", "total_ms": 30.0},
                                                                       {"mode": "cache", "total_ms": 60.0}]}),
    "keystrokes_cases": _record("keystrokes", {
        "summary": {"cold_new_document": {"p50": 150.0, "p90": 180.0}, "after_keystroke": {"p50": 27.0, "p90": 41.0}},
        "rows": [{"file": "a.py", "line": 3, "cold_new_document": 150.0, "after_keystroke": 27.0}], "stats": {}}),
    "evaluate_pair_pypi": _record("evaluate_pair", {
        "target": "t", "draft": "d", "source": "pypi", "next_token_acc": 0.335, "ngram4_next_token_acc": 0.206,
        "heldout_loss": 4.16, "heldout_ppl": 64.4, "eval_tokens": 58995, "single_line_exact_match": 0.0,
        "degenerate_rate_model": 1.0, "degenerate_rate_real_code": 0.15, "draft_greedy_agreement": 0.54,
        "tau_k4": 2.4, "tau_k8": 2.7, "cold_start_s_median": 1.9, "peak_rss_mb": 330.9}),
    "gate": _record("gate", {"n": 4, "seed": 0, "packages": ["httpx==0.27.2"], "thresholds": [0.0, 0.5],
                             "pairs": {"embedded": {"target": "embedded", "draft": "embedded", "holes": [],
                                                    "table": {"0.0": _gate_row(60.0), "0.5": _gate_row(20.0)}}},
                             "calibration": {"pair": "embedded", "min_confidence": 0.5, "holes": 4, "source": "stdlib",
                                             "table": {"0.0": _gate_row(55.0), "0.5": _gate_row(25.0)}}}),
    "learning_curve": {**_record("learning_curve", {
        "log": "draft_models/default/train_log.txt", "tokens_per_step": 2048, "tokens_before": 0, "smooth": 2,
        "stages": {"target": {"train": [[20, 5.0], [40, 4.5], [60, 4.2]], "eval": [[40, 4.6, 0.2]]}}}),
        "threads": None, "note": "a fixture"},
    "alternatives": _record("alternatives", {
        "holes": 2, "seed": 0, "threads": 1, "min_confidence": 0.0, "same_main": 2, "branch_prefill_tokens": [1],
        "all": {"n=1": {"requests": 2, "ms_p50": 20.0, "ms_p90": 30.0, "ms_mean": 25.0, "items_mean": 1.0,
                        "branch_tokens_mean": 0.0},
                "n=3": {"requests": 2, "ms_p50": 30.0, "ms_p90": 45.0, "ms_mean": 37.5, "items_mean": 2.5,
                        "branch_tokens_mean": 9.0}}, "shown": {}, "rows": []}),
    "holes": _record("holes", {"anything": 1}),
}


def test_every_section_renders_and_draws_from_its_scripts_record(tmp_path):
    pytest.importorskip("matplotlib")
    r = report()
    text, figs = r.current(RECORDS)
    assert "Not measured yet" not in text
    assert "### Other records" in text and "`python bench/holes.py`" in text  # a record no section shows
    assert "- `learning_curve`: a fixture." in text
    for png, *_ in figs:
        name = png.removesuffix(".png")
        assert f"](img/bench/{png})" in text
        assert f"Data: [`bench/out/{name}.json`](../bench/out/{name}.json), from `{RECORDS[name]['command']}`" in text
    assert {png for png, *_ in figs} == {f"{n}.png" for n in RECORDS
                                         if n not in ("evaluate_pair_pypi", "holes", "alternatives")}
    first = r.write_figures(RECORDS, tmp_path / "a")
    again = r.write_figures(RECORDS, tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in again], "the same records drew other bytes"


def test_a_figure_an_older_record_cannot_draw_is_named_not_drawn():
    r = report()
    old = {"decode": {**RECORDS["decode"], "results": {k: v for k, v in RECORDS["decode"]["results"].items()
                                                       if k != "per_prompt"}}}
    text, figs = r.current(old)
    assert figs == [] and "*No figure: this record predates `per_prompt`; run `python bench/decode.py` for one.*" in text


def test_write_figures_removes_a_figure_no_record_draws(tmp_path):
    pytest.importorskip("matplotlib")
    r = report()
    (tmp_path / "stale.png").write_bytes(b"\x89PNG")
    r.write_figures({"gate": RECORDS["gate"]}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate.png"]
