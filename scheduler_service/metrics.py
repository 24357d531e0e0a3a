"""The scheduler's Prometheus metrics (names prefixed ortserve_scheduler_, units in names).

Per-worker byte gauges are computed from the ledger at scrape time, so they
equal GetBudget byte for byte; counters are fed where the decision is made.
Every Generate and SessionTurn is counted once by outcome (request_outcome.py);
the names vLLM users know are mapped in docs/operations/operations.md.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ortserve.process.metrics import (
    REQUEST_SECONDS_BUCKETS,
    PerWorkerGauges,
    RequestLatency,
    callback_gauge,
)
from ortserve.v1 import types_pb2
from scheduler_service.ledger.ledger import AdmissionDecision, Decision, Ledger
from scheduler_service.ledger.queue import AdmissionQueue
from scheduler_service.ledger.types import WorkerSnapshot
from scheduler_service.model_server_metrics import ModelServerGauges
from scheduler_service.relay import RELAYED


class RelayedTokens(Collector):
    """Token chunks this scheduler relayed to its callers, and the tokens in them: 0 while
    every caller reads from the workers directly (the two-step path)."""

    def collect(self):
        yield CounterMetricFamily("ortserve_scheduler_relayed_messages",
                                  "Token chunk messages relayed from workers to callers",
                                  value=RELAYED.messages)
        yield CounterMetricFamily("ortserve_scheduler_relayed_tokens",
                                  "Tokens in the chunks relayed from workers to callers",
                                  value=RELAYED.tokens)

    def describe(self):
        return [CounterMetricFamily("ortserve_scheduler_relayed_messages", ""),
                CounterMetricFamily("ortserve_scheduler_relayed_tokens", "")]


class KvReservedRatio(Collector):
    """Reserved / capacity, 0 to 1, at scrape time: per worker (with its model), per
    model and over all workers; the budget signal an autoscaler reads."""

    def __init__(self, snapshot) -> None:
        self._snapshot = snapshot

    def collect(self):
        workers: list[WorkerSnapshot] = self._snapshot()
        per_worker = GaugeMetricFamily(
            "ortserve_scheduler_kv_reserved_ratio",
            "reserved / capacity of a worker's KV budget (0 to 1)", labels=["worker_id", "model"])
        per_model = GaugeMetricFamily(
            "ortserve_scheduler_model_kv_reserved_ratio",
            "reserved / capacity over the workers serving a model (0 to 1)", labels=["model"])
        models: dict[str, list[int]] = {}
        for w in workers:
            capacity = w.geometry.capacity_bytes
            per_worker.add_metric([w.geometry.worker_id, w.geometry.model],
                                  w.reserved_bytes / capacity if capacity else 0.0)
            sums = models.setdefault(w.geometry.model, [0, 0])
            sums[0] += w.reserved_bytes
            sums[1] += capacity
        for model, (reserved, capacity) in sorted(models.items()):
            per_model.add_metric([model], reserved / capacity if capacity else 0.0)
        reserved = sum(r for r, _ in models.values())
        capacity = sum(c for _, c in models.values())
        total = GaugeMetricFamily(
            "ortserve_scheduler_total_kv_reserved_ratio",
            "reserved / capacity over every registered worker (0 to 1; 0 with none)",
            value=reserved / capacity if capacity else 0.0)
        yield from (per_worker, per_model, total)

    def describe(self):
        return [GaugeMetricFamily("ortserve_scheduler_kv_reserved_ratio", "", labels=["worker_id", "model"]),
                GaugeMetricFamily("ortserve_scheduler_model_kv_reserved_ratio", "", labels=["model"]),
                GaugeMetricFamily("ortserve_scheduler_total_kv_reserved_ratio", "")]


class TenantGauges(Collector):
    """Per tenant and model, at scrape time: the KV bytes its leases hold, its quota and its
    waiting requests (the ledger's and the queue's own numbers, as GetBudget shows them)."""

    _NAMES = (("ortserve_scheduler_tenant_kv_reserved_bytes", "KV bytes a tenant's leases hold"),
              ("ortserve_scheduler_tenant_kv_quota_bytes",
               "A tenant's KV quota (tenants with no quota are not listed)"),
              ("ortserve_scheduler_tenant_queue_length",
               "A tenant's requests waiting in the admission queue"),
              ("ortserve_scheduler_tenant_session_disk_bytes",
               "Disk bytes a tenant's sessions hold in workers' disk tiers (outside its quota)"))

    def __init__(self, ledger: Ledger, queue: AdmissionQueue | None) -> None:
        self._ledger = ledger
        self._queue = queue

    def collect(self):
        reserved, quota, queued, disk = (GaugeMetricFamily(name, text, labels=["tenant", "model"])
                                         for name, text in self._NAMES)
        waiting = self._queue.tenant_stats() if self._queue is not None else {}
        for u in self._ledger.tenant_usage():
            labels = [u.tenant, u.model]
            reserved.add_metric(labels, u.reserved_bytes)
            if u.quota_bytes is not None:
                quota.add_metric(labels, u.quota_bytes)
            stats = waiting.get((u.tenant, u.model))
            queued.add_metric(labels, stats.length if stats else 0)
            disk.add_metric(labels, u.disk_bytes)
        yield from (reserved, quota, queued, disk)

    def describe(self):
        return [GaugeMetricFamily(name, "", labels=["tenant", "model"]) for name, _ in self._NAMES]


class TimeGauges(Collector):
    """Per worker, at scrape time: its time budget (docs/features/time-budget.md), the
    ledger's own numbers as GetBudget shows them. A worker not measured yet shows 0 steps."""

    _NAMES = (("ortserve_scheduler_worker_step_ms",
               "A worker's decode step predicted at its streams now, from its measured steps"),
              ("ortserve_scheduler_worker_next_step_ms",
               "A worker's decode step predicted with one more stream (what admission checks)"),
              ("ortserve_scheduler_worker_itl_goal_ms",
               "The strictest gap goal among a worker's streams (0: none)"),
              ("ortserve_scheduler_worker_steps_measured",
               "Decode steps a worker has reported (0: time admission does not apply yet)"))

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def collect(self):
        families = [GaugeMetricFamily(name, text, labels=["worker_id"]) for name, text in self._NAMES]
        for t in self._ledger.worker_times():
            for family, value in zip(families, (t.step_ms, t.next_step_ms, t.itl_goal_ms,
                                                t.steps_measured), strict=True):
                family.add_metric([t.worker_id], float(value))
        yield from families

    def describe(self):
        return [GaugeMetricFamily(name, "", labels=["worker_id"]) for name, _ in self._NAMES]


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
             "evictable, so counted as available", lambda w: w.prefix.cached_bytes),
            ("ortserve_scheduler_session_host_bytes",
             "Host bytes a worker's parked sessions hold (the host tier; never in its capacity)",
             lambda w: w.host_bytes),
            ("ortserve_scheduler_session_disk_bytes",
             "Bytes of a worker's session files in its disk tier (never in its capacity)",
             lambda w: w.disk_bytes),
            ("ortserve_scheduler_decode_graph_bytes",
             "Device memory a worker's captured CUDA decode graphs took (measured there), "
             "already out of its KV capacity", lambda w: w.geometry.decode_graph_bytes),
            ("ortserve_scheduler_decode_buffer_bytes",
             "Bytes of a worker's decode buckets' fixed buffers on its KV's device, already "
             "out of its KV capacity", lambda w: w.geometry.decode_buffer_bytes))))
        registry.register(KvReservedRatio(ledger.snapshot))
        registry.register(TenantGauges(ledger, queue))
        registry.register(TimeGauges(ledger))
        registry.register(RelayedTokens())
        # What an inference gateway's endpoint picker reads (docs/operations/inference-gateway.md).
        registry.register(ModelServerGauges(ledger, queue))
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
        self.tenant_admissions = Counter(
            "ortserve_scheduler_tenant_admissions", "Admission decisions (dry runs excluded) by "
            "tenant ('' for none), decision and rejection cause", ["tenant", "decision", "cause"],
            registry=registry)
        self.tenant_queue_wait_seconds = Histogram(
            "ortserve_scheduler_tenant_queue_wait_seconds",
            "Time a tenant's request spent in the admission queue before its decision",
            ["tenant"], buckets=REQUEST_SECONDS_BUCKETS, registry=registry)
        self.caps = Counter("ortserve_scheduler_caps", "Requests CAPPED by the KV budget",
                            registry=registry)
        self.cap_tokens_cut = Counter(
            "ortserve_scheduler_cap_tokens_cut",
            "max_new_tokens taken off by caps (requested - admitted)", registry=registry)
        self.lease_expiries = Counter(
            "ortserve_scheduler_lease_expiries", "Leases the ledger dropped without a release "
            "(worker silent, unclaimed too long, lost by its worker)", registry=registry)
        self.worker_deregistrations = Counter(
            "ortserve_scheduler_worker_deregistrations", "Workers that said they stopped "
            "cleanly (Deregister) and were forgotten at once, not after the lease TTL",
            registry=registry)
        self.deregistered_leases = Counter(
            "ortserve_scheduler_deregistered_leases", "Leases released with their worker's "
            "clean stop (sessions saved to its disk tier included: they return with it)",
            registry=registry)
        self.generated_tokens = Counter(
            "ortserve_scheduler_generated_tokens", "Tokens relayed to clients in finished "
            "requests (their Finished usage.generated_tokens)", registry=registry)
        self.prompt_tokens = Counter(
            "ortserve_scheduler_prompt_tokens", "Prompt tokens of finished requests (their "
            "Finished usage.prompt_tokens: what the clients were told)", registry=registry)
        self.requests = Counter(
            "ortserve_scheduler_requests", "Generate and SessionTurn calls by how they ended, "
            "each once: outcome finished|rejected|cancelled|deadline|worker_failed|error, "
            "cause the finish reason, the rejection's reason, queued|running, or the status "
            "code (docs/operations/operations.md)", ["rpc", "outcome", "cause"], registry=registry)
        self.latency = RequestLatency(registry, "ortserve_scheduler", "scheduler")

    def admission(self, admission: AdmissionDecision) -> None:
        if admission.dry_run:
            return
        cause = admission.rejection.cause.value if admission.rejection else ""
        self.admissions.labels(admission.decision.value, cause).inc()
        self.queue_wait_seconds.observe(admission.queue_wait_s)
        self.tenant_admissions.labels(admission.tenant, admission.decision.value, cause).inc()
        self.tenant_queue_wait_seconds.labels(admission.tenant).observe(admission.queue_wait_s)
        if admission.decision is Decision.CAPPED and admission.budget_cap is not None:
            cap = admission.budget_cap
            self.caps.inc()
            self.cap_tokens_cut.inc(cap.requested_max_new_tokens - cap.admitted_max_new_tokens)

    def expired(self, expired: list) -> None:
        self.lease_expiries.inc(len(expired))

    def deregistered(self, leases: list) -> None:
        """A worker's clean stop: it, and the leases released with it."""
        self.worker_deregistrations.inc()
        self.deregistered_leases.inc(len(leases))

    def request(self, rpc: str, outcome: str, cause: str,
                finished: types_pb2.Finished | None) -> None:
        """One request's exit (RequestOutcome calls it once): its outcome, and for a
        finished one its tokens and timings."""
        self.requests.labels(rpc, outcome, cause).inc()
        if finished is not None:
            usage, t = finished.usage, finished.timings
            self.prompt_tokens.inc(usage.prompt_tokens)
            self.generated_tokens.inc(usage.generated_tokens)
            self.latency.observe(usage.generated_tokens, t.ttft_ms, t.decode_ms, t.total_ms)
