"""The engine's numbers, declared once: every counter and numeric gauge of `Engine.stats()` with
what it counts. `completer serve` exports exactly these as the Prometheus gauges
`completer_engine_<name>` (serve/metrics.py), so renaming one here renames a metric on purpose
(tests/test_serve.py holds the exported names); counting an undeclared name raises. No torch here."""
from __future__ import annotations

from ..client import StopReason


def stop_counter(reason: StopReason) -> str:
    """The counter of completions that ended for `reason`."""
    return f"stops_{reason.value or 'unknown'}"


COUNTERS = {
    "requests": "completions served (model calls and type-throughs)",
    "cache_hits": "completions whose prompt began with tokens the document's cache held",
    "tokens_reused": "prompt tokens served from a document's cache",
    "prefill_tokens": "prompt tokens computed",
    "generated_tokens": "tokens generated",
    "evictions": "documents' caches evicted to make room",
    "warmups": "warmups run",
    "warmup_tokens": "prompt tokens prefilled by warmups",
    "warmup_preempted": "times a warmup gave way to a request",
    "type_through": "completions served from the previous one as the user typed it (no model call)",
    "superseded": "generations a newer request for the same document took over",
    "rewrites": "next edits asked of the model",
    "rewrites_unsure": "next edits the confidence gate dropped (a token of the answer below next_edit_min_confidence)",
    "alternatives": "alternatives to cycle returned beside main completions (distinct from them)",
    "alternative_tokens": "tokens the alternatives' branches decoded",
    "prefetches": "continuations of shown completions computed while idle (the next completion before Tab)",
    "prefetch_tokens": "tokens those continuations generated",
    "prefetch_served": "completions served from a continuation computed before the request (no model call)",
    "feedback_accepted": "shown completions the editor reported accepted",
    "feedback_rejected": "shown completions the editor reported rejected",
    "feedback_accepted_chars": "characters of shown completions the user kept",
    **{stop_counter(r): f"completions that ended: {r.name.lower().replace('_', ' ')}" for r in StopReason},
}

GAUGES = {
    "ctx": "the model's context in tokens",
    "prompt_budget": "prompt tokens a completion may use",
    "kv_bytes": "bytes of K/V memory the documents' caches hold",
    "kv_live_bytes": "bytes of K/V the caches hold for live tokens",
    "kv_budget_bytes": "the K/V memory budget (kv_budget_mb)",
    "kv_bytes_per_document": "K/V bytes one document's caches reserve",
    "kv_cached_documents": "documents with a cache",
    "target_weight_bytes": "bytes of the target model's weights",
    "draft_weight_bytes": "bytes of the draft model's weights",
    "amx_rows": "rows from which the native step multiplies with AMX-BF16 (calibrated at start)",
    "min_confidence_in_force": "the confidence gate's threshold in force",
    "next_edit_min_confidence_in_force": "the next-edit confidence gate's threshold in force",
    "next_edit_weight_bytes": "bytes of the next-edit model's weights (next_edit_model; absent without one)",
    "next_edit_kv_bytes": "bytes of K/V memory the next-edit model's caches hold (a budget of kv_budget_mb of its own)",
    "queue_waiting": "requests waiting for the engine",
    "queue_live": "generations running",
    "batch_steps": "batched steps run",
    "batched_calls": "forward calls that shared a step with another",
    "records": "documents whose last completion is kept for type-through",
    "record_chars": "characters of those completions",
}

METRICS = {**COUNTERS, **GAUGES}
