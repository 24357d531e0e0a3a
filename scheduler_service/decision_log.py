"""The one place the ledger's and the queue's own decisions are logged (and counted).

Expiry and leaving the queue happen inside the ledger and the queue, which log
nothing (they are pure); whoever drains their results hands them here, so a
dropped lease or a decided ticket reads the same from every caller. No grpc.
"""

from __future__ import annotations

import structlog

from ortserve.status.errors import clip
from scheduler_service.ledger.queue import Ticket
from scheduler_service.ledger.types import Expired

log = structlog.get_logger("scheduler")


def log_expired(expired: list[Expired], metrics=None) -> None:
    """The one place a dropped lease is logged (and counted), with its numbers."""
    if metrics is not None:
        metrics.expired(expired)
    for gone in expired:
        lease = gone.lease
        log.warning("lease expired", why=gone.why, lease_id=lease.lease_id,
                    worker_id=lease.worker_id, request_id=clip(lease.request_id),
                    claimed=lease.claimed, age_s=round(gone.age_s, 3),
                    prompt_tokens=lease.prompt_tokens, max_new_tokens=lease.max_new_tokens,
                    freed_bytes=lease.reserved_bytes)


def log_decided(done: list[Ticket]) -> None:
    """The one place a queued request's leaving the queue is logged."""
    for ticket in done:
        outcome = ticket.outcome
        log.info("left the queue", request_id=clip(ticket.request.request_id),
                 decision=outcome.decision.value if outcome else "deadline_exceeded",
                 cause=outcome.rejection.cause.value if outcome and outcome.rejection else None,
                 lease_id=outcome.lease.lease_id if outcome and outcome.lease else None,
                 waited_ms=round((outcome.queue_wait_s if outcome else ticket.max_wait_s) * 1e3, 1),
                 needed_bytes=ticket.needed_bytes)
