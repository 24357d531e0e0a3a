"""The Scheduler's session RPCs: protobuf <-> registry, ledger and the session's worker.

SchedulerServicer holds the session parts (built in build.py) and delegates the
session RPCs to SessionRPCs; a turn's stream goes through relay.py like a Generate. The
policy (who swaps out, what is kept) is in registry.py; a turn's steps are in
turn.py (SessionTurnRelay), the reclaiming of idle sessions in reclaim.py
(SessionReclaimer), the state they share in state.py (SharedSessionState).

Every turn goes through an ordinary admission (Ledger.resize: reserve-at-most on
the session's own lease) in the one admission queue, so a turn is ADMITTED,
CAPPED, queued or REJECTED like any Generate, and its BudgetCap is in its
stream, its Finished and GetSession.
"""

from __future__ import annotations

import uuid

import structlog

from ortserve.rules import request_rules
from ortserve.status.errors import DomainError, ErrorReason, quoted
from ortserve.v1 import scheduler_pb2
from scheduler_service.ledger import placement
from scheduler_service.sessions.registry import Session
from scheduler_service.sessions.state import SharedSessionState
from scheduler_service.sessions.turn import SessionTurnRelay
from scheduler_service.tenant_of import caller_tenant

log = structlog.get_logger("scheduler")


class SessionRPCs:
    """OpenSession, SessionTurn, GetSession, SwapOutSession, CloseSession (the servicer
    delegates them here): a turn is the turn relay's, the rest the state's calls."""

    def __init__(self, state: SharedSessionState, turns: SessionTurnRelay) -> None:
        self._state = state
        self._turns = turns
        # What the RPCs read, by the names they use (the state's own objects).
        self._config, self._ledger, self._registry = state.config, state.ledger, state.registry

    async def OpenSession(self, request: scheduler_pb2.OpenSessionRequest, context):
        request_rules.bounded("request_id", request.request_id, request_rules.MAX_LEASE_ID_CHARS)
        request_rules.bounded("preferred_worker_id", request.preferred_worker_id,
                              request_rules.MAX_WORKER_ID_CHARS)
        # The session is bound to its model here: it opens on a worker serving it.
        model = placement.resolve_model(request.model,
                                        {w.geometry.model for w in self._ledger.snapshot()})
        placement.resolve_adapter(request.adapter, model, self._ledger.snapshot())
        lease = self._ledger.open_session_lease(request.request_id or uuid.uuid4().hex[:16], model,
                                                tenant=caller_tenant(self._ledger.tenants, context),
                                                adapter=request.adapter,
                                                preferred_worker=request.preferred_worker_id)
        if lease is None:
            of = f" serving model {quoted(model)}" if model else ""
            raise DomainError(ErrorReason.NO_WORKER, f"no worker{of} is registered to hold a "
                              "session; start a worker and retry",
                              retry_after_s=self._config.retry_after_s, metadata={"model": model})
        geometry = self._ledger.geometry(lease.worker_id)
        session = Session(session_id=uuid.uuid4().hex, worker_id=lease.worker_id,
                          address=geometry.address, lease_id=lease.lease_id)
        try:
            info = await self._state.call_worker(session, "OpenSession", "OpenSession")
        finally:
            if self._ledger.release_unclaimed(lease.lease_id):  # the worker never took it
                log.info("session lease released unclaimed", lease_id=lease.lease_id)
        self._registry.add(session)
        log.info("session opened", session_id=session.session_id, worker_id=session.worker_id,
                 lease_id=session.lease_id, model=geometry.model)
        return self._state.info_pb(session, info)

    def SessionTurn(self, request: scheduler_pb2.SessionTurnRequest, context):
        return self._turns.turn(request, context)

    async def GetSession(self, request: scheduler_pb2.SessionRequest, context):
        self._state.owned(request.session_id, context)
        session = self._registry.get(request.session_id)
        self._state.alive(session)
        info = await self._state.call_worker(session, "GetSession", "GetSession")
        return self._state.info_pb(session, info)

    async def SwapOutSession(self, request: scheduler_pb2.SessionRequest, context):
        self._state.owned(request.session_id, context)
        session = self._registry.begin_turn(request.session_id)  # nothing else runs meanwhile
        try:
            self._state.alive(session)
            info = await self._state.call_worker(session, "SwapOutSession", "SwapOutSession")
        finally:
            self._registry.end_turn(session)
        return self._state.info_pb(session, info)

    async def CloseSession(self, request: scheduler_pb2.SessionRequest, context):
        if self._registry.ended(request.session_id):
            # A retried close (its first reply lost), or one after the TTL or the worker's
            # death: the session holds nothing, which is what the caller asks for.
            return scheduler_pb2.CloseSessionResponse(freed_bytes=0, closed=False)
        self._state.owned(request.session_id, context)
        session = self._registry.begin_turn(request.session_id)  # SESSION_BUSY during a turn
        lease = self._ledger.lease(session.lease_id)
        try:
            await self._state.close(session)
        finally:
            self._registry.end_turn(session)
        return scheduler_pb2.CloseSessionResponse(
            freed_bytes=lease.reserved_bytes if lease else 0, closed=True)
