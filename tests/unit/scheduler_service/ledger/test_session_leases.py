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


def test_parked_host_and_disk_bytes_are_tiers_apart_from_capacity():
    """A session moved to disk: its device bytes go back, its disk bytes are shown apart
    (per worker and per tenant) and never count against capacity, however many."""
    book = ledger()
    leases = [book.open_session_lease(f"s{i}", tenant="acme") for i in range(1_000)]
    for lease in leases:
        book.shrink(lease.lease_id, "w", 0, host_bytes=0, disk_bytes=4_096)
    (worker,) = book.snapshot()
    assert worker.reserved_bytes == 0 and worker.available_bytes == 100 * BPT
    assert worker.disk_bytes == 1_000 * 4_096 and worker.host_bytes == 0
    (acme,) = [u for u in book.tenant_usage() if u.tenant == "acme"]
    assert acme.disk_bytes == 1_000 * 4_096 and acme.reserved_bytes == 0
    # A turn on one of them is an ordinary admission on the whole capacity.
    turn = book.resize(leases[0].lease_id, AdmissionRequest("t", 50, 50))
    assert turn.decision is Decision.ADMITTED and book.reserved_bytes() == 100 * BPT
    # Its end: resident again (held tokens), its file gone.
    book.shrink(leases[0].lease_id, "w", 60, host_bytes=0, disk_bytes=0)
    (worker,) = book.snapshot()
    assert worker.disk_bytes == 999 * 4_096 and worker.reserved_bytes == 60 * BPT
    book.shrink(leases[1].lease_id, "w", 0, host_bytes=512, disk_bytes=0)
    assert book.snapshot()[0].host_bytes == 512
    assert book.release(leases[2].lease_id) == 0  # released: its disk bytes leave the ledger
    assert book.snapshot()[0].disk_bytes == 997 * 4_096


def test_a_registering_worker_restores_its_sessions_disk_bytes_to_their_tenant():
    from scheduler_service.ledger.types import Lease

    book = ledger()
    geometry = book.geometry("w")
    on_disk = Lease(lease_id="L1", worker_id="w", request_id="r", prompt_tokens=0,
                    max_new_tokens=0, reserved_bytes=0, claimed=True, session=True,
                    tenant="acme", disk_bytes=8_192)
    assert book.register(geometry, [on_disk]) == []
    (worker,) = book.snapshot()
    assert worker.disk_bytes == 8_192 and worker.reserved_bytes == 0
    assert [u.disk_bytes for u in book.tenant_usage() if u.tenant == "acme"] == [8_192]


def test_a_workers_own_move_to_disk_never_shrinks_a_turn_admitted_since():
    book = ledger()
    lease = book.open_session_lease("s")
    book.resize(lease.lease_id, AdmissionRequest("turn-1", 20, 10))
    book.shrink(lease.lease_id, "w", 25)
    # The worker decides to park it, but turn 2 is admitted before its shrink arrives.
    book.resize(lease.lease_id, AdmissionRequest("turn-2", 30, 10))
    assert book.shrink(lease.lease_id, "w", 0, disk_bytes=999, if_request_id="turn-1") is None
    assert book.lease(lease.lease_id).reserved_bytes == 40 * BPT  # turn 2 keeps its bytes
    assert book.lease(lease.lease_id).disk_bytes == 0
    book.shrink(lease.lease_id, "w", 35)
    parked = book.shrink(lease.lease_id, "w", 0, disk_bytes=999, if_request_id="turn-2")
    assert parked.reserved_bytes == 0 and parked.disk_bytes == 999
