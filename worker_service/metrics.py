"""The worker's Prometheus metrics (names prefixed ortserve_worker_, units in names).

Gauges read the engine at scrape time; the histograms and counters are fed
once per finished sequence from its Completed event.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from ortserve.metrics import RequestLatency, callback_gauge
from worker_service.core.sequence import Completed
from worker_service.engine import Engine


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, engine: Engine) -> None:
        callback_gauge(registry, "ortserve_worker_kv_capacity_bytes",
                       "KV-cache bytes this worker lets sequences hold (its --kv-capacity)",
                       lambda: engine.capacity_bytes)
        callback_gauge(registry, "ortserve_worker_kv_held_bytes",
                       "KV-cache bytes charged to live sequences now (queued ones included)",
                       engine.held_bytes)
        # vLLM's kv_cache_usage_perc: the share of the KV capacity sequences hold now.
        Gauge("ortserve_worker_kv_usage_ratio", "held / capacity of this worker's KV (0 to 1)",
              ["model"], registry=registry).labels(engine.spec.name).set_function(
            lambda: engine.held_bytes() / engine.capacity_bytes if engine.capacity_bytes else 0.0)
        callback_gauge(registry, "ortserve_worker_running_sequences",
                       "Sequences on this worker now (queued on the engine included)",
                       engine.active_sequences)
        callback_gauge(registry, "ortserve_worker_batch_rows",
                       "Rows in the running batch now (sequences one decode run advances)",
                       lambda: engine.batch_rows)
        callback_gauge(registry, "ortserve_worker_largest_batch",
                       "The largest batch one run has decoded since start",
                       lambda: engine.runner.largest_batch)
        self.generated_tokens = Counter(
            "ortserve_worker_generated_tokens", "Tokens generated (EOS included)",
            registry=registry)
        self.sequences = Counter(
            "ortserve_worker_sequences_finished", "Sequences that finished, by finish reason",
            ["finish_reason"], registry=registry)
        self.latency = RequestLatency(registry, "ortserve_worker", "worker")

    def completed(self, done: Completed) -> None:
        self.generated_tokens.inc(done.generated_tokens)
        self.sequences.labels(done.finish_reason.value).inc()
        self.latency.observe(done.generated_tokens, done.ttft_ms, done.decode_ms, done.total_ms)
