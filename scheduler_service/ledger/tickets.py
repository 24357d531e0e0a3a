"""A request waiting in the admission queue, and what the queue says of it (pure).

`Ticket` is one waiting request; `Mode` what it waits for, `Bound` which
limit ends its wait; `Place` where it stands (the Queued event);
`QueueStats` / `TenantQueueStats` the queue's look for metrics and status;
`queue_deadline_exceeded` the error when the call's own deadline ends a wait.
The queue's policy is queue.py's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ortserve.status.errors import DomainError, ErrorReason
from ortserve.status.units import human_bytes, tokens
from scheduler_service.ledger.types import AdmissionDecision, AdmissionRequest


class Mode(enum.Enum):
    """What a waiting request waits for (from its cap policy)."""

    ALLOW = "allow"  # its floor; then ADMITTED or CAPPED to what fits
    STRICT = "strict"  # its whole reservation; never capped
    WAIT_FULL = "wait_full"  # its whole reservation; capped only when the wait runs out


class Bound(enum.Enum):
    """Which limit ends a request's wait."""

    SERVER = "server"  # --max-queue-wait-s
    CALLER = "caller"  # the caller's own max_queue_wait_ms
    DEADLINE = "deadline"  # the call's gRPC deadline


@dataclass(eq=False)
class Ticket:
    """One waiting request. `outcome` is set once it leaves the queue decided."""

    seq: int
    request: AdmissionRequest
    mode: Mode
    needed_bytes: int  # what it waits for: its floor, or its whole reservation
    enqueued_at: float
    deadline: float
    bound: Bound
    outcome: AdmissionDecision | None = None
    deadline_exceeded: bool = False  # the call's own deadline ended the wait
    # A session turn's: the lease it grows on its own worker (Ledger.resize), not a new one.
    lease_id: str = ""

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.deadline_exceeded

    @property
    def max_wait_s(self) -> float:
        return self.deadline - self.enqueued_at


def queue_deadline_exceeded(ticket: Ticket) -> DomainError:
    """The call's own deadline ended the wait (`ticket.deadline_exceeded`): nothing is held."""
    waited = ticket.max_wait_s
    return DomainError(
        ErrorReason.DEADLINE_EXCEEDED,
        f"the call's deadline passed after {waited:.1f} s in the admission queue: "
        f"{human_bytes(ticket.needed_bytes)} of KV (prompt {tokens(ticket.request.prompt_tokens)}) "
        "did not free up in time; nothing is held; retry with a later deadline, or allow a cap "
        "(cap policy ALLOW), or add workers",
        metadata={"waited_ms": round(waited * 1e3, 1), "needed_bytes": ticket.needed_bytes,
                  "prompt_tokens": ticket.request.prompt_tokens})


@dataclass(frozen=True)
class Place:
    """Where a ticket stands, for the Queued event."""

    position: int  # 1-based
    requests_ahead: int
    bytes_ahead: int
    needed_bytes: int
    waited_s: float
    max_wait_s: float
    queue_length: int


@dataclass(frozen=True)
class QueueStats:
    length: int
    oldest_wait_s: float
    waiting_bytes: int
    max_length: int
    max_wait_s: float


@dataclass(frozen=True)
class TenantQueueStats:
    """One tenant's waiting requests for one model."""

    length: int = 0
    waiting_bytes: int = 0


@dataclass(frozen=True)
class ModelQueueStats:
    """One model's waiting requests and the LoRA adapters they name (sorted, each once)."""

    length: int = 0
    adapters: tuple[str, ...] = ()
