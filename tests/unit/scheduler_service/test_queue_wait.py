"""QueueWaiter and AdmissionWait: a queued request waited out to its Admission (its Places
sent on or passed over), and a caller's cancel always takes its ticket out of the queue."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import structlog

from scheduler_service.ledger.ledger import AdmissionRequest, Decision, Ledger, WorkerGeometry
from scheduler_service.ledger.queue import AdmissionQueue, Mode, Ticket
from scheduler_service.queue_wait import AdmissionWait, QueueWaiter

BPT = 1_000


def full_queue() -> tuple[QueueWaiter, list]:
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(WorkerGeometry(worker_id="w1", address="w1:1", model="m", context_length=4_096,
                                   bytes_per_token=BPT, capacity_bytes=200 * BPT))
    queue = AdmissionQueue(ledger, max_length=8, max_wait_s=60.0)
    held = [queue.submit(AdmissionRequest(f"h{i}", prompt_tokens=50, max_new_tokens=50,
                                          min_new_tokens=50)) for i in range(2)]
    assert all(h.decision is Decision.ADMITTED for h in held)
    return QueueWaiter(queue, time.monotonic), held


async def wait_queued(waiter: QueueWaiter, ticket: Ticket) -> None:
    async with contextlib.aclosing(waiter.news(ticket, structlog.get_logger("test"))) as news:
        async for _ in news:
            pass


@pytest.mark.parametrize("kick_first", [True, False])
def test_a_cancel_in_the_same_loop_pass_as_a_kick_still_leaves_the_queue(kick_first):
    # Python 3.11's asyncio.wait_for returned the event's result instead of raising when
    # the cancel and the wake-up met in one loop pass: the waiter stayed queued.
    async def main() -> None:
        waiter, _ = full_queue()
        ticket = waiter.queue.submit(AdmissionRequest("w", prompt_tokens=50, max_new_tokens=50,
                                                      min_new_tokens=50))
        assert isinstance(ticket, Ticket)
        task = asyncio.create_task(wait_queued(waiter, ticket))
        for _ in range(5):
            await asyncio.sleep(0)  # the waiter is parked on its event
        if kick_first:
            waiter.kick()
            task.cancel()
        else:
            task.cancel()
            waiter.kick()
        await asyncio.wait({task}, timeout=2.0)  # the waiter wakes every 0.25 s at most
        assert task.done() and task.cancelled()
        assert len(waiter.queue) == 0 and waiter.queue.stats().waiting_bytes == 0

    asyncio.run(main())


def test_a_cancelled_waiter_holds_nothing_even_when_it_was_just_admitted():
    async def main() -> None:
        waiter, held = full_queue()
        ticket = waiter.queue.submit(AdmissionRequest("w", prompt_tokens=50, max_new_tokens=50,
                                                      min_new_tokens=50))
        task = asyncio.create_task(wait_queued(waiter, ticket))
        await asyncio.sleep(0.01)
        waiter.queue.ledger.release(held[0].lease.lease_id)
        waiter.kick()  # the ticket is admitted in this pass ...
        task.cancel()  # ... and its caller is gone in the same one
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert waiter.queue.ledger.reserved_bytes() == 100 * BPT  # only the other holder's
        assert len(waiter.queue) == 0

    asyncio.run(main())


class Lines:
    """A logger that keeps its lines (event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, event: str, **fields) -> None:
        self.lines.append((event, fields))


def submit_waiting(waiter: QueueWaiter) -> Ticket:
    """A request that must wait behind full_queue's holders, through QueueWaiter.submit."""
    ticket = waiter.submit(AdmissionRequest("w", prompt_tokens=50, max_new_tokens=50,
                                            min_new_tokens=50), Mode.ALLOW, wait_s=None,
                           deadline_s=None)
    assert isinstance(ticket, Ticket)
    return ticket


def test_an_answer_decided_at_once_is_the_admission_with_no_wait():
    async def main() -> None:
        ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
        ledger.register(WorkerGeometry(worker_id="w1", address="w1:1", model="m",
                                       context_length=4_096, bytes_per_token=BPT,
                                       capacity_bytes=200 * BPT))
        waiter = QueueWaiter(AdmissionQueue(ledger, max_length=8, max_wait_s=60.0), time.monotonic)
        answer = waiter.submit(AdmissionRequest("now", prompt_tokens=50, max_new_tokens=50),
                               Mode.ALLOW, wait_s=None, deadline_s=None)
        lines = Lines()
        wait = AdmissionWait(waiter, answer, lines)
        assert [p async for p in wait.places()] == []
        assert wait.admission is answer and answer.decision is Decision.ADMITTED
        assert wait.queued_perf_s is None and lines.lines == []  # no queue: no line, no span
        assert await AdmissionWait(waiter, answer, lines).decided() is answer

    asyncio.run(main())


@pytest.mark.parametrize("queued_line", ["queued", "turn queued", None])
def test_a_queued_request_is_submitted_kicked_logged_and_waited_out_to_its_admission(queued_line):
    async def main() -> None:
        waiter, held = full_queue()
        ticket = submit_waiting(waiter)
        lines = Lines()
        wait = AdmissionWait(waiter, ticket, lines, queued_line=queued_line)
        places = []

        async def follow() -> None:
            async with contextlib.aclosing(wait.places()) as news:
                async for place in news:
                    places.append(place)

        task = asyncio.create_task(follow())
        while not places:  # its first Place, before anything frees up
            await asyncio.sleep(0.01)
        assert wait.admission is None and wait.queued_perf_s is not None
        waiter.queue.ledger.release(held[0].lease.lease_id)
        waiter.kick()
        await asyncio.wait_for(task, timeout=5.0)
        assert places[0].position == 1 and places[0].needed_bytes == 100 * BPT
        assert wait.admission is ticket.outcome and wait.admission.decision is Decision.ADMITTED
        assert wait.granted_untaken is None  # taken by its caller
        expected = [] if queued_line is None else [(queued_line, {
            "needed_bytes": 100 * BPT, "mode": "allow", "max_wait_s": 60.0, "bound": "server"})]
        assert lines.lines == expected

    asyncio.run(main())


def test_admits_way_passes_the_places_over_and_returns_the_admission():
    async def main() -> None:
        waiter, held = full_queue()
        ticket = submit_waiting(waiter)
        wait = AdmissionWait(waiter, ticket, structlog.get_logger("test"), queued_line=None)
        task = asyncio.create_task(wait.decided())
        await asyncio.sleep(0)  # it may be waiting yet or not: the outcome is the same
        waiter.queue.ledger.release(held[0].lease.lease_id)
        waiter.kick()
        admission = await asyncio.wait_for(task, timeout=5.0)
        assert admission.decision is Decision.ADMITTED and admission.lease is not None
        assert wait.queued_perf_s is not None

    asyncio.run(main())


def test_a_caller_gone_as_the_queue_grants_leaves_nothing_held_and_says_what_was_granted():
    async def main() -> None:
        waiter, held = full_queue()
        ticket = submit_waiting(waiter)
        wait = AdmissionWait(waiter, ticket, structlog.get_logger("test"))
        task = asyncio.create_task(wait.decided())
        while ticket.seq not in waiter._events:  # parked on its event
            await asyncio.sleep(0.001)
        waiter.queue.ledger.release(held[0].lease.lease_id)
        waiter.kick()  # granted in this pass ...
        task.cancel()  # ... and its caller gone in the same one
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert wait.admission is None
        assert wait.granted_untaken is ticket.outcome and ticket.outcome.lease is not None
        assert waiter.queue.ledger.reserved_bytes() == 100 * BPT  # only the other holder's
        assert len(waiter.queue) == 0

    asyncio.run(main())
