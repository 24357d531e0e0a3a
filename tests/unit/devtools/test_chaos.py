"""The fault run's rule-8 check (devtools/chaos.py): per lease, between two snapshots.

A worker's total cannot be compared with either snapshot's: lease A released and lease B
charged between the two looks leave each snapshot below the A + B the worker held in
between (what the 10-minute run reported as held above charged). Per lease it can."""

from __future__ import annotations

import collections

from devtools.chaos import Chaos, Tally
from ortserve.v1 import scheduler_pb2, types_pb2

KIB = 1024


def budget(*leases: tuple[str, int], worker_id: str = "worker-0") -> scheduler_pb2.Budget:
    return scheduler_pb2.Budget(workers=[scheduler_pb2.WorkerBudget(
        worker_id=worker_id, reserved_bytes=sum(n for _, n in leases),
        leases=[types_pb2.Lease(lease_id=i, reserved_bytes=n) for i, n in leases])])


def checker() -> Chaos:
    chaos = Chaos.__new__(Chaos)  # the check alone: no cluster
    chaos.tally, chaos.seen_leases = Tally(), set()
    return chaos


def test_a_release_and_a_charge_between_the_looks_is_not_a_violation():
    chaos = checker()
    before, after = budget(("a", 512 * KIB)), budget(("b", 320 * KIB))
    held = {"worker-0": {"a": 512 * KIB, "b": 320 * KIB}}  # both, in between
    assert chaos.held_within_charges(held, before, after) == []


def test_a_lease_held_above_its_charge_is_a_violation():
    chaos = checker()
    [found] = chaos.held_within_charges({"worker-0": {"a": 600 * KIB}},
                                        budget(("a", 512 * KIB)), budget(("a", 512 * KIB)))
    assert found["lease_id"] == "a" and found["held"] > found["charged"]


def test_a_lease_held_after_the_ledger_released_it_is_a_violation():
    chaos = checker()
    assert chaos.held_within_charges({"worker-0": {}}, budget(("a", 64 * KIB)),
                                     budget(("a", 64 * KIB))) == []
    [found] = chaos.held_within_charges({"worker-0": {"a": 64 * KIB}}, budget(), budget())
    assert found["check"] == "held lease is charged"


def test_a_lease_born_and_gone_between_the_looks_is_counted_unverified():
    chaos = checker()
    assert chaos.held_within_charges({"worker-0": {"c": 64 * KIB}}, budget(), budget()) == []
    assert chaos.tally.unverified_leases == 1


def test_a_worker_missing_from_a_snapshot_is_not_checked():
    chaos = checker()
    before = budget(("a", 64 * KIB))
    after = scheduler_pb2.Budget()  # forgotten (silent past the TTL) in between
    assert chaos.held_within_charges({"worker-0": {"a": 1024 * KIB}}, before, after) == []
    assert collections.Counter(chaos.seen_leases) == {"a": 1}
