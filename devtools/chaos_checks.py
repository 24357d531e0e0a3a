"""The fault run's invariant checks on two GetBudget snapshots and, between them, what each
worker holds (devtools/chaos.py reads them; pure: no gRPC calls here).

A charge comes before a worker's KV and a release after it, so a lease a worker holds
when it is read is in one of the two snapshots around that read, unless it was charged
and released in between. A sum over the worker cannot be checked that way: a release
and a charge between the two looks make either snapshot's total smaller than what was
held in between. So rule 8 is checked per lease.
"""

from __future__ import annotations

import collections

from ortserve.v1 import scheduler_pb2


def budget_violations(*budgets: scheduler_pb2.Budget) -> list[dict]:
    """Within each snapshot: reserved <= capacity (in all and per worker), and each
    worker's reserved = the sum of its leases."""
    found = []
    for budget in budgets:
        if budget.total_reserved_bytes > budget.total_capacity_bytes:
            found.append({"check": "reserved <= capacity", "reserved": budget.total_reserved_bytes,
                          "capacity": budget.total_capacity_bytes})
        for w in budget.workers:
            leases = sum(lease.reserved_bytes for lease in w.leases)
            if w.reserved_bytes > w.capacity_bytes:
                found.append({"check": "worker reserved <= capacity", "worker": w.worker_id,
                              "reserved": w.reserved_bytes, "capacity": w.capacity_bytes})
            if w.reserved_bytes != leases:
                found.append({"check": "reserved = sum of leases", "worker": w.worker_id,
                              "reserved": w.reserved_bytes, "leases": leases})
    return found


class HeldLeaseCheck:
    """Rule 8 per lease, check after check (it remembers every lease id it saw charged)."""

    def __init__(self) -> None:
        self.seen_leases: set[str] = set()
        self.unverified = 0  # held leases born and gone between two looks: not comparable

    def check(self, helds: dict[str, dict[str, int]], before: scheduler_pb2.Budget,
              after: scheduler_pb2.Budget) -> list[dict]:
        """`helds`: worker id -> lease id -> KV bytes it holds (Worker.Info.held_leases),
        read between `before` and `after`. On workers registered in both looks, each held
        lease is charged at least that much in one of the two snapshots; one in neither
        that an earlier look had seen was released by the ledger while still held."""
        charged: dict[str, dict[str, int]] = collections.defaultdict(dict)
        present = collections.Counter()
        for budget in (before, after):
            for w in budget.workers:
                present[w.worker_id] += 1
                for lease in w.leases:
                    leases = charged[w.worker_id]
                    leases[lease.lease_id] = max(leases.get(lease.lease_id, 0), lease.reserved_bytes)
        found = []
        for worker_id, held in helds.items():
            if present[worker_id] != 2:
                continue  # (re-)registering or gone in between: outside the ledger then
            for lease_id, held_bytes in held.items():
                charge = charged[worker_id].get(lease_id)
                if charge is not None and held_bytes > charge:
                    found.append({"check": "held <= charged, per lease", "worker": worker_id,
                                  "lease_id": lease_id, "held": held_bytes, "charged": charge})
                elif charge is None and lease_id in self.seen_leases:
                    found.append({"check": "held lease is charged", "worker": worker_id,
                                  "lease_id": lease_id, "held": held_bytes,
                                  "detail": "the ledger released it and the worker still holds it"})
                elif charge is None:
                    self.unverified += 1
        self.seen_leases.update(lease_id for leases in charged.values() for lease_id in leases)
        return found
