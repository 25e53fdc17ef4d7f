"""The engine's numbers are declared once (completer/engine/stats.py): what `stats()` reports is
declared, counting an undeclared name raises, and /metrics exports exactly the declared names —
held here as a list, so renaming a counter is a visible change to a metric, never a silent one."""
from __future__ import annotations

import pytest
from helpers.engines import engine, random_pair

from completer.client import Completion, StopReason
from completer.engine.stats import COUNTERS, GAUGES, METRICS, stop_counter
from completer.serve.metrics import Metrics

EXPORTED = ["alternative_tokens", "alternatives", "amx_rows", "batch_steps", "batched_calls", "cache_hits", "ctx", "draft_weight_bytes", "evictions", "feedback_accepted", "feedback_accepted_chars", "feedback_rejected", "generated_tokens", "kv_budget_bytes", "kv_bytes", "kv_bytes_per_document", "kv_cached_documents", "kv_live_bytes", "min_confidence_in_force", "next_edit_kv_bytes", "next_edit_min_confidence_in_force", "next_edit_weight_bytes", "prefetch_served", "prefetch_tokens", "prefetches", "prefill_tokens", "prompt_budget", "queue_live", "queue_waiting", "record_chars", "records", "requests", "rewrites", "rewrites_unsure", "stops_cancelled", "stops_context", "stops_degenerate", "stops_eos", "stops_gated", "stops_length", "stops_stop", "stops_superseded", "stops_syntax", "stops_type_through", "stops_unknown", "stops_unsure", "stops_untrained", "superseded", "target_weight_bytes", "tokens_reused", "type_through", "warmup_preempted", "warmup_tokens", "warmups"]


def test_the_exported_metric_names_are_the_declared_ones():
    assert sorted(METRICS) == EXPORTED
    assert not set(COUNTERS) & set(GAUGES)
    assert {stop_counter(r) for r in StopReason} <= set(COUNTERS)


def test_every_number_the_engine_reports_is_declared_and_exported(tok):
    e = engine(random_pair(tok))
    try:
        e.complete("def f(x):\n    return ", "\n", doc_key="a.py", max_new=4)
        e.warmup("import os\n", "", doc_key="b.py")
        e.feedback("a.py", "x + 1", accepted=True)
        stats = e.stats()
    finally:
        e.close()
    numbers = {k for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numbers <= set(METRICS), f"undeclared: {sorted(numbers - set(METRICS))}"
    assert set(COUNTERS) <= set(stats)  # every counter reported, 0 until counted
    assert stats["requests"] == 1 and stats["feedback_accepted"] == 1 and stats["warmups"] == 1
    assert sum(stats[stop_counter(r)] for r in StopReason) == 1

    body = Metrics(lambda: {**stats, "undeclared_number": 7}, lambda: True).text()[0].decode()
    exported = {line.split()[0].removeprefix("completer_engine_") for line in body.splitlines()
                if line.startswith("completer_engine_")}
    assert exported == {k for k in numbers if stats[k] is not None}
    assert "undeclared_number" not in body


def test_counting_an_undeclared_name_raises(tok):
    e = engine(random_pair(tok))
    with pytest.raises(KeyError, match="undeclared engine counter 'stops_maybe'"):
        e._count(stops_maybe=1)


def test_a_reason_from_a_wire_is_parsed_and_an_unknown_one_is_none():
    c = Completion.from_json({"text": "x", "stop_reason": "syntax", "type_through": True, "queue_ms": 2.0})
    assert c.stop_reason is StopReason.SYNTAX and c.type_through and c.extra == {"queue_ms": 2.0}
    assert Completion.from_json({"text": "", "stop_reason": "from-the-future"}).stop_reason is StopReason.NONE
    assert Completion.from_json(c.to_json()) == c
