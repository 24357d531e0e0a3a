"""The admission queue's policy, driven directly over a real Ledger with a fake clock."""

from __future__ import annotations

import pytest

from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)
from scheduler_service.ledger.queue import AdmissionQueue, Bound, Mode, Ticket

BPT = 1_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(capacity_tokens=300, max_length=8, max_wait_s=30.0, workers=("w1",)):
    clock = FakeClock()
    ledger = Ledger(clock=clock, lease_ttl_s=1e9, claim_ttl_s=1e9)
    for worker_id in workers:
        ledger.register(WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                                       context_length=4_096, bytes_per_token=BPT,
                                       capacity_bytes=capacity_tokens * BPT))
    return AdmissionQueue(ledger, max_length=max_length, max_wait_s=max_wait_s, clock=clock), clock


def req(name, prompt=50, max_new=50, min_new=50, strict=False):
    return AdmissionRequest(name, prompt_tokens=prompt, max_new_tokens=max_new,
                            min_new_tokens=min_new, strict=strict)


def release(queue, admission):
    assert queue.ledger.release(admission.lease.lease_id) > 0


def test_empty_queue_decides_exactly_as_the_ledger_does():
    queue, _ = setup()
    first = queue.submit(req("a", max_new=150, min_new=0))
    assert first.decision is Decision.ADMITTED and first.reserved_bytes == 200 * BPT
    capped = queue.submit(req("b", max_new=150, min_new=1))
    assert capped.decision is Decision.CAPPED and capped.max_new_tokens == 50  # seed rule: cap now
    assert len(queue) == 0


def test_a_request_whose_floor_does_not_fit_now_waits_and_is_served_from_the_head_on_release():
    queue, clock = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]  # 3 x 100 tokens: full
    assert all(h.decision is Decision.ADMITTED for h in held)
    ticket = queue.submit(req("waiter"))
    assert isinstance(ticket, Ticket) and ticket.needed_bytes == 100 * BPT
    assert queue.ledger.reserved_bytes() == 300 * BPT  # waiting holds nothing
    assert queue.pump() == []
    clock.now += 2.5
    release(queue, held[0])
    assert queue.pump() == [ticket]
    assert ticket.outcome.decision is Decision.ADMITTED and ticket.outcome.lease is not None
    assert ticket.outcome.queue_wait_s == pytest.approx(2.5)
    assert len(queue) == 0


def test_arrivals_are_admitted_in_arrival_order_and_newcomers_never_pass_the_queue():
    queue, _ = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]
    tickets = [queue.submit(req(f"t{i}")) for i in range(5)]
    assert all(isinstance(t, Ticket) for t in tickets)
    served = []
    for h in held:
        release(queue, h)
        served += queue.pump()
    assert [t.request.request_id for t in served] == ["t0", "t1", "t2"]
    # A newcomer that would fit now still joins the back while others wait.
    release(queue, served[0].outcome)
    late = queue.submit(req("late", prompt=1, max_new=1, min_new=1))
    assert isinstance(late, Ticket)
    served = queue.pump()
    assert [t.request.request_id for t in served] == ["t3"]


def test_a_large_head_is_not_starved_by_small_requests_behind_it():
    queue, _ = setup()
    small_held = [queue.submit(req(f"h{i}", prompt=20, max_new=30, min_new=30)) for i in range(6)]
    big = queue.submit(req("big", prompt=100, max_new=200, min_new=200))  # the whole capacity
    assert isinstance(big, Ticket)
    smalls = [queue.submit(req(f"s{i}", prompt=20, max_new=30, min_new=30)) for i in range(3)]
    for h in small_held[:-1]:
        release(queue, h)
        # Room for a small one appears each time: none is served ahead of the big head.
        assert queue.pump() == []
        assert all(not s.done for s in smalls)
    release(queue, small_held[-1])
    assert queue.pump() == [big]
    assert big.outcome.reserved_bytes == 300 * BPT
    release(queue, big.outcome)
    assert queue.pump() == smalls


def test_queue_full_is_refused_with_the_numbers_and_a_retry():
    queue, _ = setup(max_length=2)
    for i in range(3):
        queue.submit(req(f"h{i}"))
    queue.submit(req("q1"))
    queue.submit(req("q2"))
    refused = queue.submit(req("q3"))
    r = refused.rejection
    assert refused.decision is Decision.REJECTED and r.cause is Cause.QUEUE_FULL
    assert (r.queue_length, r.max_queue_length, r.bytes_ahead) == (2, 2, 200 * BPT)
    assert r.retry_after_s == 1.0 and r.needed_bytes == 100 * BPT
    assert "queue is full: 2 of 2" in r.message and "--max-queue-length" in r.remedy


def test_a_wait_that_runs_out_is_queue_timeout_with_how_long_it_waited():
    queue, clock = setup(max_wait_s=5.0)
    for i in range(3):
        queue.submit(req(f"h{i}"))
    first = queue.submit(req("first"))
    clock.now += 1.0
    second = queue.submit(req("second"))
    clock.now += 4.5  # first's 5 s are up, second has waited 4.5 s
    assert queue.pump() == [first]
    r = first.outcome.rejection
    assert r.cause is Cause.QUEUE_TIMEOUT and r.waited_s == pytest.approx(5.5)
    assert r.max_queue_wait_s == 5.0 and r.requests_ahead == 0 and r.queue_length == 1
    assert "waited 5.5 s of its 5.0 s" in r.message
    assert not second.done and len(queue) == 1


def test_the_callers_own_deadline_ends_the_wait_as_deadline_exceeded_holding_nothing():
    queue, clock = setup(max_wait_s=30.0)
    for i in range(3):
        queue.submit(req(f"h{i}"))
    ticket = queue.submit(req("t"), deadline_s=2.0)
    assert ticket.bound is Bound.DEADLINE and ticket.max_wait_s == 2.0
    clock.now += 2.0
    assert queue.pump() == [ticket]
    assert ticket.deadline_exceeded and ticket.outcome is None
    assert queue.ledger.reserved_bytes() == 300 * BPT


def test_a_cancelled_ticket_leaves_and_the_next_is_served():
    queue, _ = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]
    big = queue.submit(req("big", prompt=100, max_new=150, min_new=150))
    small = queue.submit(req("small"))
    release(queue, held[0])
    assert queue.pump() == []  # big blocks
    assert queue.cancel(big) and not queue.cancel(big)
    assert queue.pump() == [small]
    assert big.outcome is None


def test_a_request_beyond_every_workers_capacity_is_refused_not_queued():
    queue, _ = setup()
    queue.submit(req("h0"))
    adm = queue.submit(req("huge", prompt=100, max_new=400, min_new=400))
    assert adm.decision is Decision.REJECTED and adm.rejection.cause is Cause.EXCEEDS_CAPACITY
    assert len(queue) == 0


def test_strict_waits_for_its_whole_reservation_instead_of_being_refused():
    queue, _ = setup()
    held = queue.submit(req("h", prompt=50, max_new=150, min_new=0))  # 200 held, 100 free
    ticket = queue.submit(req("s", max_new=150, min_new=1, strict=True), Mode.STRICT)
    assert isinstance(ticket, Ticket) and ticket.needed_bytes == 200 * BPT
    release(queue, held)
    assert queue.pump() == [ticket]
    assert ticket.outcome.decision is Decision.ADMITTED and ticket.outcome.max_new_tokens == 150


def test_wait_full_gets_its_full_reservation_after_a_release():
    queue, clock = setup()
    held = queue.submit(req("h", prompt=50, max_new=150, min_new=0))
    ticket = queue.submit(req("full", max_new=150, min_new=1), Mode.WAIT_FULL)
    assert isinstance(ticket, Ticket)  # ALLOW would have been CAPPED to 50 now
    clock.now += 3
    release(queue, held)
    assert queue.pump() == [ticket]
    assert ticket.outcome.decision is Decision.ADMITTED and ticket.outcome.max_new_tokens == 150


@pytest.mark.parametrize("mode", [Mode.WAIT_FULL, Mode.STRICT])
def test_a_whole_waiter_whose_floor_does_not_fit_either_reports_the_whole(mode):
    # With not even the floor free, the ledger's BUDGET_BUSY names the
    # floor's bytes; the ticket waits for, and so reports, the whole reservation.
    queue, clock = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]  # 3 x 100 tokens: nothing free
    ticket = queue.submit(req("full", max_new=150, min_new=1), mode)
    assert isinstance(ticket, Ticket) and ticket.needed_bytes == 200 * BPT  # not the floor's 51
    assert queue.place(ticket).needed_bytes == 200 * BPT
    assert queue.stats().waiting_bytes == 200 * BPT
    behind = queue.submit(req("behind", max_new=150, min_new=1), mode)  # decided as a dry run
    assert behind.needed_bytes == 200 * BPT and queue.place(behind).bytes_ahead == 200 * BPT
    for h in held[:2]:
        release(queue, h)
    assert queue.pump() == [ticket]  # 200 free: the whole, never a cap
    assert ticket.outcome.decision is Decision.ADMITTED and ticket.outcome.max_new_tokens == 150


def test_wait_full_is_capped_when_the_wait_runs_out_first():
    queue, clock = setup(max_wait_s=4.0)
    queue.submit(req("h", prompt=50, max_new=150, min_new=0))
    ticket = queue.submit(req("full", max_new=150, min_new=1), Mode.WAIT_FULL)
    clock.now += 4.0
    assert queue.pump() == [ticket]
    assert ticket.outcome.decision is Decision.CAPPED and ticket.outcome.max_new_tokens == 50
    assert ticket.outcome.queue_wait_s == pytest.approx(4.0)


def test_wait_full_stops_waiting_for_the_whole_at_half_the_deadline():
    queue, _ = setup(max_wait_s=30.0)
    queue.submit(req("h", prompt=50, max_new=150, min_new=0))
    ticket = queue.submit(req("full", max_new=150, min_new=1), Mode.WAIT_FULL, deadline_s=10.0)
    assert ticket.max_wait_s == 5.0 and ticket.bound is Bound.DEADLINE


def test_wait_full_that_can_never_be_whole_is_capped_at_once():
    queue, _ = setup()
    adm = queue.submit(req("never", max_new=1_000, min_new=1), Mode.WAIT_FULL)
    assert adm.decision is Decision.CAPPED and adm.max_new_tokens == 250


def test_a_caller_who_will_not_wait_is_not_served_ahead_of_the_queue():
    queue, _ = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]
    queue.submit(req("waiting", prompt=100, max_new=100, min_new=100))
    release(queue, held[0])
    queue.pump()
    adm = queue.submit(req("impatient"), wait_s=0.0)
    assert adm.decision is Decision.REJECTED and adm.rejection.cause is Cause.QUEUE_TIMEOUT
    assert adm.rejection.requests_ahead == 1


def test_place_and_stats_count_what_is_ahead():
    queue, clock = setup()
    for i in range(3):
        queue.submit(req(f"h{i}"))
    a = queue.submit(req("a"))
    clock.now += 1
    b = queue.submit(req("b", prompt=100, max_new=100, min_new=100))
    place = queue.place(b)
    assert (place.position, place.requests_ahead, place.bytes_ahead, place.needed_bytes) == (
        2, 1, 100 * BPT, 200 * BPT)
    assert place.waited_s == 0 and place.queue_length == 2
    stats = queue.stats()
    assert (stats.length, stats.oldest_wait_s, stats.waiting_bytes) == (2, 1.0, 300 * BPT)
    assert queue.cancel(a) and queue.place(b).position == 1


def test_a_worker_registering_serves_the_queue():
    queue, _ = setup()
    for i in range(3):
        queue.submit(req(f"h{i}"))
    ticket = queue.submit(req("t"))
    queue.ledger.register(WorkerGeometry(worker_id="w2", address="w2:1", model="m",
                                         context_length=4_096, bytes_per_token=BPT,
                                         capacity_bytes=100 * BPT))
    assert queue.pump() == [ticket] and ticket.outcome.worker.worker_id == "w2"
