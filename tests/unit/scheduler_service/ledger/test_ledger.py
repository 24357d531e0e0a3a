"""The ledger's arithmetic, pinned with concrete numbers."""

from __future__ import annotations

import pytest

from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Lease,
    Ledger,
    WorkerGeometry,
)
from scheduler_service.ledger.step_model import StepSample

BPT = 46_080  # SmolLM2-135M fp32: 2 x 30 layers x 3 kv heads x 64 x 4 bytes
CTX = 8_192


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def geometry(worker_id="w1", capacity_bytes=1_000 * BPT, block_tokens=1, context_length=CTX):
    return WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                          context_length=context_length, bytes_per_token=BPT,
                          capacity_bytes=capacity_bytes, block_tokens=block_tokens)


def ledger_with(*geometries, clock=None) -> Ledger:
    ledger = Ledger(clock=clock or FakeClock())
    for g in geometries:
        ledger.register(g)
    return ledger


def test_incident_unset_max_new_tokens_is_capped_at_what_fits_with_every_field():
    prompt = 37
    ledger = ledger_with(geometry(capacity_bytes=(prompt + 500) * BPT))
    adm = ledger.admit(AdmissionRequest("r1", prompt_tokens=prompt, max_new_tokens=None))
    assert adm.decision is Decision.CAPPED
    assert adm.max_new_tokens == 500
    assert adm.reserved_bytes == (prompt + 500) * BPT
    cap = adm.budget_cap
    assert cap.requested_max_new_tokens == CTX - prompt
    assert cap.requested_was_unset
    assert cap.admitted_max_new_tokens == 500
    assert cap.requested_bytes == CTX * BPT
    assert cap.admitted_bytes == (prompt + 500) * BPT
    assert cap.available_bytes == (prompt + 500) * BPT
    assert cap.capacity_bytes == (prompt + 500) * BPT
    assert cap.bytes_per_token == BPT
    assert cap.prompt_tokens == prompt
    assert cap.worker_id == "w1"
    assert "500" in cap.reason and "--kv-capacity" in cap.reason
    assert adm.lease.budget_cap == cap
    assert ledger.reserved_bytes() == (prompt + 500) * BPT


def test_request_that_fits_is_admitted_with_the_full_worst_case_reserved():
    ledger = ledger_with(geometry())
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=100, max_new_tokens=200))
    assert adm.decision is Decision.ADMITTED
    assert adm.budget_cap is None
    assert adm.reserved_bytes == 300 * BPT == adm.lease.reserved_bytes


def test_reservation_is_rounded_up_to_whole_blocks():
    ledger = ledger_with(geometry(block_tokens=16, capacity_bytes=64 * BPT))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=7))
    assert adm.reserved_bytes == 32 * BPT  # 17 tokens -> 2 blocks of 16
    # 32 tokens (2 blocks) left: the cap is block-aligned, 32 - 10 = 22
    adm2 = ledger.admit(AdmissionRequest("r2", prompt_tokens=10, max_new_tokens=40))
    assert adm2.decision is Decision.CAPPED
    assert adm2.max_new_tokens == 22
    assert adm2.reserved_bytes == 32 * BPT
    assert ledger.reserved_bytes() == 64 * BPT


def test_busy_budget_caps_then_rejects_with_retry_when_even_min_cannot_fit():
    ledger = ledger_with(geometry(capacity_bytes=1_000 * BPT))
    first = ledger.admit(AdmissionRequest("a", prompt_tokens=100, max_new_tokens=800))
    assert first.decision is Decision.ADMITTED
    second = ledger.admit(AdmissionRequest("b", prompt_tokens=50, max_new_tokens=100))
    assert second.decision is Decision.CAPPED and second.max_new_tokens == 50
    assert "other requests hold" in second.budget_cap.reason
    third = ledger.admit(AdmissionRequest("c", prompt_tokens=10, max_new_tokens=10))
    assert third.decision is Decision.REJECTED
    rej = third.rejection
    assert rej.cause is Cause.BUDGET_BUSY
    assert rej.retry_after_s > 0
    assert rej.needed_bytes == 11 * BPT and rej.available_bytes == 0
    assert "retry" in rej.remedy
    assert third.lease is None
    assert ledger.reserved_bytes() == 1_000 * BPT


def test_strict_policy_rejects_what_would_be_capped_with_the_numbers():
    prompt = 37
    ledger = ledger_with(geometry(capacity_bytes=(prompt + 500) * BPT))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=prompt, strict=True))
    assert adm.decision is Decision.REJECTED
    rej = adm.rejection
    assert rej.cause is Cause.EXCEEDS_CAPACITY and rej.cap_refused
    assert rej.admissible_max_new_tokens == 500
    assert rej.requested_max_new_tokens == CTX - prompt
    assert rej.needed_bytes == CTX * BPT
    assert "--kv-capacity" in rej.remedy and "500" in rej.remedy
    assert ledger.reserved_bytes() == 0


def test_strict_policy_when_busy_is_budget_busy_with_retry():
    ledger = ledger_with(geometry(capacity_bytes=1_000 * BPT))
    ledger.admit(AdmissionRequest("a", prompt_tokens=100, max_new_tokens=800))
    adm = ledger.admit(AdmissionRequest("b", prompt_tokens=50, max_new_tokens=100, strict=True))
    assert adm.rejection.cause is Cause.BUDGET_BUSY and adm.rejection.cap_refused
    assert adm.rejection.admissible_max_new_tokens == 50


def test_prompt_beyond_context_is_context_length_exceeded():
    ledger = ledger_with(geometry(context_length=2_048))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=2_048))
    rej = adm.rejection
    assert rej.cause is Cause.CONTEXT_LENGTH_EXCEEDED
    assert rej.context_length == 2_048 and rej.prompt_tokens == 2_048
    assert "2,048" in rej.message and "2,047" in rej.remedy


def test_explicit_max_new_tokens_beyond_context_is_rejected_not_silently_clipped():
    ledger = ledger_with(geometry(context_length=2_048))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=48, max_new_tokens=2_001))
    assert adm.rejection.cause is Cause.CONTEXT_LENGTH_EXCEEDED
    assert "2,000" in adm.rejection.remedy


def test_beyond_whole_capacity_is_exceeds_capacity_naming_the_flag():
    ledger = ledger_with(geometry(capacity_bytes=100 * BPT))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=150, max_new_tokens=10))
    rej = adm.rejection
    assert rej.cause is Cause.EXCEEDS_CAPACITY
    assert rej.needed_bytes == 151 * BPT and rej.capacity_bytes == 100 * BPT
    assert "--kv-capacity" in rej.remedy


def test_min_new_tokens_sets_the_floor_of_a_cap():
    ledger = ledger_with(geometry(capacity_bytes=120 * BPT))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=100, max_new_tokens=50, min_new_tokens=30))
    assert adm.rejection.cause is Cause.EXCEEDS_CAPACITY
    ok = ledger.admit(AdmissionRequest("r", prompt_tokens=100, max_new_tokens=50, min_new_tokens=20))
    assert ok.decision is Decision.CAPPED and ok.max_new_tokens == 20


def test_no_worker_is_rejected_as_no_worker():
    adm = Ledger().admit(AdmissionRequest("r", prompt_tokens=5))
    assert adm.rejection.cause is Cause.NO_WORKER


def test_dry_run_reserves_nothing():
    ledger = ledger_with(geometry())
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=10), dry_run=True)
    assert adm.decision is Decision.ADMITTED and adm.dry_run and adm.lease is None
    assert ledger.reserved_bytes() == 0


def test_release_is_idempotent_and_returns_what_it_freed():
    ledger = ledger_with(geometry())
    lease = ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=10)).lease
    assert ledger.release(lease.lease_id) == 20 * BPT
    assert ledger.release(lease.lease_id) == 0
    assert ledger.release("nope") == 0
    assert ledger.reserved_bytes() == 0


def test_placement_takes_a_whole_fit_and_spreads_over_free_workers():
    ledger = ledger_with(geometry("a", capacity_bytes=1_000 * BPT), geometry("b", capacity_bytes=400 * BPT))
    first = ledger.admit(AdmissionRequest("1", prompt_tokens=100, max_new_tokens=100))
    assert first.worker.worker_id == "a"  # 1000 free vs 400
    second = ledger.admit(AdmissionRequest("2", prompt_tokens=100, max_new_tokens=500))
    assert second.worker.worker_id == "a"  # only a takes it whole (800 free)
    third = ledger.admit(AdmissionRequest("3", prompt_tokens=100, max_new_tokens=100))
    assert third.worker.worker_id == "b"  # b has 400 free, a 200


def test_placement_prefers_a_worker_with_a_batch_row_free_over_more_free_bytes():
    # a: more bytes but 2 rows; b: fewer bytes, 8 rows. A sequence beyond a's rows would
    # wait there for a whole generation while b could start it at once.
    from dataclasses import replace
    ledger = ledger_with(replace(geometry("a", capacity_bytes=1_000 * BPT), max_batch_rows=2),
                         replace(geometry("b", capacity_bytes=500 * BPT), max_batch_rows=8))
    placed = [ledger.admit(AdmissionRequest(str(i), prompt_tokens=10, max_new_tokens=10))
              for i in range(4)]
    assert [a.worker.worker_id for a in placed] == ["a", "a", "b", "b"]
    ledger.release(placed[0].lease.lease_id, worker_id="a")  # a row frees on a
    assert ledger.admit(AdmissionRequest("5", prompt_tokens=10,
                                         max_new_tokens=10)).worker.worker_id == "a"


def test_a_sessions_lease_takes_no_row_and_all_rows_busy_still_admits():
    from dataclasses import replace
    ledger = ledger_with(replace(geometry("a", capacity_bytes=1_000 * BPT), max_batch_rows=1),
                         replace(geometry("b", capacity_bytes=500 * BPT), max_batch_rows=1))
    assert ledger.open_session_lease("s").worker_id == "a"  # idle sessions sit out of the batch
    assert ledger.admit(AdmissionRequest("1", prompt_tokens=10,
                                         max_new_tokens=10)).worker.worker_id == "a"
    assert ledger.admit(AdmissionRequest("2", prompt_tokens=10,
                                         max_new_tokens=10)).worker.worker_id == "b"
    # Every row busy: admitted by bytes as before (it waits for a row on its worker).
    third = ledger.admit(AdmissionRequest("3", prompt_tokens=10, max_new_tokens=10))
    assert third.decision is Decision.ADMITTED and third.worker.worker_id == "a"


def test_placement_without_a_whole_fit_goes_where_the_cap_is_largest():
    ledger = ledger_with(geometry("a", capacity_bytes=300 * BPT), geometry("b", capacity_bytes=500 * BPT))
    adm = ledger.admit(AdmissionRequest("r", prompt_tokens=100))
    assert adm.decision is Decision.CAPPED and adm.worker.worker_id == "b"
    assert adm.max_new_tokens == 400


def test_silent_worker_expires_and_its_leases_return():
    clock = FakeClock()
    ledger = ledger_with(geometry(), clock=clock)
    ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=10))
    clock.now += ledger.lease_ttl_s + 1
    expired = ledger.expire()
    assert len(expired) == 1 and ledger.reserved_bytes() == 0 and ledger.snapshot() == []
    assert not ledger.heartbeat("w1")  # unknown now: it must register again


def test_heartbeat_keeps_leases_alive_and_unclaimed_leases_expire():
    clock = FakeClock()
    ledger = ledger_with(geometry(), clock=clock)
    unclaimed = ledger.admit(AdmissionRequest("u", prompt_tokens=10, max_new_tokens=10)).lease
    claimed = ledger.admit(AdmissionRequest("c", prompt_tokens=10, max_new_tokens=10)).lease
    assert ledger.claim(claimed.lease_id, "w1").claimed
    assert ledger.claim(claimed.lease_id, "other") is None
    for _ in range(int(ledger.claim_ttl_s // 5) + 2):
        clock.now += 5
        assert ledger.heartbeat("w1")
        ledger.expire()
    assert ledger.lease(unclaimed.lease_id) is None
    assert ledger.lease(claimed.lease_id) is not None
    assert ledger.reserved_bytes() == 20 * BPT


def test_reregistration_after_restart_restores_live_leases_with_their_cap():
    prompt = 37
    g = geometry(capacity_bytes=(prompt + 500) * BPT)
    first = ledger_with(g)
    lease = first.admit(AdmissionRequest("r", prompt_tokens=prompt)).lease
    restarted = Ledger()
    refused = restarted.register(g, live_leases=[lease])
    assert refused == []
    restored = restarted.lease(lease.lease_id)
    assert restored.budget_cap == lease.budget_cap and restored.claimed
    assert restarted.reserved_bytes() == lease.reserved_bytes
    assert restarted.release(lease.lease_id, worker_id="w1") == lease.reserved_bytes


def test_reregistration_refuses_leases_beyond_capacity():
    g = geometry(capacity_bytes=100 * BPT)
    leases = [Lease(lease_id=f"l{i}", worker_id="w1", request_id="r", prompt_tokens=10,
                    max_new_tokens=30, reserved_bytes=40 * BPT) for i in range(3)]
    ledger = Ledger()
    assert ledger.register(g, live_leases=leases) == ["l2"]
    assert ledger.reserved_bytes() == 80 * BPT


def test_bad_geometry_and_requests_raise():
    with pytest.raises(ValueError, match="bytes_per_token"):
        WorkerGeometry("w", "a", "m", context_length=10, bytes_per_token=0, capacity_bytes=1)
    with pytest.raises(ValueError, match="prompt"):
        AdmissionRequest("r", prompt_tokens=0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        AdmissionRequest("r", prompt_tokens=1, max_new_tokens=2, min_new_tokens=3)


def test_scheduler_exit_releases_only_unclaimed_leases():
    ledger = ledger_with(geometry())
    a = ledger.admit(AdmissionRequest("a", prompt_tokens=10, max_new_tokens=10)).lease
    b = ledger.admit(AdmissionRequest("b", prompt_tokens=10, max_new_tokens=10)).lease
    ledger.claim(b.lease_id, "w1")
    assert ledger.release_unclaimed(a.lease_id) == 20 * BPT
    assert ledger.release_unclaimed(b.lease_id) == 0  # its worker releases it
    assert ledger.release(b.lease_id, worker_id="w1") == 20 * BPT


def test_heartbeat_reconcile_drops_claimed_leases_the_worker_lost_after_grace():
    clock = FakeClock()
    ledger = ledger_with(geometry(), clock=clock)
    kept = ledger.admit(AdmissionRequest("k", prompt_tokens=10, max_new_tokens=10)).lease
    lost = ledger.admit(AdmissionRequest("l", prompt_tokens=10, max_new_tokens=10)).lease
    fresh = ledger.admit(AdmissionRequest("f", prompt_tokens=10, max_new_tokens=10)).lease
    ledger.claim(kept.lease_id, "w1")
    ledger.claim(lost.lease_id, "w1")
    clock.now += 5
    ledger.claim(fresh.lease_id, "w1")  # claimed after the worker's snapshot
    dropped = ledger.reconcile("w1", [kept.lease_id], grace_s=2.0)
    assert [d.lease_id for d in dropped] == [lost.lease_id]
    assert ledger.reserved_bytes() == 40 * BPT


def test_an_unreachable_worker_gets_no_placement_until_it_heartbeats():
    ledger = ledger_with(geometry("w1"), geometry("w2"))
    assert ledger.unreachable("w2") and not ledger.unreachable("nobody")
    placed = [ledger.admit(AdmissionRequest(f"r{i}", prompt_tokens=10, max_new_tokens=10))
              for i in range(3)]
    assert {a.worker.worker_id for a in placed} == {"w1"}
    assert [w.unreachable for w in ledger.snapshot()] == [False, True]
    ledger.unreachable("w1")
    refused = ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=10))
    assert refused.rejection.cause is Cause.NO_WORKER  # none to place on: a retry may find one
    assert ledger.heartbeat("w2")  # alive again: placed on as before
    again = ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=10))
    assert again.worker.worker_id == "w2"
    ledger.register(geometry("w1"))  # a registration clears it too
    assert not any(w.unreachable for w in ledger.snapshot())


def test_a_heartbeat_from_another_address_under_the_same_id_changes_nothing():
    # A second process under a live worker's id is refused at registration; when it
    # stops, its draining heartbeat must not drain the live worker.
    ledger = ledger_with(geometry("w1"))
    assert not ledger.heartbeat("w1", draining=True, address="impostor:2")
    [worker] = ledger.snapshot()
    assert not worker.draining
    assert ledger.heartbeat("w1", address="w1:1")  # its own address: renewed
    assert ledger.heartbeat("w1")  # no address (an older worker): not checked
    again = ledger.admit(AdmissionRequest("r2", prompt_tokens=10, max_new_tokens=10))
    assert again.worker.worker_id == "w1"


def test_a_deregistered_worker_is_forgotten_at_once_with_each_lease_released_once():
    # A clean stop's goodbye: no lease TTL to wait out, and the same id registers again from
    # another address at once (before: WORKER_ID_IN_USE until lease_ttl_s passed).
    clock = FakeClock()
    ledger = ledger_with(geometry("w1"), geometry("w2"), clock=clock)
    lease = ledger.admit(AdmissionRequest("r", prompt_tokens=10, max_new_tokens=10)).lease
    ledger.claim(lease.lease_id, lease.worker_id)
    session = ledger.open_session_lease("s", preferred_worker=lease.worker_id)
    ledger.heartbeat(lease.worker_id, steps=[StepSample(rows=1, steps=4, seconds=0.04)])
    other = "w2" if lease.worker_id == "w1" else "w1"
    assert ledger.forget_worker(lease.worker_id, address="impostor:9") is None  # not its own
    dropped = ledger.forget_worker(lease.worker_id, address=f"{lease.worker_id}:1")
    assert {d.lease_id for d in dropped} == {lease.lease_id, session.lease_id}
    assert [w.geometry.worker_id for w in ledger.snapshot()] == [other]
    assert ledger.reserved_bytes() == 0 and ledger.lease(lease.lease_id) is None
    assert ledger.release(lease.lease_id, worker_id=lease.worker_id) == 0  # once, not twice
    assert ledger.forget_worker(lease.worker_id) is None  # told twice: nothing more
    assert ledger.expire() == []  # gone already: nothing left for the TTL to drop later
    ledger.register(WorkerGeometry(worker_id=lease.worker_id, address="restarted:2", model="m",
                                   context_length=CTX, bytes_per_token=BPT,
                                   capacity_bytes=1_000 * BPT, block_tokens=1))
    assert not next(t for t in ledger.worker_times()
                    if t.worker_id == lease.worker_id).measured  # measured anew
