"""What each tenant's leases hold across the ledger's workers, and the room its quota leaves (pure).

The ledger calls these under its lock with its `WorkerState`s; the tenants
table (tenants.py) says the quotas and weights, these functions sum the leases.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_service.ledger import placement
from scheduler_service.ledger.tenants import TenantTable
from scheduler_service.ledger.types import Lease, TenantRoom, TenantUsage
from scheduler_service.ledger.worker_state import WorkerState


def reserved(workers: Iterable[WorkerState]) -> dict[tuple[str, str], int]:
    """(tenant, model) -> the bytes its leases hold there: the queue's fair-share look."""
    held: dict[tuple[str, str], int] = {}
    for w in workers:
        for lease in w.leases.values():
            key = (lease.tenant, w.geometry.model)
            held[key] = held.get(key, 0) + lease.reserved_bytes
    return held


def usage(workers: Iterable[WorkerState], table: TenantTable) -> list[TenantUsage]:
    """Every configured tenant on every served model, and any other tenant that holds
    leases, sorted by (tenant, model)."""
    rows: dict[tuple[str, str], list[int]] = {}
    capacity: dict[str, int] = {}
    for w in workers:
        model = w.geometry.model
        capacity[model] = capacity.get(model, 0) + w.geometry.capacity_bytes
        for lease in w.leases.values():
            row = rows.setdefault((lease.tenant, model), [0, 0, 0, 0])
            row[0] += lease.reserved_bytes
            row[1] += 1
            row[2] += lease.host_bytes
            row[3] += lease.disk_bytes
    for name in table.tenants:
        for model in capacity:
            rows.setdefault((name, model), [0, 0, 0, 0])
    return [TenantUsage(tenant=name, model=model, reserved_bytes=held, leases=n,
                        quota_bytes=table.quota_bytes(name, model, capacity.get(model, 0)),
                        weight=table.weight(name), host_bytes=host, disk_bytes=disk)
            for (name, model), (held, n, host, disk) in sorted(rows.items())]


def room(workers: Iterable[WorkerState], table: TenantTable, tenant: str, model: str,
         own: Lease | None = None) -> TenantRoom | None:
    """Tenant's quota on `model` ("": every worker) and what its leases hold there
    (`own`'s bytes not counted: a session's lease is its own to reuse); None: no quota."""
    if not tenant:
        return None
    serving = placement.serving(workers, model)
    capacity = sum(w.geometry.capacity_bytes for w in serving)
    record = table.get(tenant)
    quota = record.quota_for(model) if record else None
    if quota is None:
        return None
    held = sum(lease.reserved_bytes for w in serving for lease in w.leases.values()
               if lease.tenant == tenant)
    if own is not None and own.tenant == tenant:
        held -= own.reserved_bytes
    return TenantRoom(tenant=tenant, model=model, quota_bytes=quota.bytes_of(capacity),
                      reserved_bytes=held, capacity_bytes=capacity, share=quota.share)


def check_room(room: TenantRoom | None, granted_bytes: int) -> None:
    # NOTE: a tenant's grant never takes it past its quota (one lock hold with the decision).
    assert room is None or room.reserved_bytes + granted_bytes <= room.quota_bytes, (room, granted_bytes)
