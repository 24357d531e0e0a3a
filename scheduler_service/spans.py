"""The scheduler's part of a request's trace: its admission, its queue wait, and the
decision, cap and cause as attributes (ortserve.process.tracing; nothing at all when off).

The spans are recorded with explicit times once the decision is known: the
handlers are async generators, and a span made current across their yields could
be detached in another context. The worker's stream that follows is the grpc
instrumentation's client span, a sibling of these under the RPC's server span.
"""

from __future__ import annotations

import time

from ortserve.process import tracing
from scheduler_service.ledger.types import AdmissionDecision


def decision_attributes(admission: AdmissionDecision) -> dict[str, object]:
    """What the ledger decided, as span attributes (ortserve.*; a cap's numbers under cap.)."""
    cap, rejection, lease = admission.budget_cap, admission.rejection, admission.lease
    attributes: dict[str, object] = {
        "request_id": admission.request_id,
        "decision": admission.decision.value,
        "cause": rejection.cause.value if rejection is not None else None,
        "prompt_tokens": admission.prompt_tokens,
        "max_new_tokens": admission.max_new_tokens,
        "reserved_bytes": admission.reserved_bytes,
        "worker_id": admission.worker.worker_id if admission.worker is not None else None,
        "model": admission.worker.model if admission.worker is not None else None,
        "lease_id": lease.lease_id if lease is not None else None,
        "capped": cap is not None,
    }
    if cap is not None:
        attributes.update({
            "cap.requested_max_new_tokens": cap.requested_max_new_tokens,
            "cap.admitted_max_new_tokens": cap.admitted_max_new_tokens,
            "cap.available_bytes": cap.available_bytes,
            "cap.reason": cap.reason})
    return {k if k.startswith("ortserve.") else f"ortserve.{k}": v for k, v in attributes.items()}


def decided(admission: AdmissionDecision, arrived_perf_s: float,
            queued_perf_s: float | None) -> None:
    """The request's admission is final: an `admission` span from its arrival to its first
    answer (the prompt counted, the ledger asked), a `queue_wait` span if it waited, and
    the decision on the RPC's own span."""
    if not tracing.enabled():
        return
    now_ns = time.time_ns()
    attributes = decision_attributes(admission)
    queued = queued_perf_s is not None
    first_answer_ns = tracing.wall_ns(queued_perf_s) if queued else now_ns
    tracing.record("admission", tracing.wall_ns(arrived_perf_s), first_answer_ns,
                   queued=queued, **attributes)
    if queued:
        tracing.record("queue_wait", first_answer_ns, now_ns,
                       **{"ortserve.decision": admission.decision.value,
                          "ortserve.queue_wait_s": admission.queue_wait_s})
    tracing.annotate(**attributes)
