"""Time beside bytes in the ledger (time_budget.py, time_admission.py): synthetic step
measurements, a fake clock, the decisions and their numbers."""

from __future__ import annotations

import pytest

from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)
from scheduler_service.ledger.queue import AdmissionQueue, Ticket
from scheduler_service.ledger.step_model import StepSample
from scheduler_service.ledger.time_budget import TimeGoals
from scheduler_service.ledger.types import CapLimit

BPT = 1_024


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def geometry(worker_id="w1"):
    return WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                          context_length=4_096, bytes_per_token=BPT,
                          capacity_bytes=100_000 * BPT)


def measured_ledger(step_ms_by_rows=None, goals=None, workers=("w1",)) -> Ledger:
    """A ledger whose workers measured 10 ms + 10 ms a row (1 row: 20 ms, 4 rows: 50 ms)."""
    clock = FakeClock()
    ledger = Ledger(clock=clock)
    ledger.time_goals = goals or TimeGoals()
    table = step_ms_by_rows or {r: 10.0 + 10.0 * r for r in range(1, 9)}
    for worker_id in workers:
        ledger.register(geometry(worker_id))
        ledger.heartbeat(worker_id, steps=[StepSample(rows=r, steps=1, seconds=ms / 1e3)
                                           for r, ms in table.items()])
    return ledger


def ask(request_id="r", max_itl_ms=0, max_ttft_ms=0, max_new_tokens=100, **kw):
    return AdmissionRequest(request_id, prompt_tokens=10, max_new_tokens=max_new_tokens,
                            model="m", max_itl_ms=max_itl_ms, max_ttft_ms=max_ttft_ms, **kw)


def test_default_off_admits_by_bytes_alone_however_slow_the_steps():
    ledger = measured_ledger({1: 500.0, 8: 4_000.0})
    for i in range(20):
        assert ledger.admit(ask(f"r{i}")).decision is Decision.ADMITTED


def test_before_any_measurement_a_goal_admits_by_bytes_and_the_budget_says_unmeasured():
    ledger = Ledger(clock=FakeClock())
    ledger.register(geometry())
    assert ledger.admit(ask(max_itl_ms=1)).decision is Decision.ADMITTED
    (view,) = ledger.worker_times()
    assert not view.measured and view.streams == 1 and view.next_step_ms == 0.0


def test_admits_while_the_step_with_one_more_stream_keeps_the_goal_then_refuses_with_numbers():
    ledger = measured_ledger()
    admitted = [ledger.admit(ask(f"r{i}", max_itl_ms=45)) for i in range(3)]  # 20, 30, 40 ms
    assert all(a.decision is Decision.ADMITTED for a in admitted)
    fourth = ledger.admit(ask("r3", max_itl_ms=45, max_ttft_ms=100))
    assert fourth.decision is Decision.REJECTED
    r = fourth.rejection
    assert r.cause is Cause.TIME_BUSY and not r.time_waits
    assert r.predicted_step_ms == pytest.approx(50.0)
    assert r.itl_goal_ms == 45 and r.streams == 3 and r.ttft_goal_ms == 100
    # one stream must end: 100 tokens x 40 ms = 4 s, past the 100 ms TTFT goal
    assert r.estimated_wait_s == pytest.approx(4.0)
    assert r.retry_after_s == pytest.approx(4.0)
    assert "50.0 ms" in r.message and "45 ms" in r.message and "3 streams" in r.message
    assert "retry in 4.0 s" in r.remedy and "max_itl_ms" in r.remedy


def test_never_slows_an_admitted_stream_below_its_own_goal():
    ledger = measured_ledger()
    assert ledger.admit(ask("strict", max_itl_ms=25)).decision is Decision.ADMITTED  # 20 ms
    loose = ledger.admit(ask("loose", max_itl_ms=1_000, max_ttft_ms=10))
    assert loose.decision is Decision.REJECTED
    assert loose.rejection.itl_goal_ms == 25  # the admitted stream's goal binds
    # and a request with no goal at all is held to it too
    assert ledger.admit(ask("none", max_ttft_ms=10)).decision is Decision.REJECTED


def test_a_goal_below_one_streams_step_is_unreachable():
    ledger = measured_ledger()
    adm = ledger.admit(ask(max_itl_ms=1))
    assert adm.rejection.cause is Cause.TIME_GOAL_UNREACHABLE
    assert adm.rejection.fastest_step_ms == pytest.approx(20.0)
    assert "loosen max_itl_ms to at least 21" in adm.rejection.remedy


def test_the_server_default_goal_applies_to_requests_without_their_own():
    ledger = measured_ledger(goals=TimeGoals(max_itl_ms=25, max_ttft_ms=50))
    assert ledger.admit(ask("a")).decision is Decision.ADMITTED
    assert ledger.admit(ask("b")).rejection.cause is Cause.TIME_BUSY
    assert ledger.admit(ask("own", max_itl_ms=100)).decision is Decision.REJECTED  # a's goal


def test_places_on_the_worker_that_keeps_the_goal():
    ledger = measured_ledger(workers=("w1", "w2"))
    first = ledger.admit(ask("a", max_itl_ms=25))
    second = ledger.admit(ask("b", max_itl_ms=25))
    assert {first.worker.worker_id, second.worker.worker_id} == {"w1", "w2"}


def test_a_wait_within_the_ttft_goal_queues_and_is_admitted_when_a_stream_ends():
    ledger = measured_ledger()
    queue = AdmissionQueue(ledger, max_wait_s=60.0)
    held = queue.submit(ask("a", max_itl_ms=25, max_new_tokens=10))
    assert held.decision is Decision.ADMITTED
    ticket = queue.submit(ask("b", max_itl_ms=25, max_ttft_ms=5_000))
    assert isinstance(ticket, Ticket)
    assert queue.place(ticket).position == 1
    assert queue.pump() == []  # still one stream
    ledger.release(held.lease.lease_id)
    (done,) = queue.pump()
    assert done is ticket and ticket.outcome.decision is Decision.ADMITTED


def test_a_deadline_too_short_for_max_new_tokens_caps_them_said_like_the_byte_cap():
    clock = FakeClock()
    ledger = measured_ledger()
    ledger._clock = clock
    adm = ledger.admit(ask(max_itl_ms=1_000, max_new_tokens=500, deadline_at=clock.now + 1.0))
    assert adm.decision is Decision.CAPPED
    cap = adm.budget_cap
    assert cap.limit is CapLimit.DEADLINE
    assert adm.max_new_tokens == cap.admitted_max_new_tokens == 49  # 1 s / 20 ms, less prefill
    assert cap.requested_max_new_tokens == 500 and cap.predicted_step_ms == pytest.approx(20.0)
    assert adm.reserved_bytes == (10 + 49) * BPT == adm.lease.reserved_bytes
    assert "deadline" in cap.reason and "49" in cap.reason and "20.0 ms" in cap.reason


def test_a_deadline_that_fits_fewer_than_min_new_tokens_is_refused():
    clock = FakeClock()
    ledger = measured_ledger()
    ledger._clock = clock
    adm = ledger.admit(ask(max_itl_ms=1_000, min_new_tokens=100, deadline_at=clock.now + 1.0))
    assert adm.rejection.cause is Cause.TIME_BUSY
    assert "fits fewer than min_new_tokens 100" in adm.rejection.message


def test_the_time_budget_view_shows_streams_steps_and_goals():
    ledger = measured_ledger()
    ledger.admit(ask("a", max_itl_ms=45))
    ledger.admit(ask("b"))
    (view,) = ledger.worker_times()
    assert view.measured and view.streams == 2 and view.itl_goal_ms == 45
    assert view.step_ms == pytest.approx(30.0) and view.next_step_ms == pytest.approx(40.0)
    assert view.steps_measured == 8 and view.table[0] == (1, pytest.approx(20.0))


def test_strict_refuses_a_deadline_cap_naming_what_fits():
    clock = FakeClock()
    ledger = measured_ledger()
    ledger._clock = clock
    adm = ledger.admit(ask(max_itl_ms=1_000, max_new_tokens=500, strict=True,
                           deadline_at=clock.now + 1.0))
    r = adm.rejection
    assert r.cause is Cause.TIME_BUSY and r.cap_refused and r.admissible_max_new_tokens == 49
    assert "fits 49 of max_new_tokens 500" in r.message and "STRICT" in r.message
    assert "accept a cap (max_new_tokens <= 49 fits)" in r.remedy


def test_a_worker_gone_silent_takes_its_measurements_with_it():
    ledger = measured_ledger()
    ledger._clock.now += ledger.lease_ttl_s + 1
    ledger.expire()
    ledger.register(geometry())
    (view,) = ledger.worker_times()
    assert not view.measured and view.steps_measured == 0


def test_the_wait_counts_the_requests_already_in_line():
    ledger = measured_ledger()
    queue = AdmissionQueue(ledger, max_wait_s=60.0)
    # one stream of 100 tokens at 20 ms: it ends in 2 s
    assert queue.submit(ask("a", max_itl_ms=25)).decision is Decision.ADMITTED
    first = queue.submit(ask("b", max_itl_ms=25, max_ttft_ms=3_000))
    assert isinstance(first, Ticket)  # next in line: about 2 s, within 3 s
    second = queue.submit(ask("c", max_itl_ms=25, max_ttft_ms=3_000))
    # behind b: a's end and then b's own (about 4 s), past 3 s: refused at once
    assert second.decision is Decision.REJECTED and second.rejection.cause is Cause.TIME_BUSY
    assert second.rejection.estimated_wait_s == pytest.approx(4.0)
    assert len(queue) == 1
