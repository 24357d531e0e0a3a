"""A session's one lease in the ledger: opened at 0 bytes, resized per turn, shrunk after a free (pure).

`Ledger` takes these methods in (sessions/registry.py drives them); they run
under the ledger's one lock, on its workers and leases, and change reserved
bytes only through `_hold`, as every other ledger operation does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from scheduler_service.ledger import placement, tenant_holdings, time_admission
from scheduler_service.ledger.step_model import StepModel
from scheduler_service.ledger.time_budget import TimeGoals
from scheduler_service.ledger.types import (
    AdmissionDecision,
    AdmissionRequest,
    Cause,
    Decision,
    Lease,
    TenantRoom,
)
from scheduler_service.ledger.worker_state import WorkerState


class LedgerSessionLeases:
    """The ledger's session-lease operations; `Ledger` provides the state below."""

    retry_after_s: float
    _clock: Callable[[], float]
    _new_lease_id: Callable[[], str]
    _lock: threading.Lock
    _workers: dict[str, WorkerState]
    _lease_owner: dict[str, str]
    time_goals: TimeGoals
    _step_models: dict[str, StepModel]

    if TYPE_CHECKING:  # defined by Ledger
        def _expire_locked(self, now: float) -> None: ...
        def _hold(self, worker: WorkerState, lease: Lease) -> None: ...
        def _room(self, tenant: str, model: str, own: Lease | None = None) -> TenantRoom | None: ...


    def open_session_lease(self, request_id: str, model: str = "", tenant: str = "",
                           adapter: str = "", preferred_worker: str = "") -> Lease | None:
        """A 0-byte lease for a new session on the worker of `model` ("": any) serving LoRA
        `adapter` ("": the base): `preferred_worker` where it is one of them (a placement
        hint, as an admission's), else the one with the most free bytes; None when none is
        registered. Its worker claims it when it opens the session."""
        with self._lock:
            self._expire_locked(self._clock())
            candidates = [w for w in placement.serving(self._workers.values(), model)
                          if w.geometry.serves_adapter(adapter)]
            if not candidates:
                return None
            worker = max(candidates, key=lambda w: (
                bool(preferred_worker) and w.geometry.worker_id == preferred_worker,
                w.available_bytes, -len(w.leases), w.geometry.worker_id))
            lease = Lease(lease_id=self._new_lease_id(), worker_id=worker.geometry.worker_id,
                          request_id=request_id, prompt_tokens=0, max_new_tokens=0,
                          reserved_bytes=0, created_at=self._clock(), session=True,
                          tenant=tenant)
            self._hold(worker, lease)
            return lease

    def resize(self, lease_id: str, request: AdmissionRequest,
               dry_run: bool = False) -> AdmissionDecision:
        """A session turn's admission on its own lease's worker: reserve-at-most.

        The lease's current bytes count as available to it (they are its own),
        so the turn is ADMITTED, CAPPED or REJECTED exactly as a fresh request
        on that worker would be with those bytes free. REJECTED leaves the
        lease as it was; otherwise it now holds prompt + admitted max_new, with
        this turn's cap (or none), and counts as a stream for time until its worker
        shrinks it. Time decides after bytes as for admit (time_admission.py), on this
        worker only. An unknown lease is REJECTED NO_WORKER.
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
            # Time as for a Generate (time_admission.py), on the session's worker alone: its
            # KV is there, so a turn that worker cannot serve within the goals waits or is
            # refused, never moved.
            # The turn is the newcomer: its own lease is no other stream (whatever its flag).
            others = replace(freed, leases={k: v for k, v in freed.leases.items()
                                            if k != lease_id})
            decision = time_admission.decided(
                decision, request, [others], self._step_models, self.time_goals, self._clock(),
                self.retry_after_s,
                lambda subset: placement.decide_on(freed, request, self.retry_after_s))
            decision = replace(decision, tenant=lease.tenant)
            if dry_run or decision.decision is Decision.REJECTED:
                return replace(decision, dry_run=dry_run)
            grown = replace(lease, prompt_tokens=request.prompt_tokens,
                            max_new_tokens=decision.max_new_tokens,
                            reserved_bytes=decision.reserved_bytes,
                            budget_cap=decision.budget_cap, request_id=request.request_id,
                            turn_running=True, turn_started_at=self._clock(),
                            max_itl_ms=time_admission.goals_of(request, self.time_goals)[0])
            self._hold(worker, grown)
            tenant_holdings.check_room(room, grown.reserved_bytes)
            return replace(decision, lease=grown)

    def shrink(self, lease_id: str, worker_id: str, held_tokens: int, host_bytes: int = 0,
               disk_bytes: int = 0, if_request_id: str = "") -> Lease | None:
        """The lease's worker freed KV: reserve what `held_tokens` need (never more than now).

        Only the lease's worker shrinks it, after freeing: the ledger then never
        offers bytes the worker still holds. The last turn's cap stays on the lease.
        `host_bytes` / `disk_bytes`: where the session's parked K/V is now (swapped out
        to host memory, written to its disk tier), counted apart from reserved bytes.
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
            new_bytes = min(worker.geometry.bytes_for(held_tokens), lease.reserved_bytes)
            # The worker shrinks after a turn's end: the lease decodes nothing from here.
            lease = replace(lease, reserved_bytes=new_bytes, host_bytes=host_bytes,
                            disk_bytes=disk_bytes, turn_running=False)
            self._hold(worker, lease)
            return lease

