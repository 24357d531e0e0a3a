"""A session's one lease: where it opens, what a turn may grow it to, what a shrink leaves (pure).

A session holds one lease for its life: opened at 0 bytes, resized per turn
(reserve-at-most on its own worker), shrunk by its worker after each free. The
rules are here, as functions of a worker's state; the ledger applies them
under its one lock and changes reserved bytes only through its `_hold`, as it
does for every lease (ledger.py: open_session_lease, resize, shrink).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from scheduler_service.ledger import placement, time_admission
from scheduler_service.ledger.step_model import StepModel
from scheduler_service.ledger.time_budget import TimeGoals
from scheduler_service.ledger.types import (
    AdmissionDecision,
    AdmissionRequest,
    Lease,
    TenantRoom,
    WorkerGeometry,
)
from scheduler_service.ledger.worker_state import WorkerState


def session_worker(workers: Iterable[WorkerState], model: str, adapter: str,
                   preferred_worker: str) -> WorkerState | None:
    """The worker a new session opens on: of those serving `model` ("": any) and LoRA
    `adapter` ("": the base), `preferred_worker` where it is one of them (a placement hint,
    as an admission's), else the one with the most free bytes; None when none serves."""
    candidates = [w for w in placement.serving(workers, model)
                  if w.geometry.serves_adapter(adapter)]
    if not candidates:
        return None
    return max(candidates, key=lambda w: (
        bool(preferred_worker) and w.geometry.worker_id == preferred_worker,
        w.available_bytes, -len(w.leases), w.geometry.worker_id))


def opened_lease(worker: WorkerState, lease_id: str, request_id: str, tenant: str,
                 now: float) -> Lease:
    """A new session's lease: 0 bytes until its first turn; its worker claims it when it
    opens the session."""
    return Lease(lease_id=lease_id, worker_id=worker.geometry.worker_id, request_id=request_id,
                 prompt_tokens=0, max_new_tokens=0, reserved_bytes=0, created_at=now,
                 session=True, tenant=tenant)


def turn_decision(worker: WorkerState, lease: Lease, request: AdmissionRequest,
                  room: TenantRoom | None, step_models: dict[str, StepModel],
                  time_goals: TimeGoals, now: float, retry_after_s: float) -> AdmissionDecision:
    """A session turn's decision on its own lease's worker: reserve-at-most.

    The lease's current bytes count as available to it (they are its own), so the turn
    is ADMITTED, CAPPED or REJECTED exactly as a fresh request on that worker would be
    with those bytes free, within the tenant's `room` (the session's opener's). Time
    decides after bytes as for admit (time_admission.py), on this worker only.
    """
    if not placement.fits_context(request, worker.geometry):
        return placement.reject_context(request, worker)
    freed = worker.without(lease)
    decision = placement.decide_on(freed, request, retry_after_s)
    if room is not None:  # a session's turns count against the tenant that opened it
        limited = placement.decide_on(freed.within(room.room_bytes), request, retry_after_s)
        decision = placement.within_quota(decision, limited, request, room, retry_after_s)
    # Time as for a Generate (time_admission.py), on the session's worker alone: its
    # KV is there, so a turn that worker cannot serve within the goals waits or is
    # refused, never moved.
    # The turn is the newcomer: its own lease is no other stream (whatever its flag).
    others = replace(freed, leases={k: v for k, v in freed.leases.items()
                                    if k != lease.lease_id})
    decision = time_admission.decided(
        decision, request, [others], step_models, time_goals, now, retry_after_s,
        lambda subset: placement.decide_on(freed, request, retry_after_s))
    return replace(decision, tenant=lease.tenant)


def grown_lease(lease: Lease, request: AdmissionRequest, decision: AdmissionDecision,
                time_goals: TimeGoals, now: float) -> Lease:
    """The lease once its turn is granted: prompt + admitted max_new, with this turn's cap
    (or none); it counts as a stream for time until its worker shrinks it."""
    return replace(lease, prompt_tokens=request.prompt_tokens,
                   max_new_tokens=decision.max_new_tokens,
                   reserved_bytes=decision.reserved_bytes,
                   budget_cap=decision.budget_cap, request_id=request.request_id,
                   turn_running=True, turn_started_at=now,
                   max_itl_ms=time_admission.goals_of(request, time_goals)[0])


def shrunk_lease(lease: Lease, geometry: WorkerGeometry, held_tokens: int, host_bytes: int,
                 disk_bytes: int) -> Lease:
    """The lease once its worker freed KV: what `held_tokens` need, never more than now.
    `host_bytes` / `disk_bytes`: where the session's parked K/V is now (swapped out to host
    memory, written to its disk tier), counted apart from reserved bytes. The last turn's
    cap stays on it."""
    # The worker shrinks after a turn's end: the lease decodes nothing from here.
    return replace(lease, reserved_bytes=min(geometry.bytes_for(held_tokens), lease.reserved_bytes),
                   host_bytes=host_bytes, disk_bytes=disk_bytes, turn_running=False)
