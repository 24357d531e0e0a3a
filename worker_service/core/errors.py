"""Domain errors of the worker: each a reason (ortserve.errors.ErrorReason), a message
naming the cause, the numbers and a next step, and the numbers for programs.

Pure (no grpc): the engine raises these; the one error path maps the reasons
to status codes through the one table (ortserve.status_table).
"""

from __future__ import annotations

from ortserve.errors import DomainError, ErrorReason, quoted
from ortserve.units import human_bytes, tokens


class EngineError(DomainError):
    """Base of every error the worker raises or reports in a Failed event."""

    reason = ErrorReason.ENGINE_FAILED

    def __init__(self, message: str, field: str = "", **metadata) -> None:
        super().__init__(type(self).reason, message, metadata=metadata, field=field)


class InvalidRequest(EngineError):
    """A request field is malformed (INVALID_ARGUMENT); `.field` names it, e.g. "sampling.top_p"."""

    reason = ErrorReason.INVALID_REQUEST

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)


class ContextWindowFull(EngineError):
    """Prompt (+ max_new_tokens) does not fit the model's context window (INVALID_ARGUMENT)."""

    reason = ErrorReason.CONTEXT_LENGTH_EXCEEDED

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        if prompt_tokens >= context_length:
            field = "prompt"
            message = (
                f"the prompt is {tokens(prompt_tokens)} and fills the model's context window of "
                f"{tokens(context_length)}: a full context window is an error, not an empty turn; "
                f"shorten the prompt to at most {tokens(context_length - 1)}"
            )
        else:
            field = "max_new_tokens"
            room = context_length - prompt_tokens
            message = (
                f"the prompt is {tokens(prompt_tokens)} and max_new_tokens {max_new_tokens:,} "
                f"need {tokens(prompt_tokens + max_new_tokens)}, beyond the model's context window "
                f"of {tokens(context_length)}; lower max_new_tokens to {room:,} or shorten the prompt"
            )
        super().__init__(message, field=field, prompt_tokens=prompt_tokens,
                         max_new_tokens=max_new_tokens, context_length=context_length)


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
            "running sequences finish, lower max_new_tokens, or raise --kv-budget"
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


class LeaseMismatch(EngineError):
    """The request is not the one the lease was admitted for (FAILED_PRECONDITION).

    The refused call leaves the lease as it was: a corrected retry can use it.
    """

    reason = ErrorReason.LEASE_MISMATCH

    def __init__(self, field: str, message: str, lease_id: str) -> None:
        super().__init__(f"{field}: {message}", field=field, lease_id=lease_id)


class NoLiveLease(EngineError):
    """Generate without a lease that is live for this worker (NOT_FOUND)."""

    reason = ErrorReason.LEASE_NOT_FOUND

    def __init__(self, lease_id: str, worker_id: str, detail: str) -> None:
        super().__init__(f"worker {worker_id} serves only admitted requests: {detail}",
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
