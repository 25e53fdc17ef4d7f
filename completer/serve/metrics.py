"""Prometheus metrics of `completer serve` (its own registry): request stages, TTFT, decode speed,
acceptance and outcomes observed here, and every number of the engine's `stats()` read at
scrape time as a gauge `completer_engine_<name>`: the names engine/stats.py declares."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from ..engine.stats import METRICS

BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self, engine_stats: Callable[[], dict | None], ready: Callable[[], bool]):
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)  # process_resident_memory_bytes and friends
        self.stage = Histogram("completer_stage_seconds", "Request latency by stage", ["stage"], buckets=BUCKETS,
                               registry=reg)
        self.ttft = Histogram("completer_ttft_seconds", "Time to first token", buckets=BUCKETS, registry=reg)
        self.speed = Histogram("completer_tokens_per_second", "Generated tokens per second of decoding",
                               buckets=(10, 25, 50, 100, 200, 400, 800, 1600, 3200), registry=reg)
        self.accept = Histogram("completer_accepted_per_forward", "Tokens gained per target forward",
                                buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8), registry=reg)
        self.requests = Counter("completer_requests", "Requests by kind and outcome", ["kind", "outcome"],
                                registry=reg)
        reg.register(_EngineCollector(engine_stats, ready))

    def observe(self, stats: dict) -> None:
        """One finished (not cancelled) completion's stats: the flat Completion.to_json()."""
        ms = lambda k: max(float(stats.get(k) or 0.0), 0.0) / 1e3
        total, queue, prefill = ms("total_ms"), ms("queue_ms"), ms("prefill_ms")
        self.stage.labels("total").observe(total)
        self.stage.labels("queue").observe(queue)
        if stats.get("type_through") or stats.get("prefetched"):  # no model call: no prefill or decode
            return
        self.stage.labels("prefill").observe(prefill)
        decode = max(total - queue - prefill, 0.0)
        self.stage.labels("decode").observe(decode)
        self.ttft.observe(ms("ttft_ms"))
        if decode > 0 and stats.get("new_tokens"):
            self.speed.observe(stats["new_tokens"] / decode)
        if stats.get("target_forwards"):
            self.accept.observe(stats["accepted_per_forward"])

    def text(self) -> tuple[bytes, str]:
        """(exposition body, content type)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineCollector:
    """completer_ready, and each declared engine number (engine/stats.py) as completer_engine_<name>."""

    def __init__(self, engine_stats: Callable[[], dict | None], ready: Callable[[], bool]):
        self.engine_stats, self.ready = engine_stats, ready

    def collect(self):
        yield GaugeMetricFamily("completer_ready", "1 when the models are loaded", value=float(self.ready()))
        stats = self.engine_stats() or {}
        for name, doc in METRICS.items():
            v = stats.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                yield GaugeMetricFamily(f"completer_engine_{name}", doc, value=float(v))
