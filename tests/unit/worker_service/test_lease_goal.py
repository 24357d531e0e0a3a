"""The gap goal a stream is held to on the worker: the scheduler's resolution travels on the
lease (Lease.max_itl_ms), whichever path the request came by; the strictest of it and the
request's own is the one in force (core/prefill_budget.py holds prompt chunks to it)."""

from __future__ import annotations

import time

from ortserve.v1 import types_pb2
from scheduler_service import convert as scheduler_convert
from scheduler_service.ledger.types import Lease
from worker_service.core.sequence import SequenceRequest
from worker_service.lease_lifecycle import check_against_lease


def lease_pb(max_itl_ms: int) -> types_pb2.Lease:
    return types_pb2.Lease(lease_id="l1", prompt_tokens=3, max_new_tokens=8,
                           max_itl_ms=max_itl_ms)


def test_a_request_without_a_goal_takes_the_leases_resolved_one():
    req = SequenceRequest("l1", (1, 2, 3), 8)
    assert check_against_lease(req, True, lease_pb(200)).max_itl_ms == 200


def test_the_strictest_of_the_requests_goal_and_the_leases_is_in_force():
    assert check_against_lease(SequenceRequest("l1", (1, 2, 3), 8, max_itl_ms=80), True,
                               lease_pb(200)).max_itl_ms == 80
    assert check_against_lease(SequenceRequest("l1", (1, 2, 3), 8, max_itl_ms=300), True,
                               lease_pb(200)).max_itl_ms == 200
    # An older scheduler's lease says nothing: the request's own goal.
    assert check_against_lease(SequenceRequest("l1", (1, 2, 3), 8, max_itl_ms=80), True,
                               lease_pb(0)).max_itl_ms == 80
    # The lease's ceiling is still applied beside it.
    held = check_against_lease(SequenceRequest("l1", (1, 2, 3), 2_000), False, lease_pb(200))
    assert held.max_new_tokens == 8 and held.max_itl_ms == 200


def test_the_ledgers_lease_carries_its_goal_on_the_wire_and_back():
    lease = Lease(lease_id="l1", worker_id="w1", request_id="r", prompt_tokens=3,
                  max_new_tokens=8, reserved_bytes=1, created_at=time.monotonic(),
                  max_itl_ms=150)
    wire = scheduler_convert.lease_to_pb(lease, time.monotonic())
    assert wire.max_itl_ms == 150
    assert scheduler_convert.lease_from_pb(wire, time.monotonic()).max_itl_ms == 150
