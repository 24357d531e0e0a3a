"""Domain errors of the worker: each a reason (ortserve.status.errors.ErrorReason), a message
naming the cause, the numbers and a next step, and the numbers for programs.

Pure (no grpc): the engine raises these; the one error path maps the reasons
to status codes through the one table (ortserve.status.status_table).
"""

from __future__ import annotations

from ortserve.status.errors import (  # noqa: F401 - ContextWindowFull, LeaseMismatch: the rules' own
    ContextWindowFull,
    DomainError,
    ErrorReason,
    InvalidField,
    LeaseMismatch,
    quoted,
)
from ortserve.status.units import human_bytes


class EngineError(DomainError):
    """Base of every error the worker raises or reports in a Failed event."""

    reason = ErrorReason.ENGINE_FAILED

    def __init__(self, message: str, field: str = "", **metadata) -> None:
        super().__init__(type(self).reason, message, metadata=metadata, field=field)


class InvalidWorkerField(EngineError, InvalidField):
    """A worker-only field is malformed (INVALID_ARGUMENT): the chat template, a session
    on a layout without sessions. An InvalidField like every request rule's error
    (ortserve.rules.request_rules), and an EngineError like the worker's other errors."""

    reason = ErrorReason.INVALID_REQUEST

    def __init__(self, field: str, message: str) -> None:
        # NOTE: DomainError's own init: InvalidField's takes other arguments.
        DomainError.__init__(self, ErrorReason.INVALID_REQUEST, f"{field}: {message}",
                             metadata={"field": field}, field=field)


class CapacityExceeded(EngineError):
    """Reserving a sequence's KV would exceed the worker's capacity (RESOURCE_EXHAUSTED)."""

    reason = ErrorReason.WORKER_KV_FULL

    def __init__(self, needed_bytes: int, held_bytes: int, capacity_bytes: int,
                 detail: str = "") -> None:
        self.needed_bytes = needed_bytes
        self.held_bytes = held_bytes
        self.capacity_bytes = capacity_bytes
        free_bytes = max(capacity_bytes - held_bytes, 0)
        message = (
            f"the sequence needs {human_bytes(needed_bytes)} of KV cache ({needed_bytes:,} bytes)"
            f"{' for ' + detail if detail else ''}; this worker holds {human_bytes(held_bytes)} "
            f"of {human_bytes(capacity_bytes)} ({human_bytes(free_bytes)} free); retry when "
            "running sequences finish, lower max_new_tokens, or raise --kv-capacity"
        )
        super().__init__(message, needed_bytes=needed_bytes, held_bytes=held_bytes,
                         capacity_bytes=capacity_bytes)


class DeviceUnavailable(EngineError):
    """The requested device cannot be used (raised at start-up); the message names what is missing."""


class ModelLoadError(EngineError):
    """A model folder is missing files or has a graph the engine cannot serve."""


class ConfigError(EngineError):
    """A worker setting that cannot work (raised at start-up, naming the flag)."""


class LeaseInUse(EngineError):
    """A second stream on a lease whose sequence is already running (FAILED_PRECONDITION)."""

    reason = ErrorReason.LEASE_MISMATCH

    def __init__(self, lease_id: str) -> None:
        super().__init__(f"lease {quoted(lease_id)} already has a sequence on this worker; a "
                         "lease serves one request: get another from Scheduler.Admit",
                         lease_id=lease_id)


class NoLiveLease(EngineError):
    """Generate without a lease that is live for this worker (NOT_FOUND)."""

    reason = ErrorReason.LEASE_NOT_FOUND

    def __init__(self, lease_id: str, worker_id: str, detail: str) -> None:
        super().__init__(f"worker {worker_id} serves only admitted requests: {detail}",
                         lease_id=lease_id, worker_id=worker_id)


class LeaseNotRestored(EngineError):
    """The scheduler did not take this running sequence's lease back when the worker
    re-registered, so the worker stops it rather than hold KV the ledger does not charge
    (NOT_FOUND, reason LEASE_NOT_FOUND)."""

    reason = ErrorReason.LEASE_NOT_FOUND

    def __init__(self, lease_id: str, worker_id: str) -> None:
        super().__init__(f"worker {worker_id} re-registered with the scheduler and the ledger did "
                         f"not take back lease {quoted(lease_id)} (it would exceed the worker's "
                         "registered capacity), so the worker stopped this sequence to hold no "
                         "KV the ledger does not charge; retry the request",
                         lease_id=lease_id, worker_id=worker_id)


class SchedulerUnreachable(EngineError):
    """The scheduler could not be asked about the lease (UNAVAILABLE: retry)."""

    reason = ErrorReason.NOT_READY

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_after_s = 1.0


class NotReady(EngineError):
    """The worker is still loading its model (UNAVAILABLE: retry when SERVING)."""

    reason = ErrorReason.NOT_READY

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_after_s = 1.0
