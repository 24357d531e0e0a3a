"""Time on the paths beside Generate's (docs/features/time-budget.md): a session turn is held
to its own goal or the server's, is a stream for time while it runs, waits or is capped like
a Generate; a request time moves to another worker stays within its tenant's quota."""

from __future__ import annotations

import pytest

from scheduler_service.ledger import tenants
from scheduler_service.ledger.ledger import AdmissionRequest, Cause, Decision, Ledger
from scheduler_service.ledger.queue import AdmissionQueue, Ticket
from scheduler_service.ledger.time_budget import TimeGoals
from scheduler_service.ledger.types import CapLimit
from tests.unit.scheduler_service.ledger.test_time_admission import (
    BPT,
    ask,
    geometry,
    measured_ledger,
)


def turn(request_id="t", max_itl_ms=0, max_ttft_ms=0, max_new_tokens=100, **kw):
    return AdmissionRequest(request_id, prompt_tokens=10, max_new_tokens=max_new_tokens,
                            model="m", max_itl_ms=max_itl_ms, max_ttft_ms=max_ttft_ms, **kw)


def session(ledger: Ledger) -> str:
    return ledger.open_session_lease("s", model="m").lease_id


def test_a_turn_with_its_own_goal_is_refused_by_time_like_a_generate():
    # 20 ms a step alone, 30 ms with two rows (measured_ledger's 10 ms + 10 ms a row)
    ledger = measured_ledger()
    lease_id = session(ledger)
    assert ledger.admit(ask("a")).decision is Decision.ADMITTED
    refused = ledger.resize(lease_id, turn(max_itl_ms=25, max_ttft_ms=10))
    r = refused.rejection
    assert refused.decision is Decision.REJECTED and r.cause is Cause.TIME_BUSY
    assert (r.streams, r.itl_goal_ms, r.worker_id) == (1, 25, "w1")
    assert r.predicted_step_ms == pytest.approx(30.0)
    assert ledger.lease(lease_id).reserved_bytes == 0  # unchanged
    # A goal no wait can meet is said as for a Generate.
    unreachable = ledger.resize(lease_id, turn(max_itl_ms=15))
    assert unreachable.rejection.cause is Cause.TIME_GOAL_UNREACHABLE


def test_the_server_default_goal_holds_a_turn_that_sets_none():
    ledger = measured_ledger(goals=TimeGoals(max_itl_ms=25, max_ttft_ms=10))
    lease_id = session(ledger)
    assert ledger.admit(ask("a")).decision is Decision.ADMITTED
    assert ledger.resize(lease_id, turn()).rejection.cause is Cause.TIME_BUSY


def test_a_running_turn_is_a_stream_with_its_goal_until_its_worker_shrinks_it():
    ledger = measured_ledger()
    lease_id = session(ledger)
    granted = ledger.resize(lease_id, turn(max_itl_ms=25))
    assert granted.decision is Decision.ADMITTED
    assert granted.lease.turn_running and granted.lease.max_itl_ms == 25
    (view,) = ledger.worker_times()
    assert view.streams == 1 and view.itl_goal_ms == 25
    # A Generate with no goal of its own would slow the turn past its 25 ms: refused.
    busy = ledger.admit(ask("b", max_ttft_ms=10))
    assert busy.rejection.cause is Cause.TIME_BUSY and busy.rejection.itl_goal_ms == 25
    # The turn ends (its worker frees and shrinks the lease): the step is free again.
    ledger.shrink(lease_id, "w1", 30)
    assert not ledger.lease(lease_id).turn_running
    assert ledger.worker_times()[0].streams == 0
    assert ledger.admit(ask("b")).decision is Decision.ADMITTED


def test_a_turn_waits_in_the_queue_and_is_granted_when_a_stream_ends():
    ledger = measured_ledger()
    queue = AdmissionQueue(ledger, max_wait_s=60.0)
    lease_id = session(ledger)
    held = queue.submit(ask("a", max_itl_ms=25, max_new_tokens=10))
    ticket = queue.submit(turn(max_itl_ms=25, max_ttft_ms=5_000), lease_id=lease_id)
    assert isinstance(ticket, Ticket) and queue.place(ticket).position == 1
    assert queue.pump() == []
    ledger.release(held.lease.lease_id)
    (done,) = queue.pump()
    assert done is ticket and ticket.outcome.decision is Decision.ADMITTED
    assert ledger.lease(lease_id).reserved_bytes == (10 + 100) * BPT


def test_a_turn_s_deadline_caps_its_new_tokens_said_like_the_byte_cap():
    ledger = measured_ledger()
    lease_id = session(ledger)
    now = ledger._clock()
    capped = ledger.resize(lease_id, turn(max_itl_ms=1_000, max_new_tokens=500,
                                          deadline_at=now + 1.0))
    assert capped.decision is Decision.CAPPED and capped.max_new_tokens == 49
    assert capped.budget_cap.limit is CapLimit.DEADLINE
    assert ledger.lease(lease_id).reserved_bytes == (10 + 49) * BPT


def test_a_turn_between_others_time_changes_nothing_with_no_goal_anywhere():
    ledger = measured_ledger({1: 500.0, 8: 4_000.0})
    lease_id = session(ledger)
    for i in range(5):
        assert ledger.admit(ask(f"r{i}")).decision is Decision.ADMITTED
    assert ledger.resize(lease_id, turn()).decision is Decision.ADMITTED


def test_a_request_time_moves_to_another_worker_stays_within_its_tenant_quota():
    # w1 has the most free bytes, w2 holds a stream whose 25 ms goal one more row would pass.
    ledger = measured_ledger(workers=("w1", "w2"))
    ledger.set_tenants(tenants.parse('[tenants.small]\nquota = "1000KiB"\n', "t.toml"))
    assert ledger.admit(ask("a", max_itl_ms=25, preferred_worker="w2")).worker.worker_id == "w2"
    # 10 + 3,000 tokens need more than the tenant's 1,000-token quota: capped to it, wherever
    # it goes; the bytes' choice (w2) would pass a goal, so time takes w1.
    adm = ledger.admit(ask("b", max_itl_ms=25, max_new_tokens=3_000, tenant="small"))
    assert adm.decision is Decision.CAPPED and adm.worker.worker_id == "w1"
    assert adm.budget_cap.limit is CapLimit.TENANT_QUOTA and adm.max_new_tokens == 990
    assert ledger.tenant_reserved()[("small", "m")] == 1_000 * BPT
    # Full: the next one is refused by the quota, not placed over it.
    again = ledger.admit(ask("c", max_itl_ms=25, tenant="small"))
    assert again.decision is Decision.REJECTED and again.rejection.cause is Cause.TENANT_QUOTA



def test_a_running_turn_takes_a_batch_row_and_gives_it_back_at_its_end():
    from dataclasses import replace

    ledger = Ledger()
    for worker_id, tokens in (("a", 100_000), ("b", 50_000)):
        ledger.register(replace(geometry(worker_id), capacity_bytes=tokens * BPT,
                                max_batch_rows=1))
    lease_id = ledger.open_session_lease("s", model="m").lease_id  # on a: the most bytes
    ledger.resize(lease_id, turn())
    # a's one row is the turn's: a request that could start at once goes to b.
    assert ledger.admit(ask("x", max_new_tokens=10)).worker.worker_id == "b"
    ledger.shrink(lease_id, "a", 110)
    assert ledger.admit(ask("y", max_new_tokens=10)).worker.worker_id == "a"
