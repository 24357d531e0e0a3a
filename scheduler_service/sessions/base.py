"""What the session RPCs share: their state (the ledger, the registry, the workers' stubs,
the admission queue) and their calls to a session's worker.

rpcs.py builds on it: SessionRPCs (the RPCs) <- SessionTurnRelay (turn.py) <- SessionReclaim
(reclaim.py) <- SessionBase (here), one class whose rooms are split by idea.
"""

from __future__ import annotations

import grpc
import structlog

from ortserve.rpc.error_path import Relayed
from ortserve.status.errors import DomainError, clip
from ortserve.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from scheduler_service import convert
from scheduler_service.config import SchedulerConfig
from scheduler_service.decision_log import log_expired
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.queue import Ticket
from scheduler_service.relay import QueueWaiter
from scheduler_service.sessions.registry import (
    Session,
    SessionRegistry,
    not_found,
    worker_lost,
)
from scheduler_service.tenant_of import caller_tenant
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")


class SessionBase:
    """The session RPCs' state and their calls to a session's worker."""

    def __init__(self, config: SchedulerConfig, ledger: Ledger, workers: WorkerClients,
                 waiter: QueueWaiter, registry: SessionRegistry | None = None,
                 metrics=None) -> None:
        self._config = config
        self._ledger = ledger
        self._workers = workers
        self._waiter = waiter  # the admission queue a busy turn waits in, as a Generate does
        self._registry = registry if registry is not None else SessionRegistry()  # len() 0 is falsy
        self._metrics = metrics  # SchedulerMetrics when --metrics-port is set
        self._queued: dict[str, Ticket] = {}  # session id -> its turn's ticket while it waits

    def _worker(self, session: Session) -> worker_pb2_grpc.WorkerStub:
        return self._workers.stub(session.address)

    def _owned(self, session_id: str, context) -> None:
        """A session answers only the tenant it is charged to (its lease's, which a
        restored lease keeps); to another tenant it does not exist (SESSION_NOT_FOUND,
        saying nothing of whose it is). Without tenants every caller is ""."""
        session = self._registry.get(session_id)  # SESSION_NOT_FOUND when not open
        lease = self._ledger.lease(session.lease_id)
        if lease is not None and lease.tenant != caller_tenant(self._ledger.tenants, context):
            raise not_found(session_id)

    def _alive(self, session: Session) -> None:
        """The session's lease lives only while its worker does: gone means the worker died."""
        log_expired(self._ledger.expire(), self._metrics)  # expire() hands each lease once
        if self._ledger.lease(session.lease_id) is None:
            raise self._registry.mark_lost(session, "stopped heartbeating (its leases expired)")

    def _info_pb(self, session: Session, worker: types_pb2.SessionInfo | None) -> types_pb2.SessionInfo:
        lease = self._ledger.lease(session.lease_id)
        geometry = self._ledger.geometry(session.worker_id)
        return convert.session_info_to_pb(
            session, worker, reserved_bytes=lease.reserved_bytes if lease else 0,
            model=geometry.model if geometry else "",  # its worker's: the one it is bound to
            idle_s=0.0 if session.turn_in_flight else self._registry.idle_s(session))

    async def _call_worker(self, session: Session, method: str, why: str):
        try:
            return await getattr(self._worker(session), method)(
                worker_pb2.WorkerSessionRequest(session_id=session.session_id,
                                                lease_id=session.lease_id), timeout=10.0)
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
                raise worker_lost(session, f"did not answer {why} ({error.code().name}: "
                                  f"{clip(error.details(), 200)})") from None
            raise Relayed(error, f"worker {session.worker_id}: {clip(error.details(), 600)}") from None


    async def _close(self, session: Session) -> None:
        """The worker frees the KV, then releases the lease (once); then the session is gone."""
        try:
            await self._call_worker(session, "CloseSession", "CloseSession")
        except DomainError as error:
            # Unreachable: the lease goes when the worker's heartbeats stop reporting it.
            log.warning("session close: worker did not answer", session_id=session.session_id,
                        error=error.message)
        finally:
            self._registry.remove(session.session_id)
        log.info("session closed", session_id=session.session_id, lease_id=session.lease_id)
