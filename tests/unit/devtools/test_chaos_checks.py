"""The fault run's rule-8 check (devtools/chaos_checks.py): per lease, between two snapshots.

A worker's total cannot be compared with either snapshot's: lease A released and lease B
charged between the two looks leave each snapshot below the A + B the worker held in
between (what the 10-minute run once reported as held above charged). Per lease it can."""

from __future__ import annotations

from devtools.chaos_checks import HeldLeaseCheck, budget_violations
from ortserve.v1 import scheduler_pb2, types_pb2

KIB = 1024


def budget(*leases: tuple[str, int], worker_id: str = "worker-0",
           capacity: int = 2048 * KIB) -> scheduler_pb2.Budget:
    reserved = sum(n for _, n in leases)
    return scheduler_pb2.Budget(
        total_reserved_bytes=reserved, total_capacity_bytes=capacity,
        workers=[scheduler_pb2.WorkerBudget(
            worker_id=worker_id, reserved_bytes=reserved, capacity_bytes=capacity,
            leases=[types_pb2.Lease(lease_id=i, reserved_bytes=n) for i, n in leases])])


def test_a_release_and_a_charge_between_the_looks_is_not_a_violation():
    before, after = budget(("a", 512 * KIB)), budget(("b", 320 * KIB))
    held = {"worker-0": {"a": 512 * KIB, "b": 320 * KIB}}  # both, in between
    assert HeldLeaseCheck().check(held, before, after) == []


def test_a_lease_held_above_its_charge_is_a_violation():
    [found] = HeldLeaseCheck().check({"worker-0": {"a": 600 * KIB}},
                                     budget(("a", 512 * KIB)), budget(("a", 512 * KIB)))
    assert found["lease_id"] == "a" and found["held"] > found["charged"]


def test_a_lease_held_after_the_ledger_released_it_is_a_violation():
    check = HeldLeaseCheck()
    assert check.check({"worker-0": {}}, budget(("a", 64 * KIB)), budget(("a", 64 * KIB))) == []
    [found] = check.check({"worker-0": {"a": 64 * KIB}}, budget(), budget())
    assert found["check"] == "held lease is charged"


def test_a_lease_born_and_gone_between_the_looks_is_counted_unverified():
    check = HeldLeaseCheck()
    assert check.check({"worker-0": {"c": 64 * KIB}}, budget(), budget()) == []
    assert check.unverified == 1


def test_a_worker_missing_from_a_snapshot_is_not_checked():
    check = HeldLeaseCheck()
    after = scheduler_pb2.Budget()  # forgotten (silent past the TTL) in between
    assert check.check({"worker-0": {"a": 1024 * KIB}}, budget(("a", 64 * KIB)), after) == []
    assert check.seen_leases == {"a"}


def test_each_snapshot_keeps_reserved_within_capacity_and_equal_to_its_leases():
    assert budget_violations(budget(("a", 64 * KIB))) == []
    over = budget(("a", 4096 * KIB))
    assert {f["check"] for f in budget_violations(over)} == {
        "reserved <= capacity", "worker reserved <= capacity"}
    off = budget(("a", 64 * KIB))
    off.workers[0].reserved_bytes = 128 * KIB
    assert [f["check"] for f in budget_violations(off)] == ["reserved = sum of leases"]
