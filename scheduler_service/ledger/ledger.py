"""The KV-cache byte-budget ledger: the scheduler's pure core (no grpc, no protobuf).

Every worker reports its `capacity_bytes`, `bytes_per_token`, allocation
granularity and context length. An admission reserves the worst case,
`(prompt_tokens + max_new_tokens) x bytes_per_token` rounded up to whole
blocks, so an admitted sequence can always run to completion. When that does
not fit, the ledger caps `max_new_tokens` to the most that fits, computing and
reserving it under one lock hold (reserve-at-most); it never reads the free
bytes in one step and reserves in another, and never reserves less than the
admitted ceiling needs.

Running out of budget is a returned value (an `Admission` with a `Rejection`),
not an exception; misuse (bad geometry, negative counts, releasing a lease a
worker is serving, a second live worker under one id) raises a DomainError (errors.py).
Every change of a worker's reserved bytes goes through `_hold` or `_release`,
which assert the invariant after each.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from scheduler_service.ledger import errors, placement
from scheduler_service.ledger.placement import no_worker_rejection  # noqa: F401 - re-exported
from scheduler_service.ledger.tenants import TenantTable
from scheduler_service.ledger.types import (  # noqa: F401 - re-exported: the ledger is the wing's public face
    Admission,
    AdmissionRequest,
    BatchStats,
    BudgetCap,
    CapLimit,
    Cause,
    Decision,
    Expired,
    Lease,
    NewTokensSource,
    PrefixCacheReport,
    Rejection,
    TenantRoom,
    TenantUsage,
    WorkerGeometry,
    WorkerSnapshot,
)


@dataclass
class _Worker:
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

    def without(self, lease: Lease) -> _Worker:
        """This worker as if `lease` held nothing: a what-if view for a decision, never stored."""
        return replace(self, reserved_bytes=self.reserved_bytes - lease.reserved_bytes)

    def within(self, room_bytes: int) -> _Worker:
        """This worker as if at most `room_bytes` were free (a tenant's room): a view, never stored."""
        free = min(self.available_bytes, room_bytes)
        return replace(self, reserved_bytes=self.geometry.capacity_bytes - free)


def _new_lease_id() -> str:
    return uuid.uuid4().hex


class Ledger:
    """Every worker's KV budget and every lease. Thread-safe: one lock."""

    def __init__(
        self,
        lease_ttl_s: float = 10.0,
        claim_ttl_s: float = 60.0,
        retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        new_lease_id: Callable[[], str] = _new_lease_id,
    ) -> None:
        self.lease_ttl_s = lease_ttl_s  # a worker silent this long is gone, leases too
        self.claim_ttl_s = claim_ttl_s  # a lease no worker claimed this long is dropped
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._new_lease_id = new_lease_id
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._lease_owner: dict[str, str] = {}  # lease_id -> worker_id
        self._tenants = TenantTable()
        # NOTE: expiry happens inside admit() too; recording here lets one place log them all.
        self._expired: list[Expired] = []

    # -- workers -------------------------------------------------------------

    def register(self, geometry: WorkerGeometry, live_leases: Iterable[Lease] = ()) -> list[str]:
        """Add or re-register a worker; returns the ids of leases it could not restore.

        Which leases it takes back is placement.restored's rule. A lease that
        would push reserved past capacity is refused, so the invariant holds
        even if the worker comes back smaller.
        """
        now = self._clock()
        refused: list[str] = []
        with self._lock:
            old = self._workers.get(geometry.worker_id)
            if old is not None and old.geometry.address != geometry.address:
                age = now - old.last_heartbeat
                if age <= self.lease_ttl_s:
                    raise errors.worker_id_in_use(geometry.worker_id, old.geometry.address,
                                                  geometry.address, age, self.lease_ttl_s)
            if old is not None:
                self._forget(old)
            worker = _Worker(geometry=geometry, last_heartbeat=now)
            candidates, gone = placement.restored(
                geometry.worker_id, live_leases, list(old.leases.values()) if old else [], now)
            self._expired += gone
            for lease in candidates:
                owner = self._lease_owner.get(lease.lease_id)
                if owner is not None or worker.reserved_bytes + lease.reserved_bytes > geometry.capacity_bytes:
                    refused.append(lease.lease_id)
                    continue
                self._hold(worker, replace(lease, created_at=lease.created_at or now))
            self._workers[geometry.worker_id] = worker
        return refused

    def heartbeat(self, worker_id: str, draining: bool = False,
                  batch: BatchStats | None = None,
                  prefix: PrefixCacheReport | None = None) -> bool:
        """Renew a worker and all its leases. False: unknown, it must register again.

        `draining` is sticky: a worker that said it is shutting down gets no new
        placements until it registers again.
        """
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return False
            worker.last_heartbeat = self._clock()
            worker.draining = worker.draining or draining
            worker.unreachable = False  # it answered us: alive, whatever failed before
            if batch is not None:
                worker.batch = batch
            if prefix is not None:
                worker.prefix = prefix
            return True

    def unreachable(self, worker_id: str) -> bool:
        """A call to the worker failed before it answered (its process gone, its port
        closed): place nothing new on it until its next heartbeat or registration, rather
        than until its lease TTL runs out. Its leases stay: expiry or its worker releases
        them. False: no such worker."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return False
            worker.unreachable = True
            return True

    def resize_for_adapter(self, worker_id: str, adapter: str, adapter_bytes: int,
                           loaded: bool) -> WorkerGeometry | None:
        """A worker loaded (or unloaded) a LoRA adapter: its capacity shrinks (grows) by the
        adapter's bytes and it lists (stops listing) the adapter, in one lock hold. A load
        that would leave its leases holding more than the smaller capacity raises
        ADAPTER_NO_ROOM and changes nothing. None: no such worker (it must register)."""
        if adapter_bytes < 0:
            raise ValueError(f"adapter_bytes must be >= 0, got {adapter_bytes}")
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return None
            g = worker.geometry
            held = dict(g.adapters)
            if loaded:
                if adapter in held:  # the same load told twice: already counted
                    return g
                # What stays must hold the leases, and one block (a worker below it never serves).
                if g.capacity_bytes - adapter_bytes < max(worker.reserved_bytes, g.block_bytes):
                    raise errors.adapter_no_room(worker_id, adapter, adapter_bytes,
                                                 g.capacity_bytes, worker.reserved_bytes,
                                                 "the ledger's leases on it")
                held[adapter] = adapter_bytes
                capacity = g.capacity_bytes - adapter_bytes
            else:
                if adapter not in held:
                    return g
                capacity = g.capacity_bytes + held.pop(adapter)
            worker.geometry = replace(g, capacity_bytes=capacity,
                                      adapters=tuple(sorted(held.items())))
            _check(worker)
            return worker.geometry

    def geometry(self, worker_id: str) -> WorkerGeometry | None:
        with self._lock:
            worker = self._workers.get(worker_id)
            return worker.geometry if worker else None

    # -- leases --------------------------------------------------------------

    def admit(self, request: AdmissionRequest, dry_run: bool = False) -> Admission:
        """Decide ADMITTED / CAPPED / REJECTED and, unless dry_run, reserve.

        The decision and the reservation happen under one lock hold.
        """
        with self._lock:
            self._expire_locked(self._clock())
            open_workers = [w for w in self._workers.values()
                            if not w.draining and not w.unreachable]
            decision = placement.decide(open_workers, request, self.retry_after_s)
            room = self._room(request.tenant, request.model)
            if room is not None:
                limited = placement.decide([w.within(room.room_bytes) for w in open_workers],
                                           request, self.retry_after_s)
                decision = placement.within_quota(decision, limited, request, room,
                                                  self.retry_after_s)
            decision = replace(decision, tenant=request.tenant)
            if dry_run or decision.decision is Decision.REJECTED:
                return replace(decision, dry_run=dry_run)
            assert decision.worker is not None
            worker = self._workers[decision.worker.worker_id]
            lease = Lease(
                lease_id=self._new_lease_id(),
                worker_id=worker.geometry.worker_id,
                request_id=request.request_id,
                prompt_tokens=request.prompt_tokens,
                max_new_tokens=decision.max_new_tokens,
                reserved_bytes=decision.reserved_bytes,
                budget_cap=decision.budget_cap,
                created_at=self._clock(),
                tenant=request.tenant,
                two_step=request.two_step,
            )
            self._hold(worker, lease)
            _check_room(room, lease.reserved_bytes)
            return replace(decision, lease=lease)

    def release(self, lease_id: str, worker_id: str = "") -> int:
        """Give a lease back. Idempotent: returns its bytes the first time, 0 after.

        A claimed lease is released only by its worker (`worker_id`), once it has
        freed the buffer: anyone else's release would offer bytes the worker
        still holds, so it raises LEASE_CLAIMED and changes nothing.
        """
        with self._lock:
            owner = self._lease_owner.get(lease_id)
            if owner is None:
                return 0
            worker = self._workers[owner]
            held = worker.leases[lease_id]
            if held.claimed and worker_id != owner:
                raise errors.lease_claimed(lease_id, owner, held.reserved_bytes)
            return self._release(worker, lease_id).reserved_bytes

    def release_unclaimed(self, lease_id: str) -> int:
        """Release a lease only if no worker has claimed it (then the worker owns the release).

        The scheduler calls this on its own exits: a claimed lease is released by
        its worker after the KV buffer is really freed, so the ledger never
        offers bytes a worker still holds; worker death is covered by expiry.
        """
        with self._lock:  # one hold: a worker may claim it between a check and a release
            worker_id = self._lease_owner.get(lease_id)
            if worker_id is None or self._workers[worker_id].leases[lease_id].claimed:
                return 0
            return self._release(self._workers[worker_id], lease_id).reserved_bytes

    def reconcile(self, worker_id: str, live_lease_ids: Iterable[str], grace_s: float) -> list[Lease]:
        """Release claimed leases the worker no longer reports (claimed > grace_s ago)."""
        live = set(live_lease_ids)
        now = self._clock()
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return []
            lost = [lease for lease in worker.leases.values()
                    if lease.claimed and lease.lease_id not in live
                    and now - lease.claimed_at > grace_s]
            for lease in lost:
                self._release(worker, lease.lease_id)
            return lost

    def claim(self, lease_id: str, worker_id: str,
              check: Callable[[Lease], None] | None = None) -> Lease | None:
        """A worker takes up a lease handed to it; None if not live or not its own.

        `check` sees the lease before it is marked claimed, under the same lock:
        when it raises (the request does not match the lease), nothing changes.
        """
        with self._lock:
            if self._lease_owner.get(lease_id) != worker_id:
                return None
            worker = self._workers[worker_id]
            lease = worker.leases[lease_id]
            if check is not None:
                check(lease)
            if not lease.claimed:
                lease = replace(lease, claimed=True, claimed_at=self._clock())
                worker.leases[lease_id] = lease
            return lease

    def lease(self, lease_id: str) -> Lease | None:
        with self._lock:
            worker_id = self._lease_owner.get(lease_id)
            return self._workers[worker_id].leases[lease_id] if worker_id else None

    def expire(self) -> list[Expired]:
        """Drop silent workers (their leases with them) and unclaimed stale leases.

        Returns every lease dropped since the last call, whoever dropped it
        (admit() expires too): the caller logs them, in one place.
        """
        with self._lock:
            self._expire_locked(self._clock())
            expired, self._expired = self._expired, []
            return expired

    def take_expired(self) -> list[Expired]:
        """The leases dropped since the last call (admit() expires as it decides), with no
        new scan: the admission path drains the log with this, not with expire()."""
        with self._lock:
            expired, self._expired = self._expired, []
            return expired

    # -- reading -------------------------------------------------------------

    def snapshot(self) -> list[WorkerSnapshot]:
        now = self._clock()
        with self._lock:
            return [
                WorkerSnapshot(
                    geometry=w.geometry,
                    reserved_bytes=w.reserved_bytes,
                    heartbeat_age_s=now - w.last_heartbeat,
                    leases=tuple(w.leases.values()),
                    draining=w.draining,
                    unreachable=w.unreachable,
                    batch=w.batch,
                    prefix=w.prefix,
                )
                for w in sorted(self._workers.values(), key=lambda w: w.geometry.worker_id)
            ]

    def reserved_bytes(self) -> int:
        with self._lock:
            return sum(w.reserved_bytes for w in self._workers.values())

    # -- tenants -------------------------------------------------------------------

    @property
    def tenants(self) -> TenantTable:
        return self._tenants

    def set_tenants(self, table: TenantTable) -> None:
        """Put a tenants table in force (start, SIGHUP). Leases keep their tenant; a quota
        lowered below what a tenant holds admits nothing more for it until it is back under
        (no preemption: what is admitted runs to completion)."""
        with self._lock:
            self._tenants = table

    def tenant_reserved(self) -> dict[tuple[str, str], int]:
        """(tenant, model) -> the bytes its leases hold there: the queue's fair-share look."""
        with self._lock:
            held: dict[tuple[str, str], int] = {}
            for w in self._workers.values():
                for lease in w.leases.values():
                    key = (lease.tenant, w.geometry.model)
                    held[key] = held.get(key, 0) + lease.reserved_bytes
            return held

    def tenant_usage(self) -> list[TenantUsage]:
        """Every configured tenant on every served model, and any other tenant that holds
        leases, sorted by (tenant, model)."""
        with self._lock:
            table = self._tenants
            rows: dict[tuple[str, str], list[int]] = {}
            capacity: dict[str, int] = {}
            for w in self._workers.values():
                model = w.geometry.model
                capacity[model] = capacity.get(model, 0) + w.geometry.capacity_bytes
                for lease in w.leases.values():
                    row = rows.setdefault((lease.tenant, model), [0, 0])
                    row[0] += lease.reserved_bytes
                    row[1] += 1
            for name in table.tenants:
                for model in capacity:
                    rows.setdefault((name, model), [0, 0])
            return [TenantUsage(tenant=name, model=model, reserved_bytes=held, leases=n,
                                quota_bytes=table.quota_bytes(name, model, capacity.get(model, 0)),
                                weight=table.weight(name))
                    for (name, model), (held, n) in sorted(rows.items())]

    # -- internals (lock held) ---------------------------------------------------

    def _hold(self, worker: _Worker, lease: Lease) -> None:
        """`lease` now holds its reserved_bytes on `worker`: a new lease, or a held one resized."""
        before = worker.leases.get(lease.lease_id)
        worker.leases[lease.lease_id] = lease  # a resized lease keeps its place in the snapshot
        worker.reserved_bytes += lease.reserved_bytes - (before.reserved_bytes if before else 0)
        self._lease_owner[lease.lease_id] = worker.geometry.worker_id
        _check(worker)

    def _release(self, worker: _Worker, lease_id: str) -> Lease:
        """Drop a held lease and its bytes: the one way a lease's bytes return (`_forget` drops
        a whole worker, whose sum goes with it)."""
        lease = worker.leases.pop(lease_id)
        del self._lease_owner[lease_id]
        worker.reserved_bytes -= lease.reserved_bytes
        _check(worker)
        return lease

    def _forget(self, worker: _Worker) -> None:
        """Drop a whole worker: its leases' bytes go with it, nothing is left to sum."""
        del self._workers[worker.geometry.worker_id]
        for lease_id in worker.leases:
            self._lease_owner.pop(lease_id, None)

    def _room(self, tenant: str, model: str, own: Lease | None = None) -> TenantRoom | None:
        """Tenant's quota on `model` ("": every worker) and what its leases hold there
        (`own`'s bytes not counted: a session's lease is its own to reuse); None: no quota."""
        if not tenant:
            return None
        workers = placement.serving(self._workers.values(), model)
        capacity = sum(w.geometry.capacity_bytes for w in workers)
        record = self._tenants.get(tenant)
        quota = record.quota_for(model) if record else None
        if quota is None:
            return None
        held = sum(lease.reserved_bytes for w in workers for lease in w.leases.values()
                   if lease.tenant == tenant)
        if own is not None and own.tenant == tenant:
            held -= own.reserved_bytes
        return TenantRoom(tenant=tenant, model=model, quota_bytes=quota.bytes_of(capacity),
                          reserved_bytes=held, capacity_bytes=capacity, share=quota.share)

    def _expire_locked(self, now: float) -> None:
        expired = self._expired
        for worker_id in list(self._workers):
            worker = self._workers[worker_id]
            if now - worker.last_heartbeat > self.lease_ttl_s:
                expired += [Expired(lease, "worker silent", now - lease.created_at)
                            for lease in worker.leases.values()]
                self._forget(worker)
                continue
            for lease in list(worker.leases.values()):
                if not lease.claimed and now - lease.created_at > self.claim_ttl_s:
                    self._release(worker, lease.lease_id)
                    expired.append(Expired(lease, "never claimed", now - lease.created_at))

    # -- sessions (one lease per session, resized per turn; sessions/registry.py drives these) --

    def open_session_lease(self, request_id: str, model: str = "", tenant: str = "",
                           adapter: str = "") -> Lease | None:
        """A 0-byte lease for a new session on the worker of `model` ("": any) serving LoRA
        `adapter` ("": the base) with the most free bytes; None when none is registered. Its
        worker claims it when it opens the session."""
        with self._lock:
            self._expire_locked(self._clock())
            candidates = [w for w in placement.serving(self._workers.values(), model)
                          if w.geometry.serves_adapter(adapter)]
            if not candidates:
                return None
            worker = max(candidates, key=lambda w: (w.available_bytes, -len(w.leases),
                                                    w.geometry.worker_id))
            lease = Lease(lease_id=self._new_lease_id(), worker_id=worker.geometry.worker_id,
                          request_id=request_id, prompt_tokens=0, max_new_tokens=0,
                          reserved_bytes=0, created_at=self._clock(), session=True,
                          tenant=tenant)
            self._hold(worker, lease)
            return lease

    def resize(self, lease_id: str, request: AdmissionRequest, dry_run: bool = False) -> Admission:
        """A session turn's admission on its own lease's worker: reserve-at-most.

        The lease's current bytes count as available to it (they are its own),
        so the turn is ADMITTED, CAPPED or REJECTED exactly as a fresh request
        on that worker would be with those bytes free. REJECTED leaves the
        lease as it was; otherwise it now holds prompt + admitted max_new, with
        this turn's cap (or none). An unknown lease is REJECTED NO_WORKER.
        `dry_run` decides and changes nothing (the admission queue's look, as admit's).
        """
        with self._lock:
            self._expire_locked(self._clock())
            owner = self._lease_owner.get(lease_id)
            if owner is None:
                return placement.reject(request, Cause.NO_WORKER, retry_after_s=self.retry_after_s)
            worker = self._workers[owner]
            lease = worker.leases[lease_id]
            if not placement.fits_context(request, worker.geometry):
                return placement.reject_context(request, worker)
            freed = worker.without(lease)
            decision = placement.decide_on(freed, request, self.retry_after_s)
            # A session's turns count against the tenant that opened it.
            room = self._room(lease.tenant, worker.geometry.model, own=lease)
            if room is not None:
                limited = placement.decide_on(freed.within(room.room_bytes), request,
                                              self.retry_after_s)
                decision = placement.within_quota(decision, limited, request, room,
                                                  self.retry_after_s)
            decision = replace(decision, tenant=lease.tenant)
            if dry_run or decision.decision is Decision.REJECTED:
                return replace(decision, dry_run=dry_run)
            grown = replace(lease, prompt_tokens=request.prompt_tokens,
                            max_new_tokens=decision.max_new_tokens,
                            reserved_bytes=decision.reserved_bytes,
                            budget_cap=decision.budget_cap, request_id=request.request_id)
            self._hold(worker, grown)
            _check_room(room, grown.reserved_bytes)
            return replace(decision, lease=grown)

    def shrink(self, lease_id: str, worker_id: str, held_tokens: int) -> Lease | None:
        """The lease's worker freed KV: reserve what `held_tokens` need (never more than now).

        Only the lease's worker shrinks it, after freeing: the ledger then never
        offers bytes the worker still holds. The last turn's cap stays on the lease.
        """
        if held_tokens < 0:
            raise ValueError(f"held_tokens must be >= 0, got {held_tokens}")
        with self._lock:
            if self._lease_owner.get(lease_id) != worker_id:
                return None
            worker = self._workers[worker_id]
            lease = worker.leases[lease_id]
            new_bytes = min(worker.geometry.bytes_for(held_tokens), lease.reserved_bytes)
            lease = replace(lease, reserved_bytes=new_bytes)
            self._hold(worker, lease)
            return lease


def _check(worker: _Worker) -> None:
    # NOTE: the invariant this whole module exists for, after every change of reserved bytes.
    assert 0 <= worker.reserved_bytes <= worker.geometry.capacity_bytes, worker
    assert worker.reserved_bytes == sum(lease.reserved_bytes for lease in worker.leases.values()), worker


def _check_room(room: TenantRoom | None, granted_bytes: int) -> None:
    # NOTE: a tenant's grant never takes it past its quota (one lock hold with the decision).
    assert room is None or room.reserved_bytes + granted_bytes <= room.quota_bytes, (room, granted_bytes)
