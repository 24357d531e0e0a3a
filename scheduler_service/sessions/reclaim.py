"""Reclaiming idle sessions: their bytes for an admission on their worker, and the sweep
that closes sessions idle past the TTL and forgets those whose worker died."""

from __future__ import annotations

import asyncio

import structlog

from ortserve.status.errors import DomainError
from scheduler_service.decision_log import log_expired
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import (
    Admission,
    AdmissionRequest,
    CapLimit,
    Cause,
    Decision,
)
from scheduler_service.sessions.base import SessionBase

log = structlog.get_logger("scheduler")


class SessionReclaim(SessionBase):
    """Idle sessions' bytes given back (swap-out) when an admission needs them."""

    async def _reclaim(self, worker_id: str, exclude: str = "", tenant: str | None = None) -> bool:
        """Swap out the least recently used idle session holding bytes on `worker_id` (only
        `tenant`'s when set: when a tenant's quota binds, others' bytes would not help)."""
        registry = self._registry
        for session in registry.idle_on(worker_id, exclude):
            lease = self._ledger.lease(session.lease_id)
            if lease is None or lease.reserved_bytes == 0:
                continue
            if tenant is not None and lease.tenant != tenant:
                continue
            try:
                registry.begin_turn(session.session_id)
            except DomainError:
                continue  # it just started a turn
            try:
                await self._call_worker(session, "SwapOutSession", "SwapOutSession")
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
        if not self._registry.idle_on_any():
            return  # nothing to reclaim: spare every plain admission the dry run
        for _ in range(8):
            probe = self._ledger.admit(request, dry_run=True)
            if probe.decision is Decision.ADMITTED:
                return
            only = request.tenant if tenant_bound(probe) else None
            workers = [probe.worker.worker_id] if probe.worker and only is None else [
                w.geometry.worker_id for w in placement.serving(self._ledger.snapshot(),
                                                                request.model)]
            if not any([await self._reclaim(w, tenant=only) for w in workers]):
                return

    async def sweep_forever(self) -> None:
        """Close sessions idle past the TTL; forget those whose worker died (nothing held).

        A task of the server's (server.py starts it and cancels it on stop)."""
        while True:
            await asyncio.sleep(max(min(self._config.session_ttl_s / 4, 1.0), 0.05))
            registry = self._registry
            if not len(registry):
                continue  # no session: the ledger's expiry stays the maintenance loop's alone
            log_expired(self._ledger.expire(), self._metrics)
            for session in registry.idle_on_any():
                if self._ledger.lease(session.lease_id) is None:  # its worker died: nothing held
                    registry.mark_lost(session, "stopped heartbeating (its leases expired)")
                    log.warning("session lost with its worker", session_id=session.session_id,
                                worker_id=session.worker_id)
            for session in registry.expired(self._config.session_ttl_s):
                log.info("session expired (idle TTL)", session_id=session.session_id,
                         ttl_s=self._config.session_ttl_s)
                try:
                    registry.begin_turn(session.session_id)
                except DomainError:
                    continue
                await self._close(session)


def tenant_bound(admission: Admission) -> bool:
    """Whether the tenant's quota, not the worker's bytes, held `admission` back."""
    cap, rejection = admission.budget_cap, admission.rejection
    return ((cap is not None and cap.limit is CapLimit.TENANT_QUOTA)
            or (rejection is not None and rejection.cause is Cause.TENANT_QUOTA))
