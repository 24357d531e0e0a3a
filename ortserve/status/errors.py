"""Domain errors shared by every ortserve service: a reason, a message, the numbers.

Pure (no grpc import): cores raise these, and each service's one error path
(`ortserve.rpc.error_path`) maps `reason` to a status code through its own table.
The reason strings are the google.rpc.ErrorInfo reasons clients key on, so
they are part of the API: add, never rename.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from ortserve.status.units import tokens

# An echoed caller string (a lease id, a role) is clipped to this: a 5,000-char
# id echoed whole into a status overflows gRPC's metadata limit.
ECHO_LIMIT = 64
# In ErrorInfo metadata and BadRequest field paths, where a program reads them, an echo
# is clipped to this: the longest lease and worker id a request may carry (128 chars,
# ortserve.rules.request_rules) comes back whole, so a client can match it.
METADATA_ECHO_LIMIT = 128
# A whole status message is clipped to this; messages plus details stay far
# below gRPC's 8 KiB metadata soft limit.
MESSAGE_LIMIT = 1_000


class ErrorReason(enum.StrEnum):
    """google.rpc.ErrorInfo.reason values (domain "ortserve.v1")."""

    INVALID_REQUEST = "INVALID_REQUEST"  # a field is malformed or out of range
    CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"  # prompt (+ new tokens) beyond the window
    EXCEEDS_CAPACITY = "EXCEEDS_CAPACITY"  # beyond any worker's whole KV capacity
    BUDGET_BUSY = "BUDGET_BUSY"  # the budget is held by others now; retry
    NO_WORKER = "NO_WORKER"  # no worker registered / answering; retry
    WORKER_KV_FULL = "WORKER_KV_FULL"  # a worker could not allocate what the lease promised
    LEASE_NOT_FOUND = "LEASE_NOT_FOUND"  # released, expired, or another worker's
    LEASE_MISMATCH = "LEASE_MISMATCH"  # the request differs from what the lease admitted
    LEASE_CLAIMED = "LEASE_CLAIMED"  # a worker serves it: only that worker may release it
    WORKER_ID_IN_USE = "WORKER_ID_IN_USE"  # another live worker registered under this id
    NOT_READY = "NOT_READY"  # the service is starting (model loading, not registered)
    WORKER_FAILED = "WORKER_FAILED"  # the worker serving the request failed mid-stream
    ENGINE_FAILED = "ENGINE_FAILED"  # the worker's engine hit an error it could not recover
    INTERNAL = "INTERNAL"  # a bug: logged with a traceback on the server
    QUEUE_FULL = "QUEUE_FULL"  # the admission queue holds its maximum of waiting requests; retry
    QUEUE_TIMEOUT = "QUEUE_TIMEOUT"  # waited the server's (or caller's) maximum; retry
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"  # the caller's own deadline passed while it waited
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"  # no such session (closed, expired or never opened)
    SESSION_BUSY = "SESSION_BUSY"  # a turn of this session is running: turns go one at a time
    SESSION_WORKER_LOST = "SESSION_WORKER_LOST"  # the session's worker died: its KV is gone
    API_KEY_MISSING = "API_KEY_MISSING"  # keys are configured and the call carried none
    API_KEY_UNKNOWN = "API_KEY_UNKNOWN"  # the call's key is not one the server knows
    ROLE_REQUIRED = "ROLE_REQUIRED"  # the key is known but lacks the role the RPC needs
    LEASE_SECRET_MISMATCH = "LEASE_SECRET_MISMATCH"  # Release without the secret Admit gave
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"  # no registered worker serves the request's model
    TENANT_QUOTA = "TENANT_QUOTA"  # the caller's tenant holds its KV quota; retry (or fewer tokens)
    TENANT_RATE = "TENANT_RATE"  # the caller's tenant started its requests_per_s; retry
    ADAPTER_NO_ROOM = "ADAPTER_NO_ROOM"  # a LoRA adapter's bytes do not fit the free KV now
    ADAPTER_BUSY = "ADAPTER_BUSY"  # sequences run under the adapter being unloaded
    # The caller's admitted lease is gone from the worker serving it (the scheduler restarted
    # without it, or it expired): not the caller's fault; admit again.
    LEASE_LOST = "LEASE_LOST"
    # Time (docs/features/time-budget.md): one more stream would pass a latency goal and the
    # wait would pass the request's TTFT goal or deadline; retry after the estimated wait.
    TIME_BUSY = "TIME_BUSY"
    TIME_GOAL_UNREACHABLE = "TIME_GOAL_UNREACHABLE"  # a gap goal below one stream's step


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """`value` as text, at most `limit` characters (an ellipsis and the full length if cut)."""
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text):,} chars)"


def quoted(value: object, limit: int = ECHO_LIMIT) -> str:
    """An echoed caller string, clipped and quoted, for messages: 'abc...(5,000 chars)'."""
    return repr(clip(value, limit))


class DomainError(Exception):
    """An error with a stable reason, a readable message and its numbers.

    `metadata` holds the numbers (ErrorInfo metadata), `field` a proto path
    such as "sampling.top_p" or "chat.messages[2].role" (BadRequest),
    `retry_after_s` a suggested wait (RetryInfo), `details` further protobuf
    messages to attach (e.g. an ortserve.v1.Rejection).
    """

    def __init__(self, reason: ErrorReason, message: str, *,
                 metadata: Mapping[str, Any] | None = None, field: str = "",
                 retry_after_s: float = 0.0, details: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.field = field
        self.retry_after_s = retry_after_s
        self.details = tuple(details)


class InvalidField(DomainError, ValueError):
    """A request field is malformed (INVALID_REQUEST); also a ValueError for pure callers."""

    def __init__(self, field: str, message: str, **numbers: Any) -> None:
        super().__init__(ErrorReason.INVALID_REQUEST, f"{field}: {message}",
                         metadata={"field": field, **numbers}, field=field)


class ContextWindowFull(DomainError):
    """Prompt (+ new tokens) does not fit the model's context window (CONTEXT_LENGTH_EXCEEDED).

    One sentence for both services: `cause` and `remedy` apart (the scheduler's
    Rejection carries them apart), `message` the two joined. `field` names what
    overflows, a field the caller set: the prompt when it alone fills the window,
    else min_new_tokens when the prompt and that floor do not fit, else
    max_new_tokens (a provisional ceiling, when unset, always fits: only a floor
    can push it past the window, and then the floor is named).
    """

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context_length: int,
                 min_new_tokens: int = 0) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        self.min_new_tokens = min_new_tokens
        p, c, m = prompt_tokens, context_length, min_new_tokens
        floor = max(m, 1)
        if p >= c:
            self.field = "prompt"
            self.cause = (f"the prompt is {tokens(p)} and fills the model's context window "
                          f"of {tokens(c)}: a full context window is an error, not an empty turn")
            self.remedy = (f"shorten the prompt to at most {tokens(c - floor)}"
                           + (" or lower min_new_tokens" if m > 1 else "") if c - floor >= 1
                           else f"shorten the prompt, and lower min_new_tokens below {c:,}")
        elif p + m > c:
            self.field = "min_new_tokens"
            self.cause = (f"the prompt is {tokens(p)} and min_new_tokens {m:,} need "
                          f"{tokens(p + m)}, beyond the model's context window of {tokens(c)}")
            self.remedy = (f"lower min_new_tokens to at most {c - p:,}"
                           + (f" or shorten the prompt to at most {tokens(c - m)}" if c - m >= 1
                              else ""))
        else:
            self.field = "max_new_tokens"
            self.cause = (f"the prompt is {tokens(p)} and max_new_tokens {max_new_tokens:,} need "
                          f"{tokens(p + max_new_tokens)}, beyond the model's context window of "
                          f"{tokens(c)}")
            self.remedy = (f"lower max_new_tokens to {c - p:,} (or leave it unset for the "
                           "remaining window) or shorten the prompt")
        super().__init__(ErrorReason.CONTEXT_LENGTH_EXCEEDED, f"{self.cause}; {self.remedy}",
                         field=self.field, metadata={
                             "prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens,
                             "min_new_tokens": min_new_tokens, "context_length": context_length})


class LeaseMismatch(DomainError):
    """The request is not the one its lease was admitted for (LEASE_MISMATCH).

    A refused request leaves the lease as it was: a corrected retry can use it.
    """

    def __init__(self, field: str, message: str, lease_id: str, **numbers: Any) -> None:
        super().__init__(ErrorReason.LEASE_MISMATCH, f"{field}: {message}", field=field,
                         metadata={"lease_id": lease_id, **numbers})
