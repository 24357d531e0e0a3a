"""The KV-cache byte-budget ledger: the scheduler's pure core (no grpc, no protobuf).

Every worker reports its `capacity_bytes`, `bytes_per_token`, allocation
granularity and context length. An admission reserves the worst case,
`(prompt_tokens + max_new_tokens) x bytes_per_token` rounded up to whole
blocks, so an admitted sequence can always run to completion. When that does
not fit, the ledger caps `max_new_tokens` to the most that fits, computing and
reserving it under one lock hold (reserve-at-most); it never reads the free
bytes in one step and reserves in another, and never reserves less than the
admitted ceiling needs.

Running out of budget is a returned value (an `AdmissionDecision` with a `Rejection`),
not an exception; misuse (bad geometry, negative counts, releasing a lease a
worker is serving, a second live worker under one id) raises a DomainError (errors.py).
Every change of a worker's reserved bytes goes through `_hold` or `_release`,
which assert the invariant after each (worker_state.check_held).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace

from scheduler_service.ledger import (
    errors,
    placement,
    session_lease_rules,
    tenant_holdings,
    time_admission,
    time_budget,
)
from scheduler_service.ledger.placement import no_worker_rejection  # noqa: F401 - re-exported
from scheduler_service.ledger.step_model import PromptPace, StepModel, StepSample
from scheduler_service.ledger.tenants import TenantTable
from scheduler_service.ledger.time_budget import TimeGoals, WorkerTime
from scheduler_service.ledger.types import (  # noqa: F401 - re-exported: the ledger is the wing's public face
    AdmissionDecision,
    AdmissionRequest,
    BatchStats,
    CapLimit,
    Cause,
    Decision,
    Expired,
    Lease,
    NewTokensCap,
    NewTokensSource,
    PrefixCacheReport,
    Rejection,
    TenantRoom,
    TenantUsage,
    WorkerGeometry,
    WorkerSnapshot,
)
from scheduler_service.ledger.worker_state import WorkerState, check_held


def _new_lease_id() -> str:
    return uuid.uuid4().hex


class Ledger:
    """Every worker's KV budget and every lease. Thread-safe: one lock.

    A session's lease (open, resize per turn, shrink) is decided by
    session_lease_rules.py and held here, under the same lock, like any lease."""

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
        self._workers: dict[str, WorkerState] = {}
        self._lease_owner: dict[str, str] = {}  # lease_id -> worker_id
        self._tenants = TenantTable()
        # NOTE: expiry happens inside admit() too; recording here lets one place log them all.
        self._expired: list[Expired] = []
        # Time beside bytes (time_budget.py): the server's default goals (0: none, the
        # default: bytes alone) and each worker's measured step time by rows, by worker id.
        self.time_goals = TimeGoals()
        self._step_models: dict[str, StepModel] = {}

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
            worker = WorkerState(geometry=geometry, last_heartbeat=now)
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

    def heartbeat(self, worker_id: str, draining: bool = False, address: str = "",
                  batch: BatchStats | None = None,
                  prefix: PrefixCacheReport | None = None,
                  steps: Iterable[StepSample] = (),
                  prefill: PromptPace | None = None) -> bool:
        """Renew a worker and all its leases. False: unknown, it must register again.

        `steps`: its decode steps' wall time by rows since its last heartbeat, for the
        time budget (step_model.py); `prefill`: what a prompt token costs it now and its
        chunk (the TTFT prediction's prompt pace; None: not said).

        `draining` is sticky: a worker that said it is shutting down gets no new
        placements until it registers again.

        `address`: where the sender registered. Another address is another process
        under this id (registration refused it: WORKER_ID_IN_USE), so it is treated as
        unknown and changes nothing: a refused duplicate that stops must not drain the
        live worker. Empty: not checked.
        """
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or (address and address != worker.geometry.address):
                return False
            worker.last_heartbeat = self._clock()
            worker.draining = worker.draining or draining
            worker.unreachable = False  # it answered us: alive, whatever failed before
            if batch is not None:
                worker.batch = batch
            if prefix is not None:
                worker.prefix = prefix
            for sample in steps:
                self._step_models.setdefault(worker_id, StepModel()).observe(sample)
            if prefill is not None and prefill.prompt_token_ms > 0:
                self._step_models.setdefault(worker_id, StepModel()).prefill = prefill
            return True

    def forget_worker(self, worker_id: str, address: str = "") -> list[Lease] | None:
        """A worker stopped cleanly and said so (Deregister): drop it now, not after
        lease_ttl_s, so the same id registers again at once. Returns the leases dropped
        with it (each once: a later release of one finds nothing and returns 0); None when
        no such worker is registered, or it registered from another `address` (a refused
        duplicate's goodbye must not take the live worker away; "": not checked)."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or (address and address != worker.geometry.address):
                return None
            dropped = list(worker.leases.values())
            self._forget(worker)
            self._step_models.pop(worker_id, None)  # a worker back later measures anew
            return dropped

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
                           loaded: bool, path: str = "") -> WorkerGeometry | None:
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
            held, paths = dict(g.adapters), dict(g.adapter_paths)
            if loaded:
                if adapter in held:  # the same load told twice: already counted
                    return g
                # What stays must hold the leases, and one block (a worker below it never serves).
                if g.capacity_bytes - adapter_bytes < max(worker.reserved_bytes, g.block_bytes):
                    raise errors.adapter_no_room(worker_id, adapter, adapter_bytes,
                                                 g.capacity_bytes, worker.reserved_bytes,
                                                 "the ledger's leases on it")
                held[adapter] = adapter_bytes
                if path:
                    paths[adapter] = path
                capacity = g.capacity_bytes - adapter_bytes
            else:
                if adapter not in held:
                    return g
                capacity = g.capacity_bytes + held.pop(adapter)
                paths.pop(adapter, None)
            worker.geometry = replace(g, capacity_bytes=capacity,
                                      adapters=tuple(sorted(held.items())),
                                      adapter_paths=tuple(sorted(paths.items())))
            check_held(worker)
            return worker.geometry

    def geometry(self, worker_id: str) -> WorkerGeometry | None:
        with self._lock:
            worker = self._workers.get(worker_id)
            return worker.geometry if worker else None

    # -- leases --------------------------------------------------------------

    def admit(self, request: AdmissionRequest, dry_run: bool = False) -> AdmissionDecision:
        """Decide ADMITTED / CAPPED / REJECTED and, unless dry_run, reserve.

        The decision and the reservation happen under one lock hold.
        """
        with self._lock:
            self._expire_locked(self._clock())
            open_workers = [w for w in self._workers.values()
                            if not w.draining and not w.unreachable]
            room = self._room(request.tenant, request.model)
            decision = self._decide(open_workers, request, room)
            # NOTE: a decision time takes again on other workers is the tenant's too: the
            # quota binds wherever the request goes.
            decision = time_admission.decided(
                decision, request, open_workers, self._step_models, self.time_goals,
                self._clock(), self.retry_after_s,
                lambda subset: self._decide(subset, request, room))
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
                max_itl_ms=time_admission.goals_of(request, self.time_goals)[0],
            )
            self._hold(worker, lease)
            tenant_holdings.check_room(room, lease.reserved_bytes)
            return replace(decision, lease=lease)

    def _decide(self, workers: list[WorkerState], request: AdmissionRequest,
                room: TenantRoom | None) -> AdmissionDecision:
        """The bytes' decision over `workers`, within the tenant's `room` when it has a quota
        (placement.within_quota). Lock held."""
        decision = placement.decide(workers, request, self.retry_after_s)
        if room is None:
            return decision
        limited = placement.decide([w.within(room.room_bytes) for w in workers], request,
                                   self.retry_after_s)
        return placement.within_quota(decision, limited, request, room, self.retry_after_s)

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

    # -- a session's one lease (session_lease_rules.py decides; held as any lease) ------

    def open_session_lease(self, request_id: str, model: str = "", tenant: str = "",
                           adapter: str = "", preferred_worker: str = "") -> Lease | None:
        """A 0-byte lease for a new session, on the worker session_lease_rules.session_worker
        picks; None when none serves `model` and `adapter`. Its worker claims it when it
        opens the session."""
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            worker = session_lease_rules.session_worker(self._workers.values(), model, adapter,
                                                        preferred_worker)
            if worker is None:
                return None
            lease = session_lease_rules.opened_lease(worker, self._new_lease_id(), request_id,
                                                     tenant, now)
            self._hold(worker, lease)
            return lease

    def resize(self, lease_id: str, request: AdmissionRequest,
               dry_run: bool = False) -> AdmissionDecision:
        """A session turn's admission on its own lease's worker, reserve-at-most
        (session_lease_rules.turn_decision), decided and held under one lock hold.

        REJECTED leaves the lease as it was; otherwise it holds the turn (grown_lease).
        An unknown lease is REJECTED NO_WORKER. `dry_run` decides and changes nothing
        (the admission queue's look, as admit's)."""
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            owner = self._lease_owner.get(lease_id)
            if owner is None:
                return placement.reject(request, Cause.NO_WORKER, retry_after_s=self.retry_after_s)
            worker = self._workers[owner]
            lease = worker.leases[lease_id]
            room = self._room(lease.tenant, worker.geometry.model, own=lease)
            decision = session_lease_rules.turn_decision(
                worker, lease, request, room, self._step_models, self.time_goals, now,
                self.retry_after_s)
            if dry_run or decision.decision is Decision.REJECTED:
                return replace(decision, dry_run=dry_run)
            grown = session_lease_rules.grown_lease(lease, request, decision, self.time_goals, now)
            self._hold(worker, grown)
            tenant_holdings.check_room(room, grown.reserved_bytes)
            return replace(decision, lease=grown)

    def shrink(self, lease_id: str, worker_id: str, held_tokens: int, host_bytes: int = 0,
               disk_bytes: int = 0, if_request_id: str = "") -> Lease | None:
        """The lease's worker freed KV: reserve what `held_tokens` need, never more than now
        (session_lease_rules.shrunk_lease). Only the lease's worker shrinks it, after
        freeing: the ledger then never offers bytes the worker still holds.
        `if_request_id`: change nothing (None) unless the lease still serves that request
        (a worker's own move to disk must not shrink a turn the scheduler admitted since).
        """
        if held_tokens < 0 or host_bytes < 0 or disk_bytes < 0:
            raise ValueError(f"held_tokens, host_bytes and disk_bytes must be >= 0, got "
                             f"{held_tokens}, {host_bytes}, {disk_bytes}")
        with self._lock:
            if self._lease_owner.get(lease_id) != worker_id:
                return None
            worker = self._workers[worker_id]
            lease = worker.leases[lease_id]
            if if_request_id and lease.request_id != if_request_id:
                return None
            lease = session_lease_rules.shrunk_lease(lease, worker.geometry, held_tokens,
                                                     host_bytes, disk_bytes)
            self._hold(worker, lease)
            return lease

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

    def worker_times(self) -> list[WorkerTime]:
        """Each worker's time budget now (GetBudget, the metrics), by worker id."""
        with self._lock:
            return [time_budget.worker_time(w.geometry.worker_id,
                                            self._step_models.get(w.geometry.worker_id),
                                            w.leases.values())
                    for w in sorted(self._workers.values(), key=lambda w: w.geometry.worker_id)]

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
            return tenant_holdings.reserved(self._workers.values())

    def tenant_usage(self) -> list[TenantUsage]:
        """Every configured tenant on every served model, and any other tenant that holds
        leases, sorted by (tenant, model)."""
        with self._lock:
            return tenant_holdings.usage(self._workers.values(), self._tenants)

    # -- internals (lock held) ---------------------------------------------------

    def _hold(self, worker: WorkerState, lease: Lease) -> None:
        """`lease` now holds its reserved_bytes on `worker`: a new lease, or a held one resized."""
        before = worker.leases.get(lease.lease_id)
        worker.leases[lease.lease_id] = lease  # a resized lease keeps its place in the snapshot
        worker.reserved_bytes += lease.reserved_bytes - (before.reserved_bytes if before else 0)
        self._lease_owner[lease.lease_id] = worker.geometry.worker_id
        check_held(worker)

    def _release(self, worker: WorkerState, lease_id: str) -> Lease:
        """Drop a held lease and its bytes: the one way a lease's bytes return (`_forget` drops
        a whole worker, whose sum goes with it)."""
        lease = worker.leases.pop(lease_id)
        del self._lease_owner[lease_id]
        worker.reserved_bytes -= lease.reserved_bytes
        check_held(worker)
        return lease

    def _forget(self, worker: WorkerState) -> None:
        """Drop a whole worker: its leases' bytes go with it, nothing is left to sum."""
        del self._workers[worker.geometry.worker_id]
        for lease_id in worker.leases:
            self._lease_owner.pop(lease_id, None)

    def _room(self, tenant: str, model: str, own: Lease | None = None) -> TenantRoom | None:
        """Tenant's quota on `model` ("": every worker) and what its leases hold there
        (`own`'s bytes not counted: a session's lease is its own to reuse); None: no quota."""
        return tenant_holdings.room(self._workers.values(), self._tenants, tenant, model, own)

    def _expire_locked(self, now: float) -> None:
        expired = self._expired
        for worker_id in list(self._workers):
            worker = self._workers[worker_id]
            if now - worker.last_heartbeat > self.lease_ttl_s:
                expired += [Expired(lease, "worker silent", now - lease.created_at)
                            for lease in worker.leases.values()]
                self._forget(worker)
                self._step_models.pop(worker_id, None)  # a worker back later measures anew
                continue
            for lease in list(worker.leases.values()):
                if not lease.claimed and now - lease.created_at > self.claim_ttl_s:
                    self._release(worker, lease.lease_id)
                    expired.append(Expired(lease, "never claimed", now - lease.created_at))
