"""One table: a rejection cause -> its gRPC status code and rich details."""

from __future__ import annotations

import grpc
from google.protobuf.message import Message

from ortserve import rich_status
from ortserve.units import human_bytes

from .budget import Cause, Rejection
from .convert import rejection_to_pb

STATUS_OF_CAUSE = {
    Cause.CONTEXT_LENGTH_EXCEEDED: grpc.StatusCode.INVALID_ARGUMENT,
    Cause.EXCEEDS_CAPACITY: grpc.StatusCode.FAILED_PRECONDITION,
    Cause.BUDGET_BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Cause.NO_WORKER: grpc.StatusCode.UNAVAILABLE,
}


def rejection_status(rejection: Rejection) -> tuple[grpc.StatusCode, str, list[Message]]:
    """(code, message, details) for a rejection, as Scheduler.Generate ends with it."""
    code = STATUS_OF_CAUSE[rejection.cause]
    message = f"rejected ({rejection.cause.value}): {rejection.message}; {rejection.remedy}"
    numbers = {
        "prompt_tokens": rejection.prompt_tokens,
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
    details: list[Message] = [
        rejection_to_pb(rejection),
        rich_status.error_info(rejection.cause.name, numbers),
    ]
    if rejection.cause is Cause.CONTEXT_LENGTH_EXCEEDED:
        field = "max_new_tokens" if rejection.prompt_tokens < rejection.context_length else "prompt"
        details.append(rich_status.bad_request(field, rejection.message))
    if rejection.cause in (Cause.BUDGET_BUSY, Cause.EXCEEDS_CAPACITY):
        details.append(rich_status.quota_failure(
            "kv_cache_bytes",
            f"needs {human_bytes(rejection.needed_bytes)}, {human_bytes(rejection.available_bytes)} "
            f"free of {human_bytes(rejection.capacity_bytes)}",
        ))
    if rejection.retry_after_s:
        details.append(rich_status.retry_info(rejection.retry_after_s))
    return code, message, details
