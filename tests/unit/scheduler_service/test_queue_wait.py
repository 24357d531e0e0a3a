"""QueueWaiter: a queued caller's cancel always takes its ticket out of the queue."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import structlog

from scheduler_service.ledger.ledger import AdmissionRequest, Decision, Ledger, WorkerGeometry
from scheduler_service.ledger.queue import AdmissionQueue, Ticket
from scheduler_service.queue_wait import QueueWaiter

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
