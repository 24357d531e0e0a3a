"""The one table: a domain error's reason -> its gRPC status code, for every service.

`ortserve.status.errors.ErrorReason` promises one meaning per reason, so a reason has
one code whichever service answers (the scheduler, a worker, the auth
interceptor in front of either); `ortserve.rpc.error_path` applies this table and
takes no other. A reason that had to differ by service would say why here; none
does today.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import grpc

from ortserve.status.errors import ErrorReason

S = grpc.StatusCode

STATUS_OF_REASON: Mapping[ErrorReason, grpc.StatusCode] = MappingProxyType({
    # The caller must change the request.
    ErrorReason.INVALID_REQUEST: S.INVALID_ARGUMENT,
    ErrorReason.CONTEXT_LENGTH_EXCEEDED: S.INVALID_ARGUMENT,
    # The system as it is can never serve it (more than any worker's whole capacity).
    ErrorReason.EXCEEDS_CAPACITY: S.FAILED_PRECONDITION,
    # Busy now: a retry can succeed (with RetryInfo where the server knows when).
    ErrorReason.BUDGET_BUSY: S.RESOURCE_EXHAUSTED,
    ErrorReason.QUEUE_FULL: S.RESOURCE_EXHAUSTED,
    ErrorReason.QUEUE_TIMEOUT: S.RESOURCE_EXHAUSTED,
    # A per-caller quota is what RESOURCE_EXHAUSTED names (RetryInfo when waiting cures it).
    ErrorReason.TENANT_QUOTA: S.RESOURCE_EXHAUSTED,
    ErrorReason.TENANT_RATE: S.RESOURCE_EXHAUSTED,
    # Time as bytes: busy now (a wait cures it) is RESOURCE_EXHAUSTED with RetryInfo, a
    # goal the system can never meet (EXCEEDS_CAPACITY's kind) is FAILED_PRECONDITION.
    ErrorReason.TIME_BUSY: S.RESOURCE_EXHAUSTED,
    ErrorReason.TIME_GOAL_UNREACHABLE: S.FAILED_PRECONDITION,
    ErrorReason.WORKER_KV_FULL: S.RESOURCE_EXHAUSTED,
    ErrorReason.ADAPTER_NO_ROOM: S.RESOURCE_EXHAUSTED,
    ErrorReason.DEADLINE_EXCEEDED: S.DEADLINE_EXCEEDED,
    ErrorReason.NO_WORKER: S.UNAVAILABLE,
    ErrorReason.NOT_READY: S.UNAVAILABLE,
    ErrorReason.WORKER_FAILED: S.UNAVAILABLE,
    # A lease admitted to this caller, lost on the way (a scheduler restart): the system's
    # failure, retryable, never the NOT_FOUND that reads as "no such route or model".
    ErrorReason.LEASE_LOST: S.UNAVAILABLE,
    # NOTE: the worker once answered FAILED_PRECONDITION here; the lease does not
    # exist (released, expired, another worker's), so NOT_FOUND on both services,
    # as SESSION_NOT_FOUND already was. Neither is retryable as is: admit again.
    ErrorReason.LEASE_NOT_FOUND: S.NOT_FOUND,
    ErrorReason.SESSION_NOT_FOUND: S.NOT_FOUND,
    # The request names a model no worker serves: the caller must name a served one.
    ErrorReason.MODEL_NOT_FOUND: S.NOT_FOUND,
    # The thing exists but is in the wrong state for this call.
    ErrorReason.LEASE_MISMATCH: S.FAILED_PRECONDITION,
    ErrorReason.LEASE_CLAIMED: S.FAILED_PRECONDITION,
    ErrorReason.SESSION_BUSY: S.FAILED_PRECONDITION,
    ErrorReason.ADAPTER_BUSY: S.FAILED_PRECONDITION,
    ErrorReason.SESSION_WORKER_LOST: S.FAILED_PRECONDITION,
    ErrorReason.WORKER_ID_IN_USE: S.ALREADY_EXISTS,
    # Who is calling.
    ErrorReason.API_KEY_MISSING: S.UNAUTHENTICATED,
    ErrorReason.API_KEY_UNKNOWN: S.UNAUTHENTICATED,
    ErrorReason.ROLE_REQUIRED: S.PERMISSION_DENIED,
    ErrorReason.LEASE_SECRET_MISMATCH: S.PERMISSION_DENIED,
    # Bugs and failures the caller cannot fix (logged with a traceback).
    ErrorReason.ENGINE_FAILED: S.INTERNAL,
    ErrorReason.INTERNAL: S.INTERNAL,
})


def status_of(reason: ErrorReason) -> grpc.StatusCode:
    """The code `reason` is answered with (INTERNAL for a reason missing here: a bug the
    table test catches)."""
    return STATUS_OF_REASON.get(reason, S.INTERNAL)
