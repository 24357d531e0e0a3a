"""The admission queue's wait, on the server's event loop: a queued request's news (each
changed Place, then its Admission) and every exit leaving the queue holding nothing.

Generate, Admit and SessionTurn submit through QueueWaiter.submit and wait out a Ticket
with AdmissionWait, written once here: Generate and SessionTurn send its Places on as
Queued events, Admit passes them over. The queue's pure policy is ledger/queue.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from scheduler_service.ledger.queue import (
    AdmissionQueue,
    Mode,
    Place,
    Ticket,
    queue_deadline_exceeded,
)
from scheduler_service.ledger.types import AdmissionDecision, AdmissionRequest

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

    def submit(self, request: AdmissionRequest, mode: Mode, wait_s: float | None,
               deadline_s: float | None, lease_id: str = "") -> AdmissionDecision | Ticket:
        """The queue's first answer (AdmissionQueue.submit): an Admission now, or a Ticket,
        after which the queue is served at once: its order (priority, tenant share) may
        place the newcomer right away."""
        answer = self.queue.submit(request, mode, wait_s=wait_s, deadline_s=deadline_s,
                                   lease_id=lease_id)
        if isinstance(answer, Ticket):
            self.kick()
        return answer

    def kick(self) -> None:
        """Bytes may have freed up (or waits run out): serve the queue and wake its waiters."""
        done = self.queue.pump()
        if done:
            self._on_decided(done)
        # Every waiter looks again: the decided ones for their outcome, the rest for a new place.
        for event in self._events.values():
            event.set()

    async def next(self, ticket: Ticket) -> Place | AdmissionDecision:
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
            await _wake(event, min(PLACE_INTERVAL_S, ticket.deadline - now))

    async def news(self, ticket: Ticket, bound: Any) -> AsyncIterator[Place | AdmissionDecision]:
        """A queued request's news: each changed Place, then its Admission, last.

        Generate sends the Places on as Queued events, Admit skips them. An exit
        before the Admission (cancelled, deadline, an error) leaves the queue
        holding nothing: iterate under contextlib.aclosing, so that happens at once.
        """
        admission = None
        try:
            while not isinstance(item := await self.next(ticket), AdmissionDecision):
                yield item
            admission = item
        finally:
            if admission is None:
                bound.info("left the queue unserved", freed_bytes=self.leave(ticket))
            else:
                self.forget(ticket)
        yield admission

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


async def _wake(event: asyncio.Event, timeout_s: float) -> None:
    """Wait for `event` or `timeout_s`, whichever first; a cancel of the waiting task always
    propagates (the caller's connection is gone: the ticket must leave the queue now).

    NOTE: not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives in the
    same loop pass as the event (a kick() right before the client's connection dropped):
    return fut.result() instead of raising. The waiter would then loop on, holding its
    place until admitted (a SIGKILLed client's ticket stays queued). asyncio.timeout
    counts cancels (Task.cancelling), so a caller's cancel is never taken for the timeout.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        # A cancel some other await swallowed: the caller is gone all the same.
        raise asyncio.CancelledError("the caller cancelled while queued")


class AdmissionWait:
    """One request from the queue's first answer to its Admission: the answer itself when
    the queue decided at once, else its Ticket waited out (each changed Place, then the
    Admission).

    Iterate `places()` under contextlib.aclosing and read `admission` after it (Generate
    and SessionTurn send each Place on as a Queued event), or await `decided()` (Admit:
    the Places go by unsent). An exit before the Admission leaves the queue holding
    nothing (QueueWaiter.news).
    """

    def __init__(self, waiter: QueueWaiter, answer: AdmissionDecision | Ticket, bound: Any,
                 queued_line: str | None = "queued") -> None:
        self._waiter = waiter
        self._bound = bound  # the structlog logger bound to the request
        self._queued_line = queued_line  # the log line when it joins the queue; None: none
        self.ticket = answer if isinstance(answer, Ticket) else None
        self.admission: AdmissionDecision | None = None if self.ticket is not None else answer
        self.queued_perf_s: float | None = None  # perf_counter() when it joined the queue

    async def places(self) -> AsyncIterator[Place]:
        """Each changed Place while the request waits; `admission` is set when it ends."""
        ticket = self.ticket
        if ticket is None:
            return
        self.queued_perf_s = time.perf_counter()
        if self._queued_line is not None:
            self._bound.info(self._queued_line, needed_bytes=ticket.needed_bytes,
                             mode=ticket.mode.value, max_wait_s=round(ticket.max_wait_s, 3),
                             bound=ticket.bound.value)
        async with contextlib.aclosing(self._waiter.news(ticket, self._bound)) as news:
            async for item in news:
                if isinstance(item, Place):
                    yield item
                else:
                    self.admission = item

    async def decided(self) -> AdmissionDecision:
        """The Admission, the Places passed over unsent."""
        async with contextlib.aclosing(self.places()) as places:
            async for _place in places:
                pass
        assert self.admission is not None  # news ends with the Admission or raises
        return self.admission

    @property
    def granted_untaken(self) -> AdmissionDecision | None:
        """What the queue granted as its caller left, before the caller took it (None: the
        caller took its Admission, or the queue granted nothing)."""
        if self.admission is None and self.ticket is not None:
            return self.ticket.outcome
        return None
