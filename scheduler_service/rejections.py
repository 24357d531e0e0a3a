"""A REJECTED admission as the error a stream ends with (Generate, SessionTurn).

Its status code comes from the one table (ortserve.status_table), like every
other domain error's.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from ortserve import rich_status
from ortserve.errors import ContextWindowFull, DomainError, ErrorReason
from ortserve.units import human_bytes
from scheduler_service.convert import rejection_to_pb
from scheduler_service.ledger.ledger import Cause, Rejection


def rejection_error(rejection: Rejection) -> DomainError:
    """A REJECTED admission as the error Scheduler.Generate ends with.

    Every cause takes this one path, NO_WORKER included, so clients always find
    the Rejection detail (the Python client keys its exception on it).
    """
    numbers = {
        "prompt_tokens": rejection.prompt_tokens,
        "prompt_tokens_unknown": str(rejection.prompt_tokens_unknown).lower(),
        "min_new_tokens": rejection.min_new_tokens,
        "requested_max_new_tokens": rejection.requested_max_new_tokens,
        "admissible_max_new_tokens": rejection.admissible_max_new_tokens,
        "context_length": rejection.context_length,
        "needed_bytes": rejection.needed_bytes,
        "available_bytes": rejection.available_bytes,
        "capacity_bytes": rejection.capacity_bytes,
        "bytes_per_token": rejection.bytes_per_token,
        "cap_refused": str(rejection.cap_refused).lower(),
    }
    if rejection.cause in (Cause.QUEUE_FULL, Cause.QUEUE_TIMEOUT):
        numbers.update(queue_length=rejection.queue_length, max_queue_length=rejection.max_queue_length,
                       requests_ahead=rejection.requests_ahead, bytes_ahead=rejection.bytes_ahead,
                       waited_ms=round(rejection.waited_s * 1e3, 1),
                       max_queue_wait_ms=round(rejection.max_queue_wait_s * 1e3, 1))
    if rejection.cause is Cause.TENANT_RATE:
        numbers.update(tenant=rejection.tenant, tenant_requests_per_s=rejection.tenant_requests_per_s,
                       tenant_burst=rejection.tenant_burst)
    if rejection.cause is Cause.TENANT_QUOTA:
        numbers.update(tenant=rejection.tenant, tenant_quota_bytes=rejection.tenant_quota_bytes,
                       tenant_reserved_bytes=rejection.tenant_reserved_bytes)
    details: list[Message] = [rejection_to_pb(rejection)]
    field = ""
    if rejection.cause is Cause.CONTEXT_LENGTH_EXCEEDED:
        # The worker's choice of field too: the one the caller set that overflows.
        field = ContextWindowFull(rejection.prompt_tokens, rejection.requested_max_new_tokens,
                                  rejection.context_length, rejection.min_new_tokens).field
    if rejection.cause in (Cause.BUDGET_BUSY, Cause.EXCEEDS_CAPACITY, Cause.QUEUE_FULL,
                           Cause.QUEUE_TIMEOUT):
        details.append(rich_status.quota_failure(
            "kv_cache_bytes",
            f"needs {human_bytes(rejection.needed_bytes)}, {human_bytes(rejection.available_bytes)} "
            f"free of {human_bytes(rejection.capacity_bytes)}"))
    if rejection.cause is Cause.TENANT_RATE:
        details.append(rich_status.quota_failure(
            f"tenant/{rejection.tenant}/requests_per_s",
            f"{rejection.tenant_requests_per_s:g} requests/s, bursts of {rejection.tenant_burst:,}"))
    if rejection.cause is Cause.TENANT_QUOTA:
        details.append(rich_status.quota_failure(
            f"tenant/{rejection.tenant}/kv_cache_bytes",
            f"needs {human_bytes(rejection.needed_bytes)}, the tenant holds "
            f"{human_bytes(rejection.tenant_reserved_bytes)} of its "
            f"{human_bytes(rejection.tenant_quota_bytes)} quota"))
    return DomainError(
        ErrorReason(rejection.cause.name),
        f"rejected ({rejection.cause.value}): {rejection.message}; {rejection.remedy}",
        metadata=numbers, field=field, retry_after_s=rejection.retry_after_s, details=details)


def window_refused_prompt_tokens(error: grpc.aio.AioRpcError) -> int | None:
    """The prompt's length when a worker's Tokenize refused it for the context window
    (CONTEXT_LENGTH_EXCEEDED, its ErrorInfo carrying prompt_tokens); None for any other error.

    The scheduler then lets the ledger decide on that length, so the refusal is a
    REJECTED like any other: the Rejection in the details, counted in the metrics.
    """
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    if info is None or info.reason != ErrorReason.CONTEXT_LENGTH_EXCEEDED:
        return None
    try:
        return int(info.metadata["prompt_tokens"])
    except (KeyError, ValueError):
        return None
