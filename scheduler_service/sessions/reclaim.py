"""Reclaiming idle sessions: their bytes for an admission on their worker, and the sweep
that closes sessions idle past the TTL and forgets those whose worker died."""

from __future__ import annotations

import asyncio

import structlog

from ortserve.status.errors import DomainError
from scheduler_service.decision_log import log_expired
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import (
    AdmissionDecision,
    AdmissionRequest,
    CapLimit,
    Cause,
    Decision,
)
from scheduler_service.sessions.state import SharedSessionState

log = structlog.get_logger("scheduler")


class SessionReclaimer:
    """Idle sessions' bytes given back (swap-out) when an admission needs them."""

    def __init__(self, state: SharedSessionState) -> None:
        self._state = state

    async def reclaim(self, worker_id: str, exclude: str = "", tenant: str | None = None) -> bool:
        """Swap out the least recently used idle session holding bytes on `worker_id` (only
        `tenant`'s when set: when a tenant's quota binds, others' bytes would not help)."""
        state = self._state
        registry = state.registry
        for session in registry.idle_on(worker_id, exclude):
            lease = state.ledger.lease(session.lease_id)
            if lease is None or lease.reserved_bytes == 0:
                continue
            if tenant is not None and lease.tenant != tenant:
                continue
            try:
                registry.begin_turn(session.session_id)
            except DomainError:
                continue  # it just started a turn
            try:
                await state.call_worker(session, "SwapOutSession", "SwapOutSession")
                log.info("idle session swapped out for an admission", session_id=session.session_id,
                         worker_id=worker_id, freed_bytes=lease.reserved_bytes)
                return True
            except DomainError as error:
                log.warning("swap-out failed", session_id=session.session_id, error=error.message)
            finally:
                registry.end_turn(session)
        return False

    async def make_room(self, request: AdmissionRequest) -> None:
        """Before a plain admission: while it would not be ADMITTED whole, swap idle sessions
        out of the worker it would land on (a dry run decides; the real admit is atomic)."""
        state = self._state
        if not state.registry.idle_on_any():
            return  # nothing to reclaim: spare every plain admission the dry run
        for _ in range(8):
            probe = state.ledger.admit(request, dry_run=True)
            if probe.decision is Decision.ADMITTED:
                return
            only = request.tenant if tenant_bound(probe) else None
            workers = [probe.worker.worker_id] if probe.worker and only is None else [
                w.geometry.worker_id for w in placement.serving(state.ledger.snapshot(),
                                                                request.model)]
            if not any([await self.reclaim(w, tenant=only) for w in workers]):
                return

    async def sweep_forever(self) -> None:
        """Close sessions idle past the TTL; forget those whose worker died (nothing held).

        A task of the server's (server.py starts it and cancels it on stop)."""
        state = self._state
        while True:
            await asyncio.sleep(max(min(state.config.session_ttl_s / 4, 1.0), 0.05))
            registry = state.registry
            if not len(registry):
                continue  # no session: the ledger's expiry stays the maintenance loop's alone
            log_expired(state.ledger.expire(), state.metrics)
            for session in registry.idle_on_any():
                if state.ledger.lease(session.lease_id) is None:  # its worker died: nothing held
                    registry.mark_lost(session, "stopped heartbeating (its leases expired)")
                    log.warning("session lost with its worker", session_id=session.session_id,
                                worker_id=session.worker_id)
            for session in registry.expired(state.config.session_ttl_s):
                log.info("session expired (idle TTL)", session_id=session.session_id,
                         ttl_s=state.config.session_ttl_s)
                try:
                    registry.begin_turn(session.session_id)
                except DomainError:
                    continue
                await state.close(session)


def tenant_bound(admission: AdmissionDecision) -> bool:
    """Whether the tenant's quota, not the worker's bytes, held `admission` back."""
    cap, rejection = admission.budget_cap, admission.rejection
    return ((cap is not None and cap.limit is CapLimit.TENANT_QUOTA)
            or (rejection is not None and rejection.cause is Cause.TENANT_QUOTA))
