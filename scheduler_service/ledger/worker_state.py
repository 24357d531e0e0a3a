"""One registered worker as the ledger holds it: its geometry, its leases, their bytes (pure).

The ledger keeps one per worker under its lock and changes `reserved_bytes` only
through `Ledger._hold` / `Ledger._release`, which call `check_held` after each.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scheduler_service.ledger.types import BatchStats, Lease, PrefixCacheReport, WorkerGeometry


@dataclass
class WorkerState:
    geometry: WorkerGeometry
    last_heartbeat: float
    leases: dict[str, Lease] = field(default_factory=dict)
    reserved_bytes: int = 0
    draining: bool = False  # shutting down: no new placements, its leases run out
    # A call to it failed before it answered at all (connection refused): no new
    # placements until it shows it is alive again (its next heartbeat or registration).
    unreachable: bool = False
    batch: BatchStats = field(default_factory=BatchStats)
    prefix: PrefixCacheReport = field(default_factory=PrefixCacheReport)

    @property
    def available_bytes(self) -> int:
        return self.geometry.capacity_bytes - self.reserved_bytes

    @property
    def host_bytes(self) -> int:
        """Host bytes its sessions' parked copies hold: a tier apart, never capacity."""
        return sum(lease.host_bytes for lease in self.leases.values())

    @property
    def disk_bytes(self) -> int:
        """Bytes of its sessions' files in its disk tier: a tier apart, never capacity."""
        return sum(lease.disk_bytes for lease in self.leases.values())

    def without(self, lease: Lease) -> WorkerState:
        """This worker as if `lease` held nothing: a what-if view for a decision, never stored."""
        return replace(self, reserved_bytes=self.reserved_bytes - lease.reserved_bytes)

    def within(self, room_bytes: int) -> WorkerState:
        """This worker as if at most `room_bytes` were free (a tenant's room): a view, never stored."""
        free = min(self.available_bytes, room_bytes)
        return replace(self, reserved_bytes=self.geometry.capacity_bytes - free)


def check_held(worker: WorkerState) -> None:
    # NOTE: the invariant the ledger exists for, after every change of reserved bytes.
    assert 0 <= worker.reserved_bytes <= worker.geometry.capacity_bytes, worker
    assert worker.reserved_bytes == sum(lease.reserved_bytes for lease in worker.leases.values()), worker
