"""The ledger's session operations: one lease per session, resized per turn, shrunk after."""

from __future__ import annotations

from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)

BPT = 10


def ledger(capacity_tokens: int = 100) -> Ledger:
    ledger = Ledger()
    ledger.register(WorkerGeometry(worker_id="w", address="x", model="m", context_length=1_000,
                                   bytes_per_token=BPT, capacity_bytes=capacity_tokens * BPT))
    return ledger


def test_a_turn_grows_into_its_own_bytes_and_is_capped_by_the_rest():
    book = ledger()
    lease = book.open_session_lease("s")
    assert lease.reserved_bytes == 0 and book.reserved_bytes() == 0
    first = book.resize(lease.lease_id, AdmissionRequest("t1", 20, 30))
    assert first.decision is Decision.ADMITTED and book.reserved_bytes() == 50 * BPT
    book.shrink(lease.lease_id, "w", 40)
    other = book.admit(AdmissionRequest("o", 10, 30))  # 40 tokens: the worker is now 80 full
    assert other.decision is Decision.ADMITTED
    # The session's 40 held tokens are its own: the turn may use them plus the 20 free.
    second = book.resize(lease.lease_id, AdmissionRequest("t2", 50, 40))
    assert second.decision is Decision.CAPPED and second.max_new_tokens == 10
    assert second.budget_cap.requested_max_new_tokens == 40
    assert book.lease(lease.lease_id).budget_cap == second.budget_cap
    assert book.reserved_bytes() == 100 * BPT
    # The turn ends: the cap stays on the lease, the bytes shrink to what is held.
    shrunk = book.shrink(lease.lease_id, "w", 59)
    assert shrunk.reserved_bytes == 59 * BPT and shrunk.budget_cap == second.budget_cap
    assert book.shrink(lease.lease_id, "w", 500).reserved_bytes == 59 * BPT  # never grows


def test_a_turn_that_cannot_fit_its_floor_is_rejected_and_changes_nothing():
    book = ledger()
    lease = book.open_session_lease("s")
    book.resize(lease.lease_id, AdmissionRequest("t1", 20, 10))
    book.admit(AdmissionRequest("o", 50, 20))  # 70 tokens held by another request
    busy = book.resize(lease.lease_id, AdmissionRequest("t2", 40, 10, min_new_tokens=5))
    assert busy.decision is Decision.REJECTED and busy.rejection.cause is Cause.BUDGET_BUSY
    assert book.lease(lease.lease_id).reserved_bytes == 30 * BPT
    huge = book.resize(lease.lease_id, AdmissionRequest("t3", 200, 10))
    assert huge.rejection.cause is Cause.EXCEEDS_CAPACITY
    window = book.resize(lease.lease_id, AdmissionRequest("t4", 995, 10))
    assert window.rejection.cause is Cause.CONTEXT_LENGTH_EXCEEDED
    assert book.lease(lease.lease_id).reserved_bytes == 30 * BPT
    assert book.release(lease.lease_id) == 30 * BPT


def test_a_resized_lease_keeps_its_place_among_its_workers_leases():
    # Resizing is one _hold of the new size, not a release and a new hold: GetBudget's
    # lease list does not reorder because a session took a turn.
    book = ledger()
    session = book.open_session_lease("s")
    other = book.admit(AdmissionRequest("o", 10, 10)).lease
    book.resize(session.lease_id, AdmissionRequest("t1", 20, 10))
    book.shrink(session.lease_id, "w", 25)
    (worker,) = book.snapshot()
    assert [lease.lease_id for lease in worker.leases] == [session.lease_id, other.lease_id]
    assert worker.reserved_bytes == (20 + 25) * BPT
