"""The scheduler's Prometheus metrics (names prefixed ortserve_scheduler_, units in names).

Per-worker byte gauges are computed from the ledger at scrape time, so they
equal GetBudget byte for byte; counters are fed where the decision is made.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from ortserve.metrics import (
    REQUEST_SECONDS_BUCKETS,
    PerWorkerGauges,
    RequestLatency,
    callback_gauge,
)
from scheduler_service.ledger.ledger import Admission, Decision, Ledger
from scheduler_service.ledger.queue import AdmissionQueue


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry, ledger: Ledger,
                 queue: AdmissionQueue | None = None) -> None:
        registry.register(PerWorkerGauges(ledger.snapshot, (
            ("ortserve_scheduler_kv_capacity_bytes", "A worker's whole KV capacity",
             lambda w: w.geometry.capacity_bytes),
            ("ortserve_scheduler_kv_reserved_bytes", "KV bytes leases hold on a worker",
             lambda w: w.reserved_bytes),
            ("ortserve_scheduler_kv_available_bytes", "capacity - reserved, per worker",
             lambda w: w.available_bytes),
            ("ortserve_scheduler_leases", "Live leases per worker", lambda w: len(w.leases)),
            ("ortserve_scheduler_worker_draining", "1 while a worker drains",
             lambda w: int(w.draining)),
            ("ortserve_scheduler_kv_cached_bytes",
             "KV bytes a worker's prefix cache holds (its last heartbeat): inside its capacity, "
             "evictable, so counted as available", lambda w: w.prefix.cached_bytes))))
        if queue is not None:
            callback_gauge(registry, "ortserve_scheduler_queue_length",
                           "Requests waiting in the admission queue now", lambda: len(queue))
            callback_gauge(registry, "ortserve_scheduler_queue_oldest_wait_seconds",
                           "How long the head of the admission queue has waited",
                           lambda: queue.stats().oldest_wait_s)
            callback_gauge(registry, "ortserve_scheduler_queue_waiting_bytes",
                           "KV bytes the queued requests need", lambda: queue.stats().waiting_bytes)
        self.queue_wait_seconds = Histogram(
            "ortserve_scheduler_queue_wait_seconds",
            "Time a request spent in the admission queue before its decision (0: none)",
            buckets=REQUEST_SECONDS_BUCKETS, registry=registry)
        self.admissions = Counter(
            "ortserve_scheduler_admissions", "Admission decisions (dry runs excluded), by "
            "decision and rejection cause", ["decision", "cause"], registry=registry)
        self.caps = Counter("ortserve_scheduler_caps", "Requests CAPPED by the KV budget",
                            registry=registry)
        self.cap_tokens_cut = Counter(
            "ortserve_scheduler_cap_tokens_cut",
            "max_new_tokens taken off by caps (requested - admitted)", registry=registry)
        self.lease_expiries = Counter(
            "ortserve_scheduler_lease_expiries", "Leases the ledger dropped without a release "
            "(worker silent, unclaimed too long, lost by its worker)", registry=registry)
        self.generated_tokens = Counter(
            "ortserve_scheduler_generated_tokens", "Tokens relayed to clients",
            registry=registry)
        self.latency = RequestLatency(registry, "ortserve_scheduler", "scheduler")

    def admission(self, admission: Admission) -> None:
        if admission.dry_run:
            return
        cause = admission.rejection.cause.value if admission.rejection else ""
        self.admissions.labels(admission.decision.value, cause).inc()
        self.queue_wait_seconds.observe(admission.queue_wait_s)
        if admission.decision is Decision.CAPPED and admission.budget_cap is not None:
            cap = admission.budget_cap
            self.caps.inc()
            self.cap_tokens_cut.inc(cap.requested_max_new_tokens - cap.admitted_max_new_tokens)

    def expired(self, expired: list) -> None:
        self.lease_expiries.inc(len(expired))

    def finished(self, generated_tokens: int, ttft_ms: float, decode_ms: float,
                 total_ms: float) -> None:
        self.generated_tokens.inc(generated_tokens)
        self.latency.observe(generated_tokens, ttft_ms, decode_ms, total_ms)
