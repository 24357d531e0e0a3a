"""Session turns in the admission queue: a turn grows its own lease (Ledger.resize) in the
same FIFO, under the same policy, as a new request (a busy turn waits)."""

from __future__ import annotations

from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)
from scheduler_service.ledger.queue import AdmissionQueue, Mode, Ticket

BPT = 1_000


def setup(capacity_tokens=300):
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(WorkerGeometry(worker_id="w1", address="w1:1", model="m", context_length=4_096,
                                   bytes_per_token=BPT, capacity_bytes=capacity_tokens * BPT))
    queue = AdmissionQueue(ledger, max_length=8, max_wait_s=30.0)
    session = ledger.open_session_lease("s")
    assert ledger.claim(session.lease_id, "w1") is not None
    return queue, session.lease_id


def req(name, prompt=50, max_new=50, min_new=50):
    return AdmissionRequest(name, prompt_tokens=prompt, max_new_tokens=max_new,
                            min_new_tokens=min_new)


def test_a_turn_whose_floor_does_not_fit_waits_and_grows_its_own_lease_when_bytes_free():
    queue, lease_id = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]  # full
    ticket = queue.submit(req("turn"), lease_id=lease_id)
    assert isinstance(ticket, Ticket) and ticket.lease_id == lease_id
    assert queue.ledger.lease(lease_id).reserved_bytes == 0  # waiting holds nothing
    queue.ledger.release(held[0].lease.lease_id)
    assert queue.pump() == [ticket]
    assert ticket.outcome.decision is Decision.ADMITTED
    assert ticket.outcome.lease.lease_id == lease_id  # the session's lease, not a new one
    assert queue.ledger.lease(lease_id).reserved_bytes == 100 * BPT


def test_a_turn_joins_the_back_behind_waiting_requests_and_is_capped_now_on_an_empty_queue():
    queue, lease_id = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]
    first = queue.submit(req("generate"))
    turn = queue.submit(req("turn"), lease_id=lease_id)
    assert isinstance(first, Ticket) and isinstance(turn, Ticket)
    queue.ledger.release(held[0].lease.lease_id)
    assert queue.pump() == [first]  # FIFO: the Generate that came first is served first
    queue.ledger.release(held[1].lease.lease_id)
    assert queue.pump() == [turn]
    # Nobody waiting: a turn is decided at once, CAPPED to what fits (unless WAIT_FULL).
    queue.ledger.release(held[2].lease.lease_id)
    capped = queue.submit(req("turn2", max_new=500, min_new=1), lease_id=lease_id)
    assert capped.decision is Decision.CAPPED
    # WAIT_FULL waits for its whole reservation (250 tokens; 200 are free to this lease).
    whole = queue.submit(req("turn3", max_new=200, min_new=1), Mode.WAIT_FULL, lease_id=lease_id)
    assert isinstance(whole, Ticket) and whole.needed_bytes == 250 * BPT


def test_a_turn_whose_lease_is_gone_does_not_block_the_head():
    queue, lease_id = setup()
    held = [queue.submit(req(f"h{i}")) for i in range(3)]
    turn = queue.submit(req("turn"), lease_id=lease_id)
    behind = queue.submit(req("behind"))
    assert isinstance(turn, Ticket) and isinstance(behind, Ticket)
    queue.ledger.release(lease_id, "w1")  # its worker died / closed: the lease is gone
    queue.ledger.release(held[0].lease.lease_id)
    done = queue.pump()
    assert done == [turn, behind]
    assert turn.outcome.rejection.cause is Cause.NO_WORKER
    assert behind.outcome.decision is Decision.ADMITTED
