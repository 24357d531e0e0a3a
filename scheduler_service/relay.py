"""The servicer's side of the admission queue: await a ticket, report its place, leave cleanly.

asyncio only (no grpc). Everything runs on the server's event loop; the pure
policy is in admission_queue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from scheduler_service.ledger.ledger import Admission
from scheduler_service.ledger.queue import AdmissionQueue, Place, Ticket, queue_deadline_exceeded

# NOTE: a Queued event at most this often per request: enough to watch a
# queue move, not enough to flood a stream of 256 waiters.
PLACE_INTERVAL_S = 0.25


class QueueWaiter:
    """Wakes tickets when the queue moves; every exit leaves the queue holding nothing."""

    def __init__(self, queue: AdmissionQueue, clock: Callable[[], float],
                 on_decided: Callable[[list[Ticket]], None] = lambda done: None) -> None:
        self.queue = queue
        self._clock = clock
        self._on_decided = on_decided
        self._events: dict[int, asyncio.Event] = {}
        self._sent: dict[int, tuple[int, float]] = {}  # seq -> (position sent, when)

    def kick(self) -> None:
        """Bytes may have freed up (or waits run out): serve the queue and wake its waiters."""
        done = self.queue.pump()
        if done:
            self._on_decided(done)
        # Every waiter looks again: the decided ones for their outcome, the rest for a new place.
        for event in self._events.values():
            event.set()

    async def next(self, ticket: Ticket) -> Place | Admission:
        """The ticket's next news: a changed Place (rate-limited) or its final Admission.

        Raises the DomainError for the caller's own deadline passing.
        """
        event = self._events.setdefault(ticket.seq, asyncio.Event())
        while True:
            if ticket.outcome is not None:
                return ticket.outcome
            if ticket.deadline_exceeded:
                raise queue_deadline_exceeded(ticket)
            now = self._clock()
            if now >= ticket.deadline:
                self.kick()  # pump ends the wait: an outcome or deadline_exceeded, never neither
                continue
            place = self.queue.place(ticket)
            sent_position, sent_at = self._sent.get(ticket.seq, (0, -PLACE_INTERVAL_S))
            if place is not None and place.position != sent_position and now - sent_at >= PLACE_INTERVAL_S:
                self._sent[ticket.seq] = (place.position, now)
                return place
            event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=min(PLACE_INTERVAL_S, ticket.deadline - now))

    def leave(self, ticket: Ticket) -> int:
        """The caller will not take the outcome (cancelled, deadline, error): hold nothing.

        Returns the bytes released (a lease the queue granted in the meantime).
        """
        self._events.pop(ticket.seq, None)
        self._sent.pop(ticket.seq, None)
        freed = 0
        if not self.queue.cancel(ticket):
            lease = ticket.outcome.lease if ticket.outcome is not None else None
            if lease is not None:
                freed = self.queue.ledger.release_unclaimed(lease.lease_id)
        self.kick()  # the head may have been the one blocking: the next one may fit now
        return freed

    def forget(self, ticket: Ticket) -> None:
        """The caller took the outcome: drop the bookkeeping."""
        self._events.pop(ticket.seq, None)
        self._sent.pop(ticket.seq, None)
